"""The Trio driver: start the adapter, play a lockstep plan, collect every frame.

It only moves bytes and owns the process and its tasks; what to send, when to
wait and how to compare all come from :mod:`streamd.conformance.transcript`.
The rules this module holds, and why:

- The recorder is the replayer. ``record`` drives the adapter exactly as
  ``verify`` does and only differs in what it does with the frames, so a
  transcript is an observation of the process, never a claim written by hand.
- A run is a fresh process with a fresh empty WORKDIR. Reusing either would let
  a second replay observe a warm index and pass for the wrong reason.
- Every frame counts. After the last awaited response stdin is closed and stdout
  drained to EOF; a frame written after shutdown makes the count wrong, and the
  count is what stops a case that silently stops answering from passing short.
- Nothing here may hang: every case runs under an overall deadline, and an
  adapter still alive after that, or a few seconds after stdin closes, is
  killed (with its whole process group) and the case fails saying so.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import trio

from streamd import blas
from streamd.conformance.case import (
    Case,
    adapter_command,
    compare_transcript,
    load_case,
    placements,
    prepare_requests,
)
from streamd.conformance.transcript import (
    AwaitFrames,
    BadFrame,
    CaseError,
    FrameLines,
    Line,
    Place,
    Send,
    Step,
    answers,
    lockstep_steps,
    mask,
    message,
    render,
)

DEFAULT_TIMEOUT = 30.0
#: How long a process may take to exit once stdin is closed. Generous for a
#: clean shutdown, short enough that a stuck one does not stall the suite.
EXIT_GRACE = 5.0
#: How long to wait, after the process has exited, for stderr to reach EOF. A
#: grandchild holding the pipe open must not keep the report waiting.
STDERR_SETTLE = 1.0
STDERR_TAIL_BYTES = 64 * 1024
#: The most of an adapter's stdout one run keeps. A transcript is kilobytes;
#: an adapter writing without end (a stuck loop, a line that never ends) must
#: not take the replayer's memory with it.
OUTPUT_LIMIT = 64 << 20


# --------------------------------------------------------------------------
# Trio driver
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    frames: list[bytes]  # everything the adapter wrote, in arrival order
    problem: str | None  # why the run itself failed (hang, crash, no exit, ...)
    stderr: bytes  # the tail of what it wrote to stderr
    returncode: int | None
    stopped_at: int | None = None
    """The response the replay stopped at because it can be no JSON-RPC
    message (``problem`` names it); the frames before it are still judged."""


@dataclass(frozen=True)
class _Stopped:
    """The conversation ended at a frame that can answer nothing."""

    at: int  # its number among the responses
    why: str  # the reason and the frame, clipped


class Tail:
    """The last ``limit`` bytes of a stream: enough to explain a failure,
    bounded so a chatty adapter cannot exhaust memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()

    def add(self, chunk: bytes | bytearray) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            del self.data[: len(self.data) - self.limit]


@dataclass
class OutputBound:
    """How much of the adapter's stdout a run took, against its limit; past it
    the pump stops reading and cancels ``run``, the scope the run is played in."""

    limit: int
    run: trio.CancelScope
    taken: int = 0
    exceeded: bool = False

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes; False (and the run cancelled) past the limit."""
        self.taken += size
        if self.taken > self.limit:
            self.exceeded = True
            self.run.cancel()
        return not self.exceeded

    def problem(self, doing: str) -> str:
        return f"the adapter wrote over {self.limit} bytes to stdout {doing}; the rest was not read"


async def run_transcript(
    command: Sequence[str],
    lines: Sequence[Line],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    exit_grace: float = EXIT_GRACE,
    await_frames: Mapping[int, int] | None = None,
    place_files: Mapping[int, Sequence[tuple[str, str]]] | None = None,
    output_limit: int = OUTPUT_LIMIT,
) -> Run:
    """Start ``command``, play ``lines`` in lockstep, and collect every frame."""
    frames: list[bytes] = []
    tail = Tail(STDERR_TAIL_BYTES)
    try:
        proc = await spawn(command)
    except OSError as exc:
        return Run([], f"cannot start the adapter {shlex.join(command)}: {exc}", b"", None)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    problem: str | None = None
    stopped_at: int | None = None
    # The conversation's scope: its deadline, and the pump's way to stop it.
    overall = trio.CancelScope(deadline=trio.current_time() + timeout)
    try:
        async with trio.open_nursery() as nursery:
            frame_tx, frame_rx = trio.open_memory_channel[bytes](math.inf)
            stderr_done = trio.Event()
            output = OutputBound(output_limit, overall)
            nursery.start_soon(_pump_frames, proc.stdout, frame_tx, output)
            nursery.start_soon(pump_stderr, proc.stderr, tail, stderr_done)

            doing = ["starting the adapter"]
            with overall:
                plan = lockstep_steps(lines, await_frames, place_files)
                ended = await _converse(proc, frame_rx, plan, frames, doing, exit_grace)
                if isinstance(ended, _Stopped):
                    stopped_at = ended.at
                    problem = f"stopped at response {ended.at}, which {ended.why}"
                else:
                    problem = ended
            if overall.cancelled_caught:
                problem = f"timed out after {timeout:g} s {doing[0]}"
                if output.exceeded:
                    problem = output.problem(doing[0])
            if proc.returncode is None:
                kill_group(proc)
                problem = f"{problem}; killed it"
            await proc.wait()
            with trio.move_on_after(STDERR_SETTLE):
                await stderr_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        await reap(proc)
    return Run(frames, problem, bytes(tail.data), proc.returncode, stopped_at)


async def _converse(
    proc: trio.Process,
    frame_rx: trio.MemoryReceiveChannel[bytes],
    plan: Sequence[Step],
    frames: list[bytes],
    doing: list[str],
    exit_grace: float,
) -> str | _Stopped | None:
    """Run the lockstep plan, then close stdin and drain. ``doing[0]`` always
    says what we are waiting for, so a timeout can say where it hung."""
    assert proc.stdin is not None
    for step in plan:
        line = step.line
        if isinstance(step, AwaitFrames):
            doing[0] = f"waiting for {step.frames} frames before line {line.number}"
            while len(frames) < step.frames:
                try:
                    frames.append(await frame_rx.receive())
                except trio.EndOfChannel:
                    return await _ended_early(
                        proc,
                        f"the adapter closed stdout after {len(frames)} frames; line "
                        f"{line.number} waits for {step.frames}",
                        exit_grace,
                    )
            continue
        if isinstance(step, Place):
            doing[0] = f"placing files before line {line.number}"
            for source, target in step.files:
                await trio.to_thread.run_sync(_place, source, target)
            continue
        if isinstance(step, Send):
            doing[0] = f"sending line {line.number}"
            try:
                await proc.stdin.send_all(line.data + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return await _ended_early(
                    proc,
                    f"the adapter stopped reading stdin before line {line.number}",
                    exit_grace,
                )
            continue
        request = f"request id {render(line.id)} (line {line.number})"
        doing[0] = f"waiting for the response to {request}"
        while True:
            try:
                frame = await frame_rx.receive()
            except trio.EndOfChannel:
                return await _ended_early(
                    proc, f"the adapter closed stdout with {request} unanswered", exit_grace
                )
            frames.append(frame)
            try:
                if answers(frame, line.id):
                    break
            except BadFrame as exc:
                # It answers nothing, and nothing says the answer will still
                # come: waiting on ended only at the case's timeout.
                return _Stopped(len(frames), exc.about(frame))

    doing[0] = "draining stdout after closing stdin"
    await proc.stdin.aclose()
    with trio.move_on_after(exit_grace) as grace:
        async for frame in frame_rx:
            frames.append(frame)
        await proc.wait()
    if grace.cancelled_caught:
        if proc.returncode is None:
            return f"the adapter had not exited {exit_grace:g} s after stdin closed"
        return (
            f"the adapter exited but its stdout was still open {exit_grace:g} s "
            "after stdin closed (a child process holds it?)"
        )
    code = proc.returncode
    assert code is not None  # waited for above, within the grace
    if code != 0:
        return f"the adapter {describe_exit(code)} after stdin closed"
    return None


async def _ended_early(proc: trio.Process, what: str, exit_grace: float) -> str:
    """Name how the process ended, if it does within the grace; the caller
    kills it otherwise."""
    with trio.move_on_after(exit_grace):
        await proc.wait()
    if proc.returncode is None:
        return what
    return f"{what}; it {describe_exit(proc.returncode)}"


def describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


def _place(source: str, target: str) -> None:
    # Copied beside the target and renamed: the adapter may be scanning, and a
    # half-copied stream file would be a different (truncated-write) case.
    scratch = f"{target}.{os.getpid()}.placing"
    with open(source, "rb") as src, open(scratch, "wb") as dst:
        dst.write(src.read())
    os.replace(scratch, target)


async def spawn(command: Sequence[str], env: Mapping[str, str] | None = None) -> trio.Process:
    """The adapter, its three streams piped, in a session of its own, so a
    kill reaches whatever it spawned and no grandchild keeps our pipes (or
    the suite) waiting. OSError when it cannot be started."""
    return await trio.lowlevel.open_process(
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # Never this process's own tuning (``blas``): the caller's environment.
        env=blas.foreign_env() if env is None else dict(env),
    )


async def reap(proc: trio.Process) -> None:
    """However a run ended: the adapter's process group killed if it still
    runs, its status collected and its pipes closed, even under cancellation."""
    with trio.CancelScope(shield=True):
        if proc.returncode is None:
            kill_group(proc)
        await proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()


def kill_group(proc: trio.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()


async def _pump_frames(
    stream: trio.abc.ReceiveStream, frame_tx: trio.MemorySendChannel[bytes], output: OutputBound
) -> None:
    # Unbounded channel: the adapter's output is what we are judging, and
    # back-pressure here could deadlock it against our stdin writes. What
    # bounds it (and the line being split) is the output's limit.
    splitter = FrameLines()
    async with frame_tx:
        while chunk := await stream.receive_some(65536):
            if not output.take(len(chunk)):
                return
            for frame in splitter.feed(chunk):
                frame_tx.send_nowait(frame)
        for frame in splitter.close():
            frame_tx.send_nowait(frame)


async def pump_stderr(stream: trio.abc.ReceiveStream, tail: Tail, done: trio.Event) -> None:
    # Always drained: an adapter blocked on a full stderr pipe would look hung.
    while chunk := await stream.receive_some(65536):
        tail.add(chunk)
    done.set()


# --------------------------------------------------------------------------
# Verify and record
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseResult:
    name: str
    ok: bool
    detail: str = ""  # why it failed, or what was recorded
    stderr: bytes | None = None  # None when no adapter ran


async def verify_case(
    directory: Path,
    command: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    exit_grace: float = EXIT_GRACE,
) -> CaseResult:
    name = Path(directory).name
    try:
        case = load_case(directory, with_recording=True)
    except CaseError as exc:
        return CaseResult(name, False, f"invalid case: {exc}")
    assert case.recorded is not None
    try:
        run = await _run_case(case, command, timeout, exit_grace)
    except CaseError as exc:
        return CaseResult(name, False, f"invalid case: {exc}")
    pointers = case.manifest.pointers
    if run.problem:
        detail = run.problem
        # Frames that arrived before a hang or crash may already explain it;
        # the ones that never arrived, or the one it stopped at, are what the
        # problem already says.
        judged = run.frames if run.stopped_at is None else run.frames[: run.stopped_at - 1]
        early = compare_transcript(case.recorded[: len(judged)], judged, pointers)
        if early:
            detail += f"; before that, {early}"
        return CaseResult(name, False, detail, run.stderr)
    difference = compare_transcript(case.recorded, run.frames, pointers)
    if difference:
        return CaseResult(name, False, difference, run.stderr)
    return CaseResult(name, True)


async def record_case(
    directory: Path,
    command: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    exit_grace: float = EXIT_GRACE,
) -> CaseResult:
    """Run a case and write its response.jsonl, volatile values masked.

    Refuses (and leaves the old file alone) when the manifest is invalid, the
    run failed, or the frame count differs from ``responses``: the manifest is
    the human statement of what should happen, so a recording never edits it.
    """
    name = Path(directory).name
    try:
        case = load_case(directory, with_recording=False)
        run = await _run_case(case, command, timeout, exit_grace)
    except CaseError as exc:
        return CaseResult(name, False, f"invalid case: {exc}")
    unchanged = "response.jsonl left unchanged"
    if run.problem:
        return CaseResult(name, False, f"{run.problem}; {unchanged}", run.stderr)
    if len(run.frames) != case.manifest.responses:
        return CaseResult(
            name,
            False,
            f"the manifest declares {case.manifest.responses} responses, the run "
            f"produced {len(run.frames)}; {unchanged}",
            run.stderr,
        )
    body = bytearray()
    for n, raw in enumerate(run.frames, start=1):
        try:
            # As the comparison reads it: a recording verify would fail is none.
            frame = message(raw)
        except BadFrame as exc:
            why = f"response {n} {exc.about(raw)}; {unchanged}"
            return CaseResult(name, False, why, run.stderr)
        body += msgspec.json.encode(mask(frame, case.manifest.pointers)) + b"\n"
    target = case.directory / "response.jsonl"
    # Written beside the target and renamed, so an interrupted recording never
    # leaves a half transcript that would then be replayed as the truth.
    scratch = target.with_name(f".response.jsonl.{os.getpid()}.tmp")
    try:
        scratch.write_bytes(body)
        os.replace(scratch, target)
    except OSError as exc:
        # A case directory is anyone's (read-only, a directory at the name):
        # the case fails saying so, and the scratch file goes.
        scratch.unlink(missing_ok=True)
        why = exc.strerror or str(exc)
        return CaseResult(name, False, f"cannot write response.jsonl: {why}; {unchanged}")
    return CaseResult(name, True, f"{len(run.frames)} responses")


async def _run_case(case: Case, command: Sequence[str], timeout: float, exit_grace: float) -> Run:
    # ignore_cleanup_errors: an adapter that left a read-only file behind must
    # not turn its case result into a harness traceback.
    with tempfile.TemporaryDirectory(
        prefix=f"streamd-conformance-{case.name}-", ignore_cleanup_errors=True
    ) as workdir:
        lines = prepare_requests(case, workdir)
        return await run_transcript(
            adapter_command(case, command, workdir),
            lines,
            timeout=timeout,
            exit_grace=exit_grace,
            await_frames=dict(case.manifest.await_frames),
            place_files=placements(case, workdir),
        )
