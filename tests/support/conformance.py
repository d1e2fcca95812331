"""Conformance cases built in a test, and the reference suite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from streamd import conformance as c

REPO = Path(__file__).resolve().parents[2]


REFERENCE_SUITE = REPO.parent / "shared" / "recall-conformance" / "stream"


# One script, several behaviours, picked by argument. The harness adds no
# arguments of its own, so the mode is part of the adapter command line.
ADAPTER = r"""
import json, os, signal, sys, time

mode = sys.argv[1] if len(sys.argv) > 1 else "answer"

def write(frame):
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()

def write_pid():
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))

if mode in ("hang", "linger"):
    write_pid()  # first thing, so the test can check the kill however fast it comes
if mode == "crash":
    sys.stderr.write("starting\nboom: cannot open the index\n")
    sys.stderr.flush()
    sys.exit(3)
if mode == "hang":
    signal.pause()
if mode == "flood":
    # 80 MiB with no newline, then silence: past the replayer's output bound.
    block = b"x" * (1 << 20)
    for _ in range(80):
        sys.stdout.buffer.write(block)
    sys.stdout.flush()
    signal.pause()

held = None
for raw in sys.stdin:
    msg = json.loads(raw)
    method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if method == "test/hold":
        held = rid  # answered only once test/release arrives
        continue
    if method == "test/release":
        write({"jsonrpc": "2.0", "id": held, "error": {"code": -32007, "message": "released"}})
        continue
    if rid is None:
        continue
    if mode == "chatty":
        write({"jsonrpc": "2.0", "method": "test/log", "params": {"about": rid}})
    result = {"method": method, "echo": params.get("echo"), "at": time.time()}
    if "workdir" in params:
        result["workdir_empty"] = os.listdir(params["workdir"]) == []
        result["fixture"] = sorted(os.listdir(params["location"]))
    if mode == "wrong" and rid == 2:
        result["echo"] = "not what was asked"
    if mode in ("text", "stranger") and rid == 2:
        # Answered with a frame no JSON-RPC message can be: a panic's text,
        # or JSON that is neither a request, a notification nor a response.
        sys.stdout.write(
            "panic: the index is corrupt " + "x" * 300 + "\n"
            if mode == "text"
            else json.dumps({"status": "ok", "echo": params.get("echo")}) + "\n"
        )
        sys.stdout.flush()
        continue
    if mode == "deep" and rid == 2:
        # Nested far past any decoder's recursion: the judge must not crash on it.
        sys.stdout.write('{"jsonrpc":"2.0","id":2,"result":' + "[" * 100000 + "]" * 100000 + "}\n")
        sys.stdout.flush()
        continue
    write({"jsonrpc": "2.0", "id": rid, "result": result})

if mode == "extra":
    write({"jsonrpc": "2.0", "method": "test/late", "params": {}})
if mode == "exit1":
    sys.exit(1)
if mode == "linger":
    signal.pause()
"""


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "test/initialize",
    "params": {"workdir": "${WORKDIR}", "location": "${FIXTURE}"},
}


NOTE = {"jsonrpc": "2.0", "method": "test/note", "params": {}}


ECHO = {"jsonrpc": "2.0", "id": 2, "method": "test/echo", "params": {"echo": "two"}}


WANT = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "method": "test/initialize",
            "echo": None,
            "at": c.VOLATILE,
            "workdir_empty": True,
            "fixture": ["data.jsonl"],
        },
    },
    {"jsonrpc": "2.0", "id": 2, "result": {"method": "test/echo", "echo": "two", "at": c.VOLATILE}},
]


def write_jsonl(path: Path, items) -> None:
    path.write_text("".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items))


def make_case(
    suite: Path,
    name: str = "echo",
    *,
    requests=(INIT, NOTE, ECHO),
    recorded=WANT,
    **manifest,
) -> Path:
    directory = suite / name
    (directory / "fixture").mkdir(parents=True)
    (directory / "fixture" / "data.jsonl").write_text("{}\n")
    body = {
        "case": name,
        "description": "Why this answer is right.",
        "flow": "lockstep",
        "placeholders": {"FIXTURE": "fixture dir", "WORKDIR": "fresh dir"},
        "volatile": ["/result/at"],
        "responses": len(recorded) if recorded is not None else 2,
    }
    body.update(manifest)
    (directory / "manifest.json").write_text(json.dumps(body))
    write_jsonl(directory / "request.jsonl", requests)
    if recorded is not None:
        write_jsonl(directory / "response.jsonl", recorded)
    return directory


@pytest.fixture
def adapter(tmp_path):
    script = tmp_path / "adapter.py"
    script.write_text(ADAPTER)

    def command(*args: str) -> list[str]:
        return [sys.executable, str(script), *args]

    return command

