"""The async shell: the asyncio and Trio clients, written once.

The two event-loop clients differ only in how they move bytes and wait. All
the rest is here, in :class:`AwaitableCalls`: request ids and the calls in
flight (in the protocol core), routing each answer to its waiter, watches
and their wake-ups, abandoning a cancelled call, leases and their loss, the
method table, and continuing a session cut by the reply budget. A flavour
inherits it and supplies its I/O adapter, four hooks:

* ``_waiter()`` - a one-shot waiter for an answer: awaitable, with
  ``set_result``, ``set_exception`` and ``done`` (an ``asyncio.Future`` is one
  as it is, so the asyncio client's hot path has no wrapper);
* ``_wakeup()`` - a fresh event of the loop (``set``, ``is_set``, ``wait``);
* ``_send(frame)`` - queue one whole frame, waiting while the peer does not
  read; ``closed`` when the connection is gone;
* ``_send_soon(frame)`` - queue a frame without waiting (a cancel), dropped
  when the connection is gone;

and may supply two more: ``_check_caller()``, which refuses a call made where
the client's I/O does not run (another event loop) before anything is sent, and
``_wait_for_room()``, which waits (cancellably) until ``_send`` may queue a
frame: a call cancelled there never sent its request, so it is withdrawn, not
cancelled on the daemon;

and it calls ``_feed(data)`` with what it reads (``b""`` at the end).

Watches talk to their client through two methods, :meth:`AwaitableCalls.watch_next`
and :meth:`AwaitableCalls.watch_close` (the same two the blocking client has),
and leases through :meth:`AwaitableCalls.release_lease`: none reaches into the
client's state.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Generator
from typing import Any, Generic, Protocol, Self, TypeVar

from streamd.client import calls
from streamd.client.protocol import (
    Call,
    ClientProtocol,
    Garbled,
    LockLost,
    Reply,
    WatchUpdated,
)
from streamd.errors import RpcError
from streamd.eventlog.model import (
    DEFAULT_STALE_AFTER_MS,
    Entry,
    Filter,
    WatchParams,
    WatchResult,
)

T = TypeVar("T")

log = logging.getLogger("streamd.client")

WatchItem = Entry | RpcError | WatchResult
"""What a watch's next step is: an entry, the error it ended with, or how it
stopped cleanly."""


class Waiter(Protocol):
    """What the shell waits on for one answer (``asyncio.Future`` is one)."""

    def done(self) -> bool: ...
    def set_result(self, value: Any) -> None: ...
    def set_exception(self, error: BaseException) -> None: ...
    def __await__(self) -> Generator[Any, None, Any]: ...


class Wakeup(Protocol):
    """``asyncio.Event`` or ``trio.Event``."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...



class LostEvent(Protocol):
    """``asyncio.Event`` or ``trio.Event``: what a lease's ``lost`` is."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...


class AwaitableLease:
    """A session lease held through this connection; :attr:`lost` (an event of
    the client's loop) is set when it is stolen or the connection ends."""

    def __init__(self, client: AwaitableCalls, lock: str, holder: str, lost: Any) -> None:
        self.lock = lock
        self.holder = holder
        self.lost = lost
        self._client = client

    async def release(self) -> None:
        await self._client.release_lease(self)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.lost.is_set():
            await self.release()


L = TypeVar("L", bound=AwaitableLease)


class AwaitableCalls(calls.AwaitedEventLogMethods, Generic[L]):
    """The async shell; see the module docstring."""

    _lease_type: type[L]

    def __init__(self) -> None:
        self._core = ClientProtocol()
        self._waiting: dict[int, Waiter] = {}
        self._wakeups: dict[int, Wakeup] = {}
        self._leases: dict[str, L] = {}

    # -- the adapter's hooks --

    def _waiter(self) -> Waiter:
        raise NotImplementedError

    def _wakeup(self) -> Wakeup:
        raise NotImplementedError

    async def _send(self, frame: bytes) -> None:
        raise NotImplementedError

    def _send_soon(self, frame: bytes) -> None:
        raise NotImplementedError

    def _check_caller(self) -> None:
        """Raise if this call is made where the client's I/O does not run."""

    async def _wait_for_room(self) -> None:
        """Wait until :meth:`_send` may queue a frame (none of it sent yet)."""

    # -- calls --

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (cancelled ones until their answer)."""
        return self._core.in_flight

    @property
    def held_leases(self) -> frozenset[str]:
        """The locks of the leases held through this connection, not yet lost
        or released."""
        return frozenset(self._leases)

    async def call(self, call: Call[T]) -> T:
        """Send one call and await its answer; cancelling the awaiting task
        (or scope) cancels the call on the daemon."""
        self._check_caller()
        request_id, frame = self._core.start(call)
        waiter = self._waiter()
        self._waiting[request_id] = waiter
        try:
            await self._wait_for_room()
        except BaseException:
            self._withdraw(request_id)
            raise
        try:
            try:
                await self._send(frame)
            except RpcError:
                # The answer, or the connection's end, came while a paused
                # transport drained: that is the call's outcome (left
                # unawaited, asyncio logged "Future exception was never
                # retrieved" for each such call).
                if not waiter.done():
                    raise
            result: T = await waiter
            return result
        except BaseException:
            self._abandon(request_id)
            raise

    def _withdraw(self, request_id: int) -> None:
        """Forget a call (or a watch) whose request never left: no cancel to
        send, and no answer will come to take it out of :attr:`in_flight` (it
        was counted there, its params held, until the connection ended)."""
        self._waiting.pop(request_id, None)
        self._core.withdraw(request_id)

    def _abandon(self, request_id: int) -> None:
        self._waiting.pop(request_id, None)
        frame = self._core.cancel(request_id)
        if frame is not None:
            self._send_soon(frame)

    def _feed(self, data: bytes | bytearray) -> None:
        """What the adapter read (``b""``: the end): answers go to their
        waiters, watches and lost leases are woken."""
        events, outgoing = self._core.receive(data)
        for event in events:
            match event:
                case Reply(id=request_id):
                    waiter = self._waiting.pop(request_id, None)
                    if waiter is not None and not waiter.done():
                        if event.error is not None:
                            waiter.set_exception(event.error)
                        else:
                            waiter.set_result(event.value)
                case WatchUpdated(id=watch_id):
                    woken = self._wakeups.get(watch_id)
                    if woken is not None:
                        woken.set()
                case LockLost(lock=lock):
                    lease = self._leases.pop(lock, None)
                    if lease is not None:
                        lease.lost.set()
                case Garbled(why=why):
                    log.warning("streamd client: %s", why)
        for frame in outgoing:
            self._send_soon(frame)

    # -- watches --

    async def _open_watch(self, from_seq: int, filter: Filter | None, budget: int) -> int:
        self._check_caller()
        watch_id, frame = self._core.start_watch(
            WatchParams(from_seq=from_seq, filter=filter), budget
        )
        self._wakeups[watch_id] = self._wakeup()
        try:
            await self._wait_for_room()
        except BaseException:
            self._wakeups.pop(watch_id, None)
            self._core.withdraw(watch_id)
            self._core.forget_watch(watch_id)
            raise
        try:
            await self._send(frame)
        except BaseException:
            self.watch_close(watch_id)
            raise
        return watch_id

    async def watch_next(self, watch_id: int) -> tuple[WatchItem | None, int]:
        """The watch's next step and the seq to resume from, waiting for one;
        None once the watch is closed. (For the watch objects.)"""
        core = self._core
        while True:
            if watch_id not in self._wakeups:
                return None, 0
            item = core.take(watch_id)
            if item is not None:
                return item, core.last_seq(watch_id)
            # A trio.Event cannot be cleared: a fresh one for each wait.
            woken = self._wakeups[watch_id] = self._wakeup()
            await woken.wait()

    def watch_close(self, watch_id: int) -> None:
        """Let go of a watch: cancel it on the daemon, wake its waiter.
        Idempotent. (For the watch objects.)"""
        woken = self._wakeups.pop(watch_id, None)
        if woken is not None:
            woken.set()
        self._abandon(watch_id)
        self._core.forget_watch(watch_id)

    # -- leases --

    async def acquire_lock(
        self,
        app: str,
        user: str,
        session: str,
        *,
        stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
        heartbeat_ms: int | None = None,
    ) -> L:
        got = await self.call(
            calls.lock_acquire(
                app, user, session, stale_after_ms=stale_after_ms, heartbeat_ms=heartbeat_ms
            )
        )
        lease = self._lease_type(self, got.lock, got.holder, self._wakeup())
        if self._core.closed:
            lease.lost.set()
        else:
            self._leases[got.lock] = lease
            self._core.lease_acquired(got.lock)
        return lease

    async def release_lease(self, lease: AwaitableLease) -> None:
        self._leases.pop(lease.lock, None)
        self._core.lease_released(lease.lock)
        await self.call(calls.lock_release(lease.lock))


class AwaitableWatch:
    """An async iterator over ``eventlog/watch`` (see the sync
    :class:`~streamd.client.sync.Watch` for how it ends), through its
    client's :meth:`~AwaitableCalls.watch_next` and
    :meth:`~AwaitableCalls.watch_close`."""

    def __init__(self, client: AwaitableCalls[Any], watch_id: int) -> None:
        self._client = client
        self._id = watch_id
        self.last_seq = 0
        self.result: WatchResult | None = None
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Entry]:
        return self

    async def __anext__(self) -> Entry:
        if self._closed:
            raise StopAsyncIteration
        item, last_seq = await self._client.watch_next(self._id)
        if item is None or self._closed:
            raise StopAsyncIteration
        self.last_seq = last_seq
        if isinstance(item, Entry):
            return item
        if isinstance(item, WatchResult):
            self.result = item
            raise StopAsyncIteration
        raise item

    def close(self) -> None:
        """Cancel the watch on the daemon (idempotent)."""
        if not self._closed:
            self._closed = True
            self._client.watch_close(self._id)
