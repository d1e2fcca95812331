"""The asyncio client: what ADK and most agent frameworks run on.

One reader task feeds the protocol core and resolves each call's future; calls
write their frame (``StreamWriter.write`` queues it whole, so concurrent calls
never interleave bytes) and await the future. A call whose task is cancelled
sends ``$/cancelRequest`` before the CancelledError goes on, so the daemon
stops working on it; its late answer is read and dropped. Connecting (which
may start the resident daemon and wait for it) runs in a worker thread, never
on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from streamd import errors
from streamd.client.awaitable import AwaitableCalls, AwaitableLease
from streamd.client.protocol import (
    DEFAULT_WATCH_BUDGET,
    Call,
    ClientProtocol,
    Garbled,
    LockLost,
    Reply,
    WatchUpdated,
)
from streamd.client.transport import START_TIMEOUT, open_daemon_socket, open_socket, stdio_command
from streamd.errors import RpcError
from streamd.eventlog.model import (
    Entry,
    Filter,
    WatchParams,
    WatchResult,
)

__all__ = ["AsyncClient", "AsyncLease", "AsyncWatch"]

log = logging.getLogger("streamd.client")

T = TypeVar("T")

_READ_CHUNK = 1 << 20
# Large: a 2,000-event session is a 1.5 MB answer, and every read is a wakeup.
# The stream's limit sets how much it buffers before pausing the socket (twice
# this); at 64 KiB a large answer arrived in a ping-pong of pauses.
_STREAM_LIMIT = 4 << 20


class AsyncClient(AwaitableCalls["AsyncLease"]):
    """An asyncio client of the streamd daemon.

    ``client = await AsyncClient.connect()`` (the resident daemon, started when
    none runs), :meth:`connect_socket` or :meth:`spawn`; ``await
    client.aclose()`` or ``async with client:``. It belongs to the event loop
    that opened it. Every method raises :class:`~streamd.errors.RpcError`.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        leftover: bytes = b"",
        process: asyncio.subprocess.Process | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._process = process
        self.process = process
        """The ``streamd`` process of a :meth:`spawn` client (None otherwise)."""
        self._core = ClientProtocol()
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._watches: dict[int, asyncio.Event] = {}
        self._leases: dict[str, AsyncLease] = {}
        self._lease_type = AsyncLease
        self._closing = False
        if leftover:
            self._feed(leftover)
        self._task = asyncio.get_running_loop().create_task(self._read())

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
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_STREAM_LIMIT)
        return cls(reader, writer, leftover)

    @classmethod
    async def connect_socket(cls, path: str) -> AsyncClient:
        sock = await asyncio.to_thread(open_socket, path)
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_STREAM_LIMIT)
        return cls(reader, writer)

    @classmethod
    async def spawn(cls, args: Sequence[str] = (), *, stderr: Any = None) -> AsyncClient:
        """A ``streamd`` process of this client's own, on stdio."""
        cmd = stdio_command(args)
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=_STREAM_LIMIT,
        )
        assert proc.stdin is not None and proc.stdout is not None
        return cls(proc.stdout, proc.stdin, process=proc)

    async def aclose(self) -> None:
        """End the connection; calls in flight fail with ``closed``. Idempotent."""
        if not self._closing:
            self._closing = True
            if self._writer.can_write_eof():
                try:
                    self._writer.write_eof()
                except OSError:
                    pass
            self._writer.close()
            if self._process is not None:
                await self._process.wait()
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.done():
                raise

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- calls --

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (cancelled ones until their answer)."""
        return self._core.in_flight

    async def call(self, call: Call[T]) -> T:
        """Send one call and await its answer; cancelling the awaiting task
        cancels the call on the daemon."""
        request_id, frame = self._core.start(call)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[request_id] = future
        try:
            await self._send(frame)
            return await future
        except BaseException:
            self._abandon(request_id)
            raise

    def _abandon(self, request_id: int) -> None:
        self._futures.pop(request_id, None)
        frame = self._core.cancel(request_id)
        if frame is not None and not self._writer.is_closing():
            self._writer.write(frame)  # queued whole, without awaiting

    async def _send(self, frame: bytes) -> None:
        if self._writer.is_closing():
            raise RpcError(errors.CLOSED, "connection to the streamd daemon closed")
        self._writer.write(frame)
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise RpcError(
                errors.CLOSED, f"connection to the streamd daemon closed: {exc}"
            ) from None

    # -- the reader --

    async def _read(self) -> None:
        while True:
            try:
                data = await self._reader.read(_READ_CHUNK)
            except (ConnectionError, OSError):
                data = b""
            self._feed(data)
            if not data:
                return

    def _feed(self, data: bytes) -> None:
        events, outgoing = self._core.receive(data)
        for event in events:
            match event:
                case Reply(id=request_id):
                    future = self._futures.pop(request_id, None)
                    if future is not None and not future.done():
                        if event.error is not None:
                            future.set_exception(event.error)
                        else:
                            future.set_result(event.value)
                case WatchUpdated(id=watch_id):
                    woken = self._watches.get(watch_id)
                    if woken is not None:
                        woken.set()
                case LockLost(lock=lock):
                    lease = self._leases.pop(lock, None)
                    if lease is not None:
                        lease.lost.set()
                case Garbled(why=why):
                    log.warning("streamd client: %s", why)
        for frame in outgoing:
            if not self._writer.is_closing():
                self._writer.write(frame)

    # -- the event log --

    async def watch(
        self, from_seq: int = 0, filter: Filter | None = None, *, budget: int = DEFAULT_WATCH_BUDGET
    ) -> AsyncWatch:
        """Follow the log from ``from_seq``: ``async with await client.watch()
        as w: async for entry in w``."""
        watch_id, frame = self._core.start_watch(
            WatchParams(from_seq=from_seq, filter=filter), budget
        )
        woken = self._watches[watch_id] = asyncio.Event()
        watch = AsyncWatch(self, watch_id, woken)
        try:
            await self._send(frame)
        except BaseException:
            watch.close()
            raise
        return watch

    def _new_event(self) -> Any:
        return asyncio.Event()


class AsyncWatch:
    """An async iterator over ``eventlog/watch`` (see the sync
    :class:`~streamd.client.sync.Watch` for how it ends); leaving its ``async
    with`` block, or :meth:`close`, cancels it on the daemon."""

    def __init__(self, client: AsyncClient, watch_id: int, woken: asyncio.Event) -> None:
        self._client = client
        self._id = watch_id
        self._woken = woken
        self.last_seq = 0
        self.result: WatchResult | None = None
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Entry]:
        return self

    async def __anext__(self) -> Entry:
        core = self._client._core
        while True:
            if self._closed:
                raise StopAsyncIteration
            item = core.take(self._id)
            if item is not None:
                break
            self._woken.clear()
            await self._woken.wait()
        self.last_seq = core.last_seq(self._id)
        if isinstance(item, Entry):
            return item
        if isinstance(item, WatchResult):
            self.result = item
            raise StopAsyncIteration
        raise item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._woken.set()
        self._client._watches.pop(self._id, None)
        self._client._abandon(self._id)
        self._client._core.forget_watch(self._id)

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncLease(AwaitableLease):
    """A session lease held through this connection; :attr:`lost` (an
    ``asyncio.Event``) is set when it is stolen or the connection ends."""

    lost: asyncio.Event
