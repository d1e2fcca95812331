"""The Trio client: structured, so it is an async context manager.

``async with TrioClient.connect() as client:`` opens a nursery holding the two
tasks a connection needs: the reader, which feeds the protocol core and wakes
each call's event, and the writer, the only task that touches the stream's
sending side, fed whole frames through a memory channel (so a call cancelled
while its frame is being written can never leave half a frame behind). A call
whose scope is cancelled queues ``$/cancelRequest`` for the writer before the
cancellation goes on; the late answer is read and dropped. Leaving the block
closes the connection; calls still in flight fail with ``closed``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import AsyncIterator, Generator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from streamd import errors
from streamd.client.awaitable import AwaitableCalls, AwaitableLease, AwaitableWatch
from streamd.client.protocol import (
    DEFAULT_WATCH_BUDGET,
)
from streamd.client.transport import (
    EXIT_GRACE,
    START_TIMEOUT,
    open_daemon_socket,
    open_socket,
    stdio_command,
)
from streamd.errors import RpcError
from streamd.eventlog.model import (
    Filter,
)

__all__ = ["TrioClient", "TrioLease", "TrioWatch"]

log = logging.getLogger("streamd.client")

T = TypeVar("T")

_READ_CHUNK = 1 << 20
# Large: a 2,000-event session is a 1.5 MB answer, and every read is a wakeup.
# Frames waiting for the writer before a call's send waits too (backpressure
# from a daemon that does not read). Cancel frames skip the bound.
_OUTBOX_FRAMES = 64
# How long leaving the block waits for the daemon to end the connection.
_CLOSE_GRACE = 5.0


class _Slot:
    """One answer's waiter: awaiting it returns the value or raises the error."""

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def set_result(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._wait().__await__()

    async def _wait(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class TrioClient(AwaitableCalls["TrioLease"]):
    """A Trio client of the streamd daemon, over any ``trio.abc.Stream``.

    Open it with :meth:`connect` (the resident daemon, started when none
    runs), :meth:`connect_socket`, :meth:`spawn` or :meth:`over` (a stream you
    already have); each is an async context manager. It belongs to the Trio
    run that opened it: a call from another run raises RuntimeError, sending
    nothing. Every method raises :class:`~streamd.errors.RpcError`.
    """

    def __init__(self, stream: trio.abc.Stream, nursery: trio.Nursery) -> None:
        super().__init__()
        self._stream = stream
        self._nursery = nursery
        self._lease_type = TrioLease
        self.process: trio.Process | None = None
        """The ``streamd`` process of a :meth:`spawn` client (None otherwise)."""
        # Unbounded, but only cancel frames pass without taking a slot of _room.
        self._send_frames, self._frames = trio.open_memory_channel[tuple[bytes, bool]](math.inf)
        self._room = trio.Semaphore(_OUTBOX_FRAMES)
        self._writer_done = trio.Event()
        self._reader_done = trio.Event()
        self._run = trio.lowlevel.current_trio_token()  # the run its tasks are in

    # -- opening --

    @classmethod
    @asynccontextmanager
    async def over(
        cls, stream: trio.abc.Stream, leftover: bytes = b""
    ) -> AsyncIterator[TrioClient]:
        async with trio.open_nursery() as nursery:
            client = cls(stream, nursery)
            if leftover:
                client._feed(leftover)
            nursery.start_soon(client._read)
            nursery.start_soon(client._write)
            try:
                yield client
            finally:
                # Half-close and let the daemon end the connection: it answers
                # what is in flight (cancelled, -32007) and releases our leases.
                client._send_frames.close()
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(_CLOSE_GRACE):
                        await client._writer_done.wait()
                        try:
                            await stream.send_eof()  # type: ignore[attr-defined]
                        except (AttributeError, trio.BrokenResourceError,
                                trio.ClosedResourceError, OSError):
                            pass
                        await client._reader_done.wait()
                    await stream.aclose()
                nursery.cancel_scope.cancel()
                client._feed(b"")  # whatever was still waiting fails with closed

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        runtime_dir: str | None = None,
        *,
        start_daemon: bool = True,
        daemon_args: Sequence[str] = (),
        start_timeout: float = START_TIMEOUT,
    ) -> AsyncIterator[TrioClient]:
        """The resident daemon of this user, started when none answers."""
        sock, leftover = await trio.to_thread.run_sync(
            functools.partial(
                open_daemon_socket,
                runtime_dir,
                start_daemon=start_daemon,
                daemon_args=daemon_args,
                start_timeout=start_timeout,
            )
        )
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        async with cls.over(stream, leftover) as client:
            yield client

    @classmethod
    @asynccontextmanager
    async def connect_socket(cls, path: str) -> AsyncIterator[TrioClient]:
        sock = await trio.to_thread.run_sync(open_socket, path)
        async with cls.over(trio.SocketStream(trio.socket.from_stdlib_socket(sock))) as client:
            yield client

    @classmethod
    @asynccontextmanager
    async def spawn(
        cls, args: Sequence[str] = (), *, stderr: Any = None, exit_grace: float = EXIT_GRACE
    ) -> AsyncIterator[TrioClient]:
        """A ``streamd`` process of this client's own, on stdio; leaving the
        block ends its input and waits ``exit_grace`` seconds for it to exit,
        then kills it (see :data:`~streamd.client.transport.EXIT_GRACE`)."""
        import subprocess

        proc = await trio.lowlevel.open_process(
            stdio_command(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with cls.over(trio.StapledStream(proc.stdin, proc.stdout)) as client:
                client.process = proc
                yield client
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(exit_grace):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    # -- the adapter --

    def _waiter(self) -> _Slot:
        return _Slot()

    def _wakeup(self) -> trio.Event:
        return trio.Event()

    async def _wait_for_room(self) -> None:
        await self._room.acquire()

    def _feed(self, data: bytes | bytearray) -> None:
        super()._feed(data)
        if not data:
            # The connection is over, and its calls are answered closed; those
            # waiting for a slot of the outbox would wait for ever (the writer
            # that frees slots has stopped, or will send nothing more): each is
            # let through, to find its answer.
            for _ in range(self._room.statistics().tasks_waiting):
                self._room.release()

    async def _send(self, frame: bytes) -> None:
        self._queue(frame, counted=True)  # into the slot _wait_for_room took

    def _check_caller(self) -> None:
        # Called from another Trio run (another thread's), a call put its frame
        # in this run's channel, woke this run's writer from the wrong thread
        # (the caller got a bare AssertionError from Trio), and every later
        # call of the client waited for ever: refused first.
        if trio.lowlevel.current_trio_token() is not self._run:
            raise RuntimeError(
                "a TrioClient is used in the Trio run that opened it; nothing was sent")

    def _send_soon(self, frame: bytes) -> None:
        try:
            self._queue(frame)
        except RpcError:
            pass  # the connection is gone, and the call with it

    def _queue(self, frame: bytes, counted: bool = False) -> None:
        try:
            self._send_frames.send_nowait((frame, counted))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            if counted:
                self._room.release()
            raise RpcError(errors.CLOSED, "connection to the streamd daemon closed") from None

    async def _write(self) -> None:
        try:
            async for frame, counted in self._frames:
                if counted:
                    self._room.release()
                try:
                    await self._stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self._feed(b"")
                    return
        finally:
            self._writer_done.set()

    # -- the reader --

    async def _read(self) -> None:
        try:
            while True:
                try:
                    data = await self._stream.receive_some(_READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                self._feed(data)
                if not data:
                    return
        finally:
            self._reader_done.set()

    # -- the event log --

    @asynccontextmanager
    async def watch(
        self, from_seq: int = 0, filter: Filter | None = None, *, budget: int = DEFAULT_WATCH_BUDGET
    ) -> AsyncIterator[TrioWatch]:
        """``async with client.watch(from_seq) as w: async for entry in w``;
        leaving the block cancels the watch on the daemon."""
        watch = TrioWatch(self, await self._open_watch(from_seq, filter, budget))
        try:
            yield watch
        finally:
            watch.close()


class TrioWatch(AwaitableWatch):
    """An async iterator over ``eventlog/watch`` (see the sync
    :class:`~streamd.client.sync.Watch` for how it ends)."""


class TrioLease(AwaitableLease):
    """A session lease held through this connection; :attr:`lost` (a
    ``trio.Event``) is set when it is stolen or the connection ends."""

    lost: trio.Event
