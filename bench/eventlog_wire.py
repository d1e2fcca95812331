"""The wire of ``eventlog_bench.py``: a pipelined JSON-RPC connection (its
answers and its notifications with their arrival times) and a ``python -m
streamd`` daemon on stdio or a Unix socket, killed if a run fails."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio

ROOT = Path(__file__).resolve().parents[1]


class Frame(msgspec.Struct):
    """A frame decoded only as far as routing needs; bodies stay raw JSON."""

    id: Any = None
    method: str | None = None
    # msgspec.Raw cannot sit in a union: absent is the empty Raw.
    params: msgspec.Raw = msgspec.Raw(b"")
    result: msgspec.Raw = msgspec.Raw(b"")
    error: Any = None


class NoteEvent(msgspec.Struct):
    id: str


class NoteEntry(msgspec.Struct):
    seq: int
    event: NoteEvent


class EntryNote(msgspec.Struct):
    watch: Any
    entry: NoteEntry


class Page(msgspec.Struct):
    """A since page, entries kept raw: the client's own decoding is not what
    the bench measures (a typed client would not build dicts either)."""

    entries: list[msgspec.Raw]
    next_seq: int
    caught_up: bool


class SessionEvents(msgspec.Struct):
    events: list[msgspec.Raw]


_decode_frame = msgspec.json.Decoder(Frame).decode
_encode = msgspec.json.Encoder().encode


class RpcFailed(Exception):
    pass


class Conn:
    """One JSON-RPC connection: pipelined calls, notifications with arrival times."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send = send
        self._receive = receive
        self._next_id = 0
        self._waiting: dict[int, Callable[[Frame, float], None]] = {}
        self.notes_tx, self.notes_rx = trio.open_memory_channel[tuple[float, Frame]](100_000)
        self.closed = trio.Event()

    async def run(self) -> None:
        buf = b""
        try:
            while True:
                chunk = await self._receive.receive_some(1 << 20)
                if not chunk:
                    break
                now = time.perf_counter()
                buf += chunk
                if b"\n" not in chunk:
                    continue
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    frame = _decode_frame(line)
                    if frame.method is not None:
                        self.notes_tx.send_nowait((now, frame))
                    elif frame.id in self._waiting:
                        self._waiting.pop(frame.id)(frame, now)
        finally:
            self.closed.set()

    def _frame(self, method: str, params: Any) -> tuple[int, bytes]:
        self._next_id += 1
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        return self._next_id, _encode(body) + b"\n"

    async def call(self, method: str, params: Any, type: Any = Any) -> tuple[Any, float, float]:
        """(result decoded as ``type``, sent at, answered at)."""
        request_id, data = self._frame(method, params)
        done = trio.Event()
        slot: list[Any] = []

        def answered(frame: Frame, at: float) -> None:
            slot.extend((frame, at))
            done.set()

        self._waiting[request_id] = answered
        sent = time.perf_counter()
        await self._send.send_all(data)
        with trio.fail_after(120):
            await done.wait()
        frame, at = slot
        if frame.error is not None or not len(frame.result):
            raise RpcFailed(f"{method}: {frame.error}")
        return msgspec.json.decode(frame.result, type=type), sent, at

    async def begin(self, method: str, params: Any) -> int:
        """Send a long-running request (a watch) whose answer nobody awaits."""
        request_id, data = self._frame(method, params)
        self._waiting[request_id] = lambda frame, at: None  # its end is not timed
        await self._send.send_all(data)
        return request_id

    async def pipeline(
        self,
        method: str,
        params: Iterator[Any],
        count: int,
        inflight: int,
        on_answer: Callable[[Any, Frame], None] | None = None,
    ) -> float:
        """Send ``count`` requests keeping ``inflight`` unanswered; seconds taken.
        ``on_answer(params, frame)`` sees every answer as it arrives (the crash
        matrix records acknowledgements with it)."""
        window = trio.Semaphore(inflight)
        finished = trio.Event()
        errors: list[Any] = []
        remaining = count

        def answered(sent: Any, frame: Frame, at: float) -> None:
            nonlocal remaining
            if frame.error is not None:
                errors.append(frame.error)
            if on_answer is not None:
                on_answer(sent, frame)
            window.release()
            remaining -= 1
            if remaining == 0:
                finished.set()

        started = time.perf_counter()
        for _ in range(count):
            await window.acquire()
            sent = next(params)
            request_id, data = self._frame(method, sent)
            self._waiting[request_id] = functools.partial(answered, sent)
            await self._send.send_all(data)
        with trio.fail_after(300):
            await finished.wait()
        elapsed = time.perf_counter() - started
        if errors:
            raise RpcFailed(f"{method}: {len(errors)} errors, first {errors[0]}")
        return elapsed


# Every daemon started, so a failed run kills what it left behind.
_STARTED: list[trio.Process] = []


def kill_leftovers() -> None:
    """Kill every daemon started here that is still running (after a failure)."""
    for proc in _STARTED:
        if proc.returncode is None and proc.poll() is None:
            proc.kill()


class Daemon:
    """``python -m streamd`` on stdio, or ``serve --socket``."""

    def __init__(
        self,
        db: Path,
        *,
        synchronous: str = "FULL",
        interval_ms: int = 200,
        socket: Path | None = None,
        log: Path,
    ) -> None:
        self.args = [sys.executable, "-m", "streamd"]
        if socket is not None:
            self.args += ["serve", "--socket", str(socket)]
        self.args += [
            "--db",
            str(db),
            "--synchronous",
            synchronous,
            "--watch-interval-ms",
            str(interval_ms),
        ]
        self.socket = socket
        self.log = log
        self.proc: trio.Process | None = None
        self.conn: Conn | None = None

    async def start(self, nursery: trio.Nursery) -> Daemon:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
        stderr = open(self.log, "ab")  # noqa: SIM115 - closed with the process
        self.proc = await trio.lowlevel.open_process(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
        stderr.close()
        _STARTED.append(self.proc)
        if self.socket is None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.conn = Conn(self.proc.stdin, self.proc.stdout)
            nursery.start_soon(self.conn.run)
        else:
            # The path exists from bind(); connections are accepted from
            # listen(), a moment later: ready is when one connects.
            with trio.fail_after(30):
                while True:
                    try:
                        probe = await trio.open_unix_socket(str(self.socket))
                    except (FileNotFoundError, ConnectionRefusedError):
                        await trio.sleep(0.01)
                        continue
                    await probe.aclose()
                    break
        return self

    async def connect(self, nursery: trio.Nursery) -> Conn:
        assert self.socket is not None
        stream = await trio.open_unix_socket(str(self.socket))
        conn = Conn(stream, stream)
        nursery.start_soon(conn.run)
        return conn

    async def stop(self) -> None:
        assert self.proc is not None
        if self.socket is None:
            assert self.proc.stdin is not None
            await self.proc.stdin.aclose()
        else:
            self.proc.terminate()
        with trio.move_on_after(30):
            await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self.proc.returncode != 0:
            raise RuntimeError(f"daemon exited with {self.proc.returncode}; see {self.log}")
