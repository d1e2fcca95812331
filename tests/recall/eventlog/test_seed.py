"""``debug_seed`` (the conformance cases' way to build a log) names a file
anyone's config may point anywhere: it is read as a regular file, off the
event loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trio

from streamd.conformance.transcript import FrameLines

pytestmark = pytest.mark.subprocess


async def test_a_fifo_as_the_seed_is_refused_and_the_daemon_answers_and_stops(tmp_path):
    os.mkfifo(tmp_path / "seed.jsonl")
    (tmp_path / "work").mkdir()
    init = {"jsonrpc": "2.0", "id": 1, "method": "recall/initialize", "params": {
        "protocol_version_min": 1, "protocol_version_max": 1, "workdir": str(tmp_path / "work"),
        "source_id": "log", "location": str(tmp_path / "events.db"),
        "settings": {"debug_seed": str(tmp_path / "seed.jsonl")}}}
    search = {"jsonrpc": "2.0", "id": 2, "method": "recall/search", "params": {
        "query": "drill", "filters": {}, "limit": 3, "deadline": "2099-01-01T00:00:00Z"}}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "streamd", "--eventlog"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    lines = FrameLines()
    answers: list[dict] = []

    async def answer() -> dict:
        while not answers:
            chunk = await proc.stdout.receive_some(65536)
            assert chunk, "the daemon closed stdout"
            answers.extend(json.loads(f) for f in lines.feed(chunk))
        return answers.pop(0)

    try:
        # Before: the search's round opened the FIFO on the event loop and
        # waited for a writer for good; nothing was answered, SIGTERM neither.
        with trio.fail_after(30):
            await proc.stdin.send_all(json.dumps(init).encode() + b"\n")
            assert "result" in await answer()
            await proc.stdin.send_all(json.dumps(search).encode() + b"\n")
            got = await answer()
            assert got["error"] == {
                "code": -32602,
                "message": "eventlog settings: debug_seed: seed.jsonl is not a regular file",
            }
            proc.terminate()
            assert await proc.wait() == 0
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
