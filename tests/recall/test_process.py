"""The real process: ``python -m streamd`` on pipes, and both conformance suites.

These are the only Recall tests that spawn processes; each is bounded by
``trio.fail_after`` and none sleeps. Stderr goes to a file so a chatty
process can never block on a full pipe, and is shown when a test fails.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from support.recall_proc import Proc, req, spawn

from streamd import conformance

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
REFERENCE_SUITE = REPO.parent / "shared" / "recall-conformance" / "stream"
FAR = "2999-01-01T00:00:00Z"


@pytest.fixture
def world(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("sig-1", "2026-05-02T10:00:00Z", title="Deploy td-1", ref="td-1"))
    return w


def init(world, **settings: Any) -> dict[str, Any]:
    return req(1, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
               workdir=str(world.work), source_id="signals", location=str(world.data),
               settings={"files": ["a.jsonl"], **settings})


async def handshake(proc: Proc, world, **settings: Any) -> None:
    await proc.send(init(world, **settings))
    frame = await proc.recv()
    assert frame is not None and "result" in frame, (frame, proc.log())


def search(id: Any, query: str) -> dict[str, Any]:
    return req(id, "recall/search", query=query, filters={}, limit=10, deadline=FAR)


# --- lifecycle --------------------------------------------------------------------------


async def test_shutdown_exits_zero_and_writes_nothing_after_the_ack(world, tmp_path):
    with trio.fail_after(30):
        async with spawn(tmp_path) as proc:
            await handshake(proc, world, debug_stall_ms=300)
            # A request after shutdown in the same write is never read.
            await proc.send(search(2, "td-1"), req(9, "recall/shutdown"), search(10, "td-1"))
            frames = await proc.drain()
            # stdin is still open: the process leaves on its own.
            assert await proc.process.wait() == 0, proc.log()
    assert [f["id"] for f in frames] == [2, 9]
    assert frames[0]["result"]["candidates"][0]["source_record_id"] == "sig-1"
    ack = b'{"jsonrpc":"2.0","id":9,"result":{}}\n'
    assert json.loads(ack) == frames[1]
    assert bytes(proc.raw_out).endswith(ack.rstrip(b"\n") + b"\n")
    assert bytes(proc.raw_out).count(b"\n") == 3


async def test_end_of_input_exits_zero(world, tmp_path):
    with trio.fail_after(30):
        async with spawn(tmp_path) as proc:
            await handshake(proc, world)
            await proc.close_stdin()
            assert await proc.drain() == []
            assert await proc.process.wait() == 0, proc.log()


async def test_end_of_input_answers_in_flight_requests_canceled_then_exits_zero(world, tmp_path):
    with trio.fail_after(30):
        async with spawn(tmp_path) as proc:
            await handshake(proc, world, debug_stall_ms=600_000)
            await proc.send(search(2, "td-1"))
            await proc.close_stdin()
            frames = await proc.drain()
            assert await proc.process.wait() == 0, proc.log()
    assert frames == [
        {"jsonrpc": "2.0", "id": 2, "error": {"code": -32007, "message": "context canceled"}}
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_termination_signal_exits_zero_even_with_work_in_flight(world, tmp_path, signum):
    with trio.fail_after(30):
        async with spawn(tmp_path) as proc:
            await handshake(proc, world, debug_stall_ms=600_000)
            await proc.send(search(2, "td-1"))
            # The health answer proves the search task exists before the signal.
            await proc.send(req(3, "recall/health", deadline=FAR))
            assert (await proc.recv())["id"] == 3
            proc.process.send_signal(signum)
            assert await proc.process.wait() == 0, proc.log()


async def test_a_malformed_frame_does_not_take_the_process_down(world, tmp_path):
    with trio.fail_after(30):
        async with spawn(tmp_path) as proc:
            await proc.process.stdin.send_all(b"{oops\n\xff\n[]\n")
            errors = [await proc.recv() for _ in range(3)]
            assert [(e["id"], e["error"]["code"]) for e in errors] == [
                (None, -32700), (None, -32700), (None, -32600),
            ]
            await handshake(proc, world)
            await proc.close_stdin()
            await proc.drain()
            assert await proc.process.wait() == 0, proc.log()


STRAY = r"""
import os, sys
from streamd.recall import service as recall_service

answer = recall_service.RecallService.health

async def noisy_health(self, p, req):
    print("stray print on stdout")
    sys.stdout.flush()
    os.write(1, b"stray write to fd 1\n")
    return await answer(self, p, req)

recall_service.RecallService.health = noisy_health
from streamd.cli import main
sys.exit(main([]))
"""


async def test_a_stray_write_to_fd_1_cannot_corrupt_the_frame_stream(world, tmp_path):
    with trio.fail_after(30):
        async with spawn(tmp_path, [sys.executable, "-c", STRAY]) as proc:
            await handshake(proc, world)
            await proc.send(req(2, "recall/health", deadline=FAR), req(3, "recall/shutdown"))
            frames = await proc.drain()
            assert await proc.process.wait() == 0, proc.log()
    assert [f["id"] for f in frames] == [2, 3]
    assert frames[0]["result"]["status"] == "healthy"
    log = proc.log()
    assert "stray print on stdout" in log
    assert "stray write to fd 1" in log


# --- conformance suites, replayed against this process -----------------------------------------


def test_the_reference_suite_passes_with_exactly_nine_cases(capsys):
    if not REFERENCE_SUITE.is_dir():
        pytest.skip(f"{REFERENCE_SUITE} is absent")
    assert len(conformance.discover_cases(REFERENCE_SUITE)) == 9
    assert conformance.main(["verify", str(REFERENCE_SUITE)]) == 0, capsys.readouterr().out
    assert "9 passed, 0 failed" in capsys.readouterr().out
