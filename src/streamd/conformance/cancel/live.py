"""The Trio layer of the cancellation kit: run a script against a real adapter.

It only moves bytes, owns the process, and stamps times; what to send is the
scenario's (:mod:`~streamd.conformance.cancel.matrix`) and what the frames mean
is the judge's. Its rules, and why:

- Every scenario gets a fresh process and a fresh directory holding the
  fixture and an empty workdir, so no scenario sees another's index, cursor
  or in-flight work.
- Every frame counts: after the script, stdin is closed (if it was not) and
  stdout read to its end, so an answer written late (a second answer, a
  result after a cancel) is in the observation however late it came.
- Times are taken from Trio's clock at each write and at each frame's arrival,
  relative to the process start. They are reported, never judged.
- A wait for an answer stops at a frame no JSON-RPC message can be (not JSON,
  or JSON with neither a method nor an id) that came before the answer, and
  the problem names it: it answers nothing, so the wait could only end at the
  run's deadline. Stdin is then closed and stdout read to its end as usual.
- Nothing hangs: the whole run has a deadline, the exit a grace after stdin
  closes; a process still alive after either is killed with its process group
  and the observation says so. Nothing outlives a run: the adapter's process
  group is killed at its end however it ended, so what the adapter left
  running there goes too.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from streamd.conformance.cancel.judging import answers, stops_wait
from streamd.conformance.cancel.scenario import FIXTURE_FILES, Scenario
from streamd.conformance.cancel.script import (
    Await,
    Close,
    Observation,
    Pause,
    Place,
    Received,
    Send,
    Sent,
    Step,
    rfc3339,
)
from streamd.conformance.driver import (
    OUTPUT_LIMIT,
    STDERR_SETTLE,
    STDERR_TAIL_BYTES,
    OutputBound,
    Tail,
    describe_exit,
    kill_group,
    pump_stderr,
    reap,
    spawn,
)
from streamd.conformance.transcript import FrameLines

#: A whole scenario's limit. The longest (the race, at the CLI's default
#: trials) takes a few seconds; the rest under two.
DEFAULT_TIMEOUT = 60.0
#: How long the adapter may take to exit after stdin closes.
EXIT_GRACE = 10.0


async def run_scenario(
    scenario: Scenario,
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    exit_grace: float = EXIT_GRACE,
) -> Observation:
    """One scenario against a fresh process, in a fresh directory."""
    with tempfile.TemporaryDirectory(
        prefix=f"streamd-cancel-{scenario.name}-", ignore_cleanup_errors=True
    ) as root:
        place = make_place(Path(root))
        return await observe(
            command, scenario.script(place), env=env, timeout=timeout, exit_grace=exit_grace
        )


def make_place(root: Path) -> Place:
    fixture, workdir = root / "fixture", root / "work"
    fixture.mkdir()
    workdir.mkdir()
    for name, data in FIXTURE_FILES.items():
        (fixture / name).write_bytes(data)
    return Place(str(fixture), str(workdir))


@dataclass(frozen=True)
class _Stopped:
    """The script ended waiting for an answer, at a frame that can answer nothing."""

    at: int  # its number among the frames received, from 1
    why: str  # the reason and the frame, clipped


class _Watch:
    """The frames so far, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.changed = trio.Event()
        self.eof = False
        self.exited_at: float | None = None
        self.reaped = False  # by _note_exit: its pid may name another group now

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def observe(
    command: Sequence[str],
    steps: Sequence[Step],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    exit_grace: float = EXIT_GRACE,
) -> Observation:
    """Start ``command``, follow ``steps``, and collect every frame, timed."""
    try:
        proc = await spawn(command, env)
    except OSError as exc:
        return Observation((), (), None, None, None, f"cannot start {shlex.join(command)}: {exc}")
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    started = trio.current_time()
    watch = _Watch()
    sent: list[Sent] = []
    closed_at: list[float] = []
    tail = Tail(STDERR_TAIL_BYTES)
    problem: str | None = None
    stopped_at: int | None = None
    killed = False
    reaped = False
    # The run's scope: its deadline, and the pump's way to stop it.
    overall = trio.CancelScope(deadline=started + timeout)
    output = OutputBound(OUTPUT_LIMIT, overall)
    try:
        async with trio.open_nursery() as nursery:
            stderr_done = trio.Event()
            nursery.start_soon(_pump_frames, proc.stdout, watch, started, output)
            nursery.start_soon(pump_stderr, proc.stderr, tail, stderr_done)
            nursery.start_soon(_note_exit, proc, watch, started)
            doing = ["starting the adapter"]
            with overall:
                ended = await _follow(proc, steps, watch, sent, closed_at, started, doing)
                if isinstance(ended, _Stopped):
                    stopped_at = ended.at
                    problem = f"stopped at response {ended.at}, which {ended.why}"
                else:
                    problem = ended
                if not closed_at:
                    await _close(proc, closed_at, started)
                doing[0] = "waiting for the adapter to exit after stdin closed"
                with trio.move_on_after(exit_grace) as grace:
                    while not (watch.eof and watch.exited_at is not None):
                        await watch.changed.wait()
                if grace.cancelled_caught and problem is None:
                    problem = f"the adapter had not exited {exit_grace:g} s after stdin closed"
            if overall.cancelled_caught:
                problem = f"timed out after {timeout:g} s {doing[0]}"
                if output.exceeded:
                    problem = output.problem(doing[0])
            # The group is killed whether or not the adapter has exited: what
            # it left running there (a helper, a grandchild) must not outlive
            # the scenario. Only before the adapter is reaped (``returncode``
            # reaps it, so it is not read here) is its pid sure to name that
            # group and no other.
            killed = watch.exited_at is None
            if killed or not watch.reaped:
                kill_group(proc)
            if killed:
                problem = f"{problem}; killed it"
            await proc.wait()
            reaped = True
            with trio.move_on_after(STDERR_SETTLE):
                await stderr_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        if not (reaped or watch.reaped):  # cancelled, or failed: the group goes all the same
            kill_group(proc)
        await reap(proc)
    # A status we caused by killing it says nothing about the adapter.
    code = None if killed else proc.returncode
    if problem and code:
        problem = f"{problem}; it {describe_exit(code)}"
    return Observation(
        sent=tuple(sent),
        received=tuple(watch.received),
        exit_code=code,
        exited_at=watch.exited_at,
        closed_at=closed_at[0] if closed_at else None,
        problem=problem,
        stderr=bytes(tail.data),
        stopped_at=stopped_at,
    )


async def _follow(
    proc: trio.Process,
    steps: Sequence[Step],
    watch: _Watch,
    sent: list[Sent],
    closed_at: list[float],
    started: float,
    doing: list[str],
) -> str | _Stopped | None:
    assert proc.stdin is not None
    for step in steps:
        if isinstance(step, Send):
            doing[0] = f"writing {step.label}"
            data = step.data
            if step.deadline_in is not None:
                wall = time.time_ns() + int(step.deadline_in * 1e9)
                data = data.replace(b"${DEADLINE}", rfc3339(wall).encode())
            # Stamped as the write begins: a frame stamped earlier was read
            # before this line existed, so it cannot be the line's effect (the
            # order the malformed-cancel and LSP rows judge by).
            at = trio.current_time() - started
            try:
                await proc.stdin.send_all(data + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return f"the adapter stopped reading stdin before {step.label}"
            sent.append(Sent(at, step.label, data))
        elif isinstance(step, Await):
            label = f"request {step.id!r}"
            doing[0] = f"waiting for the answer to {label}"
            while True:
                # The Observation's own reading of "an answer", so the wait
                # and the judgement can never disagree on what arrived.
                seen = tuple(watch.received)
                stop = stops_wait(seen, step.id)
                if stop is not None:
                    return _Stopped(*stop)
                if answers(Observation((), seen, None, None, None), step.id):
                    break
                if watch.eof:
                    return f"the adapter closed stdout with {label} unanswered"
                await watch.changed.wait()
        elif isinstance(step, Pause):
            await trio.sleep(step.seconds)
        elif isinstance(step, Close):
            await _close(proc, closed_at, started)
    return None


async def _close(proc: trio.Process, closed_at: list[float], started: float) -> None:
    assert proc.stdin is not None
    if not closed_at:
        await proc.stdin.aclose()
        closed_at.append(trio.current_time() - started)


async def _pump_frames(
    stream: trio.abc.ReceiveStream, watch: _Watch, started: float, output: OutputBound
) -> None:
    splitter = FrameLines()
    while chunk := await stream.receive_some(65536):
        if not output.take(len(chunk)):
            return  # the run is cancelled; what was read stands
        now = trio.current_time() - started
        for frame in splitter.feed(chunk):
            watch.received.append(Received.of(now, frame))
        watch.poke()
    now = trio.current_time() - started
    for frame in splitter.close():
        watch.received.append(Received.of(now, frame))
    watch.eof = True
    watch.poke()


async def _note_exit(proc: trio.Process, watch: _Watch, started: float) -> None:
    # Exited, not reaped: observe() kills the process group once the run is
    # over, and until the reap the adapter's pid names that group only. A
    # pidfd is readable at the exit and reaps nothing; without one (not
    # Linux, or before 5.3) the wait reaps, and the group is then left be.
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        await proc.wait()
        watch.reaped = True
    else:
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
    watch.exited_at = trio.current_time() - started
    watch.poke()
