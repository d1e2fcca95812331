"""The kit's Trio layer against tiny adapter scripts, each misbehaving in one way.

What is claimed: every frame counts (one written after stdin closed is in the
observation, and fails the row), a hang is killed and said, the ``${DEADLINE}``
of a line is bound when it is written, and a process that cannot start is a
problem, not a traceback. Every run is bounded by the runner's own limits
(small here) and by ``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from streamd.conformance.cancel import Await, Close, Scenario, Send, matrix, observe, run_scenario
from streamd.conformance.cancel.judging import answers

pytestmark = pytest.mark.subprocess

# Answers initialize with an empty manifest and search 2 with -32007 when its
# cancel arrives; then, once stdin ends, writes a second answer for 2.
LATE_SECOND_ANSWER = r"""
import json, sys
for raw in sys.stdin:
    msg = json.loads(raw)
    if msg.get("id") == 1:
        print(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}), flush=True)
    elif msg.get("method") == "recall/cancel":
        print(json.dumps({"jsonrpc": "2.0", "id": 2,
                          "error": {"code": -32007, "message": "context canceled"}}), flush=True)
print(json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"late": True}}), flush=True)
"""

# Reads everything, answers nothing, and never exits on end of input.
DEAF = r"""
import sys, time
sys.stdin.read()
time.sleep(600)
"""

# Echoes each line's params back as the result of its id.
ECHO = r"""
import json, sys
for raw in sys.stdin:
    msg = json.loads(raw)
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": msg["params"]}), flush=True)
"""

# 80 MiB with no newline, then silence: past the runner's output bound.
FLOOD = r"""
import signal, sys
block = b"x" * (1 << 20)
for _ in range(80):
    sys.stdout.buffer.write(block)
sys.stdout.flush()
signal.pause()
"""


# Answers initialize, then every other request with one frame no JSON-RPC
# message can be, picked by argv[1]: a panic's text, or JSON with neither a
# method nor an id. Exits at end of input.
ANSWERS_GARBAGE = r"""
import json, sys
for raw in sys.stdin:
    msg = json.loads(raw)
    if msg.get("id") is None:
        continue
    if msg["id"] == 1:
        print(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}), flush=True)
    elif sys.argv[1] == "text":
        print("panic: the index is corrupt " + "x" * 300, flush=True)
    else:
        print(json.dumps({"status": "ok", "id_was": msg["id"]}), flush=True)
"""


def _adapter(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "adapter.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def _cancel_inflight() -> Scenario:
    return next(sc for sc in matrix(trials=1) if sc.name == "cancel-inflight")


async def test_a_second_answer_written_after_end_of_input_is_seen_and_fails(tmp_path: Path):
    with trio.fail_after(60):
        obs = await run_scenario(_cancel_inflight(), _adapter(tmp_path, LATE_SECOND_ANSWER))
    assert len(answers(obs, 2)) == 2
    assert obs.exit_code == 0 and obs.problem is None
    judgement = _cancel_inflight().judge(obs)
    assert judgement.verdict == "fail" and "answered 2 times" in judgement.detail


async def test_an_adapter_that_never_answers_nor_exits_is_killed_and_said(tmp_path: Path):
    steps = [Send(b'{"jsonrpc":"2.0","id":1,"method":"recall/health","params":{}}', "health 1"),
             Await(1), Close()]
    with trio.fail_after(60):
        obs = await observe(_adapter(tmp_path, DEAF), steps, timeout=2, exit_grace=1)
    assert obs.problem is not None
    assert "waiting for the answer" in obs.problem and "killed it" in obs.problem
    assert obs.exit_code is None  # a status we caused says nothing about it
    assert _cancel_inflight().judge(obs).verdict == "fail"


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("text", "is not JSON: panic: the index is corrupt " + "x" * 171 + "…"),
        ("stranger", 'is no JSON-RPC message (an object with a method or an id): '
                     '{"status": "ok", "id_was": 2}'),
    ],
    ids=["text", "stranger"],
)
async def test_a_frame_that_can_answer_nothing_stops_the_wait_at_once_naming_it(
    tmp_path: Path, mode: str, why: str
):
    # The wait for answer 2 went on past such a frame until the scenario's
    # timeout (60 s by default); the timeout here is far beyond the bound.
    twice = next(sc for sc in matrix(trials=1) if sc.name == "cancel-twice")
    with trio.fail_after(15):
        obs = await run_scenario(
            twice, [*_adapter(tmp_path, ANSWERS_GARBAGE), mode], timeout=120
        )
    assert obs.problem == f"stopped at response 2, which {why}"
    assert obs.stopped_at == 2
    # The script ends there (health 3 was to follow answer 2); stdin still
    # closes, and the adapter, exiting on it, is not killed.
    assert [s.label for s in obs.sent] == [
        "initialize 1", "search 2", "recall/cancel 2", "recall/cancel 2"
    ]
    assert obs.closed_at is not None and obs.exit_code == 0
    judgement = twice.judge(obs)
    assert judgement.verdict == "fail" and judgement.detail.count(why) == 1


async def test_an_adapter_writing_without_end_is_cut_off_at_the_output_bound(tmp_path: Path):
    steps = [Send(b'{"jsonrpc":"2.0","id":1,"method":"recall/health","params":{}}', "health 1"),
             Await(1), Close()]
    with trio.fail_after(60):
        obs = await observe(_adapter(tmp_path, FLOOD), steps, timeout=30, exit_grace=1)
    # Stopped as the bound passed, not at the timeout with all of it held.
    assert obs.problem == (
        f"the adapter wrote over {64 << 20} bytes to stdout waiting for the answer "
        "to request 1; the rest was not read; killed it"
    )


async def test_a_deadline_is_bound_when_its_line_is_written(tmp_path: Path):
    line = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"deadline":"${DEADLINE}"}}'
    steps = [Send(line, "x 1", deadline_in=30.0), Await(1), Close()]
    before = dt.datetime.now(dt.UTC)
    with trio.fail_after(60):
        obs = await observe(_adapter(tmp_path, ECHO), steps, timeout=30)
    assert obs.problem is None, obs.problem
    deadline = answers(obs, 1)[0].frame["result"]["deadline"]
    at = dt.datetime.strptime(deadline, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    # 30 s after the write, which came after `before`: never before before + 30 s.
    assert at >= before.replace(microsecond=before.microsecond // 1000 * 1000) \
        + dt.timedelta(seconds=30)
    assert json.loads(obs.sent[0].data)["params"]["deadline"] == deadline


async def test_a_command_that_cannot_start_is_a_problem_not_a_traceback(tmp_path: Path):
    with trio.fail_after(10):
        obs = await observe([str(tmp_path / "no-such-adapter")], [Close()])
    assert obs.problem is not None and obs.problem.startswith("cannot start")
    assert _cancel_inflight().judge(obs).verdict == "fail"


# Forks a helper that stays in the adapter's process group, holding the FIFO
# named by argv[1] open (and writing its pid there), then answers and exits
# at end of input, leaving the helper running.
LEAVES_A_HELPER = r"""
import json, os, signal, sys
fifo = os.open(sys.argv[1], os.O_WRONLY)
if os.fork() == 0:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.write(fifo, f"{os.getpid()}\n".encode())
    while True:
        signal.pause()
os.close(fifo)
for raw in sys.stdin:
    msg = json.loads(raw)
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}), flush=True)
"""


async def test_nothing_the_adapter_left_in_its_process_group_outlives_the_run(tmp_path: Path):
    fifo = tmp_path / "helper"
    os.mkfifo(fifo)
    # Opened first, without waiting for a writer: it reaches end of file once
    # every process holding the write end (the helper, last) has gone.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    steps = [Send(b'{"jsonrpc":"2.0","id":1,"method":"recall/health","params":{}}', "health 1"),
             Await(1), Close()]
    said, gone = b"", False
    try:
        with trio.fail_after(60):
            obs = await observe([*_adapter(tmp_path, LEAVES_A_HELPER), str(fifo)], steps,
                                timeout=30)
            assert obs.problem is None and obs.exit_code == 0, obs
            while not gone:
                await trio.lowlevel.wait_readable(reader)
                chunk = os.read(reader, 64)
                said += chunk
                gone = not chunk  # end of file: the helper is gone
    finally:
        if not gone and said.strip():  # the run left it: it must not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(said), signal.SIGKILL)
        os.close(reader)
    assert said.strip().isdigit()
