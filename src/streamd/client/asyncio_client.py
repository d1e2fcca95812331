"""The asyncio client: what ADK and most agent frameworks run on.

A socket's bytes go straight from an ``asyncio.BufferedProtocol`` into the
protocol core, which resolves each call's future in the same turn of the event
loop (no StreamReader, no reader task to wake in between: for an agent loop
that awaits each append, every turn is latency). A call writes its frame in one
``transport.write`` (queued whole, so concurrent calls never interleave bytes)
and awaits its future; it waits for the transport to drain only while the
transport has paused writing. A call whose task is cancelled sends
``$/cancelRequest`` before the CancelledError goes on, so the daemon stops
working on it; its late answer is read and dropped. A spawned ``streamd`` is
read the same way through its pipes' streams, by a reader task. Connecting
(which may start the resident daemon and wait for it) runs in a worker thread,
never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from streamd import errors
from streamd.client.awaitable import AwaitableCalls, AwaitableLease, AwaitableWatch
from streamd.client.protocol import (
    DEFAULT_WATCH_BUDGET,
)
from streamd.client.transport import (
    EXIT_GRACE,
    START_TIMEOUT,
    forked_error,
    open_daemon_socket,
    stdio_command,
)
from streamd.errors import RpcError
from streamd.eventlog.model import (
    Filter,
)

__all__ = ["AsyncClient", "AsyncLease", "AsyncWatch"]

log = logging.getLogger("streamd.client")

T = TypeVar("T")

_READ_CHUNK = 1 << 18
# A spawned streamd's pipes: large, as a 2,000-event session is a 1.5 MB
# answer and every read is a wakeup; the stream's limit sets how much it
# buffers before pausing the pipe (twice this), and at 64 KiB a large answer
# arrived in a ping-pong of pauses.
_STREAM_LIMIT = 4 << 20
# How long closing waits for frames still queued to be written (the Trio
# client's grace too); a daemon that does not read them is then cut off.
_CLOSE_GRACE = 5.0


class _Pipe:
    """Where a client's frames go and how its input ends: a socket
    (:class:`_SocketProtocol`) or a spawned process's pipes (:class:`_Streams`)."""

    ended: asyncio.Future[None]
    """Done once the input has ended and the core has been told."""

    def attach(self, feed: Callable[[bytes], None]) -> None:
        """Start delivering input to ``feed`` (``b""`` once, at its end)."""
        raise NotImplementedError

    def write(self, frame: bytes) -> None:
        raise NotImplementedError

    def is_closing(self) -> bool:
        raise NotImplementedError

    @property
    def paused(self) -> bool:
        """The transport's buffer is full: wait for :meth:`drain` before more."""
        raise NotImplementedError

    async def drain(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Send end of input, then close."""
        raise NotImplementedError

    def abort(self) -> None:
        """Close at once, dropping what is still queued."""
        raise NotImplementedError

    def hang_up(self) -> None:
        """End the connection from any thread while no thread runs the loop
        (see :meth:`AsyncClient.hang_up`)."""
        raise NotImplementedError


class _SocketProtocol(asyncio.BufferedProtocol, _Pipe):
    """A Unix socket read into one reused buffer and fed to the core as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buffer = memoryview(bytearray(_READ_CHUNK))
        self._transport: asyncio.Transport | None = None
        self._feed: Callable[[bytes], None] | None = None
        self._early: list[bytes] = []  # what arrived before attach
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self.ended = loop.create_future()

    # protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self._buffer[:nbytes])
        if self._feed is None:
            self._early.append(data)
        else:
            self._feed(data)

    def eof_received(self) -> bool:
        self._end()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self._wake_writer(exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writer(None)

    # the pipe

    def attach(self, feed: Callable[[bytes], None]) -> None:
        early, self._early = self._early, []
        self._feed = feed
        for data in early:
            feed(data)
        if self.ended.done():
            feed(b"")

    def write(self, frame: bytes) -> None:
        assert self._transport is not None
        self._transport.write(frame)

    def is_closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    @property
    def paused(self) -> bool:
        return self._paused

    async def drain(self) -> None:
        while self._paused:
            if self.is_closing():
                raise ConnectionResetError("connection lost")
            if self._drained is None or self._drained.done():
                self._drained = self._loop.create_future()
            await asyncio.shield(self._drained)

    def close(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:
                pass
        transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def hang_up(self) -> None:
        # A shutdown, not a close: the descriptor stays the transport's, to
        # close on its loop (closed here, its number could be reused first).
        sock = None if self._transport is None else self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # closed, or the peer gone already
                sock.shutdown(socket.SHUT_RDWR)

    def _end(self) -> None:
        if self.ended.done():
            return
        self.ended.set_result(None)
        if self._feed is not None:
            self._feed(b"")

    def _wake_writer(self, exc: Exception | None) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)


class _Streams(_Pipe):
    """A spawned process's stdout and stdin, read by a task of their own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.ended = asyncio.get_running_loop().create_future()

    def attach(self, feed: Callable[[bytes], None]) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read(feed))
        self._task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    async def _read(self, feed: Callable[[bytes], None]) -> None:
        while True:
            try:
                data = await self._reader.read(_STREAM_LIMIT // 4)
            except (ConnectionError, OSError):
                data = b""
            feed(data)
            if not data:
                return

    def write(self, frame: bytes) -> None:
        self._writer.write(frame)

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    @property
    def paused(self) -> bool:
        return True  # StreamWriter.drain returns at once unless it is

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        if self._writer.can_write_eof():
            try:
                self._writer.write_eof()
            except OSError:
                pass
        self._writer.close()

    def abort(self) -> None:
        self._writer.transport.abort()

    def hang_up(self) -> None:
        pass  # a process of this client's own: its close, on its loop, ends it


class AsyncClient(AwaitableCalls["AsyncLease"]):
    """An asyncio client of the streamd daemon.

    ``client = await AsyncClient.connect()`` (the resident daemon, started when
    none runs), :meth:`connect_socket` or :meth:`spawn`; ``await
    client.aclose()`` or ``async with client:``. It belongs to the event loop
    that opened it: a call on another loop raises RuntimeError, sending
    nothing. Every method raises :class:`~streamd.errors.RpcError`.
    """

    def __init__(
        self,
        pipe: _Pipe,
        leftover: bytes = b"",
        process: asyncio.subprocess.Process | None = None,
    ) -> None:
        super().__init__()
        self._pipe = pipe
        self._loop = asyncio.get_running_loop()
        self._pid = os.getpid()  # the process whose connection this is
        self._process = process
        self.process = process
        """The ``streamd`` process of a :meth:`spawn` client (None otherwise)."""
        self._lease_type = AsyncLease
        self._closing = False
        self._exit_grace = EXIT_GRACE
        if leftover:
            self._feed(leftover)
        pipe.attach(self._feed)

    # -- opening --

    @classmethod
    async def connect(
        cls,
        runtime_dir: str | None = None,
        *,
        start_daemon: bool = True,
        daemon_args: Sequence[str] = (),
        start_timeout: float = START_TIMEOUT,
    ) -> AsyncClient:
        """The resident daemon of this user, started when none answers."""
        sock, leftover = await asyncio.to_thread(
            functools.partial(
                open_daemon_socket,
                runtime_dir,
                start_daemon=start_daemon,
                daemon_args=daemon_args,
                start_timeout=start_timeout,
            )
        )
        return cls(await _open_protocol(sock), leftover)

    @classmethod
    async def connect_socket(cls, path: str) -> AsyncClient:
        """``streamd serve --socket PATH``. Connected on the event loop (a
        Unix socket's connect does not block), sparing a worker thread's
        wake-up, which is most of a cold session load's first millisecond."""
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_unix_connection(
                lambda: _SocketProtocol(loop), path
            )
        except OSError as exc:
            raise RpcError(
                errors.SOURCE_UNAVAILABLE, f"cannot connect to {path}: {exc.strerror or exc}"
            ) from None
        return cls(protocol)

    @classmethod
    async def spawn(
        cls, args: Sequence[str] = (), *, stderr: Any = None, exit_grace: float = EXIT_GRACE
    ) -> AsyncClient:
        """A ``streamd`` process of this client's own, on stdio; closing the
        client ends its input and waits ``exit_grace`` seconds for it to exit,
        then kills it (see :data:`~streamd.client.transport.EXIT_GRACE`)."""
        cmd = stdio_command(args)
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=_STREAM_LIMIT,
        )
        assert proc.stdin is not None and proc.stdout is not None
        client = cls(_Streams(proc.stdout, proc.stdin), process=proc)
        client._exit_grace = exit_grace
        return client

    async def aclose(self) -> None:
        """End the connection; calls in flight fail with ``closed``. Idempotent.
        In a process forked from the one that opened it, only let go: the
        connection, its transport and its loop are the parent's (the child's
        close ended the parent's connection: write_eof shuts the shared
        socket down)."""
        if os.getpid() != self._pid:
            self._closing = True
            return
        if not self._closing:
            self._closing = True
            self._pipe.close()
            if self._process is not None:
                try:
                    await asyncio.wait_for(self._process.wait(), self._exit_grace)
                except TimeoutError:
                    self._process.kill()
                    await self._process.wait()
        # A closed transport ends once its queued frames are written: never,
        # while the daemon does not read (stopped), so after a grace they are
        # dropped (the calls they carried fail with closed, leases are lost).
        try:
            await asyncio.wait_for(asyncio.shield(self._pipe.ended), _CLOSE_GRACE)
        except TimeoutError:
            self._pipe.abort()
            await asyncio.shield(self._pipe.ended)

    def hang_up(self) -> None:
        """End the daemon's connection now, from any thread, while no thread
        runs this client's loop (a loop run turn by turn, idle between): an
        :meth:`aclose` queued on that loop would leave the connection up until
        the loop ran again. The daemon sees the end at once (its leases of
        this connection are released); the descriptor is let go of when the
        loop runs the close. Not while the loop runs: call :meth:`aclose`."""
        self._pipe.hang_up()

    @property
    def closed(self) -> bool:
        """Whether the connection has ended: closed here, or by the daemon (it
        stopped, or was restarted). Every later call raises ``closed``."""
        return self._closing or self._pipe.ended.done() or self._pipe.is_closing()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the adapter --

    def _waiter(self) -> asyncio.Future[Any]:
        return self._loop.create_future()

    def _wakeup(self) -> asyncio.Event:
        return asyncio.Event()

    async def _send(self, frame: bytes) -> None:
        pipe = self._pipe
        if pipe.is_closing():
            raise RpcError(errors.CLOSED, "connection to the streamd daemon closed")
        pipe.write(frame)  # queued whole, so concurrent calls never interleave
        if pipe.paused:
            try:
                await pipe.drain()
            except (ConnectionError, OSError) as exc:
                raise RpcError(
                    errors.CLOSED, f"connection to the streamd daemon closed: {exc}"
                ) from None

    def _send_soon(self, frame: bytes) -> None:
        if os.getpid() != self._pid:
            # A forked child's close of a watch it inherited: the cancel,
            # written on the socket it shares, ended the parent's watch.
            return
        if not self._pipe.is_closing():
            self._pipe.write(frame)

    def _check_caller(self) -> None:
        if os.getpid() != self._pid:
            raise forked_error(self._pid)
        # Used from another loop (another thread's), a call wrote its frame
        # to this loop's transport from the wrong thread, and the daemon ran
        # it (an append was stored), then failed awaiting this loop's future
        # ("attached to a different loop"): refused first, as LocalClient is.
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError(
                "an AsyncClient is used on the event loop that opened it; nothing was sent")

    # -- the event log --

    async def watch(
        self, from_seq: int = 0, filter: Filter | None = None, *, budget: int = DEFAULT_WATCH_BUDGET
    ) -> AsyncWatch:
        """Follow the log from ``from_seq``: ``async with await client.watch()
        as w: async for entry in w``."""
        return AsyncWatch(self, await self._open_watch(from_seq, filter, budget))


async def _open_protocol(sock: Any) -> _SocketProtocol:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_unix_connection(lambda: _SocketProtocol(loop), sock=sock)
    return protocol


class AsyncWatch(AwaitableWatch):
    """An async iterator over ``eventlog/watch`` (see the sync
    :class:`~streamd.client.sync.Watch` for how it ends); leaving its ``async
    with`` block, or :meth:`close`, cancels it on the daemon."""

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncLease(AwaitableLease):
    """A session lease held through this connection; :attr:`lost` (an
    ``asyncio.Event``) is set when it is stolen or the connection ends."""

    lost: asyncio.Event
