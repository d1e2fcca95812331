"""The Trio layer: :class:`EventLog`, a typed async API over a storage backend.

This module owns tasks and nothing else; every storage rule lives in the store.

Tasks and their rules
---------------------
* **One writer task** owns appends. Callers queue an append and wait; the writer
  takes everything queued, commits it in one transaction (group commit), then
  acknowledges each caller. No caller is acknowledged before the commit that holds
  its event, and while one batch is being fsynced the next one gathers, so under
  load many appends share one fsync without any added delay when idle. A caller
  cancelled while waiting may still have its event committed; a retry with the
  same event id is answered ``duplicate: true``.
* **Watchers** are cursor readers. Each keeps the seq it last delivered and asks
  the store for matching entries after it, so replaying history and following the
  live log are the same loop, and no entry can be skipped or sent twice at the
  switch. (SQLite assigns seqs inside the single writer's transaction, so commit
  order is seq order and a cursor never passes an uncommitted seq.) A watcher that
  is caught up sleeps on a wake-up event: the writer sets it after every commit
  that added a row (in-process appends wake watchers at once), and a poller sets it
  when ``PRAGMA data_version`` moves (another process committed). The poller runs
  only while someone watches, costs one pragma per ``watch_interval``, and never
  re-queries blindly.
* **A watcher's buffer is bounded, in bytes.** The watcher reads ahead at most
  ``watch_buffer_bytes`` of entries (their size on the wire, default 4 MiB; at
  most ``watch_buffer`` entries, and always at least one) that its consumer has
  not taken, and reads the next page only for the room left, so what it holds
  never exceeds the budget by more than one entry whatever the entries weigh.
  When the consumer leaves no room for ``watch_stall_timeout`` the watch ends
  with a ``budget_exceeded`` error that names the seq to resume from, after the
  consumer has drained what was buffered; nothing follows that error. Entries
  are read with their content as raw JSON and decoded when handed out, so the
  buffer holds about the bytes it counts (``raw_content=True`` hands them out
  raw, for a consumer that only re-encodes them: the JSON-RPC watch).
* **Lease heartbeats** run in the log's own nursery, or in one the caller
  supplies, one task per lease. A heartbeat that updates no row means
  the lease was stolen: ``Lease.lost`` is set, ``on_lost`` runs, the task ends. A
  heartbeat that fails with a database error is retried at the next tick; it is
  not a loss.
* **Close** cancels every in-flight operation, which then raises ``closed``; the
  writer finishes the batch it is committing (so its callers learn the truth) and
  fails the rest as never written; leases are released; connections close.

Why ``apsw.aio`` and not ``trio.to_thread``
-------------------------------------------
Both keep SQLite off the event loop. APSW's Trio controller gives each connection
its own worker thread and honours Trio cancellation and deadlines (a queued call is
skipped, a running statement is interrupted); ``to_thread.run_sync`` cannot
interrupt a running call. Measured on this machine (2 vCPU, ext4, APSW 3.54.1,
Trio 0.35, synchronous=FULL; medians of 5 interleaved rounds, each store call
dispatched from Trio; ``python -m streamd.eventlog.measure``)::

    per call                          inline*    to_thread    apsw.aio
    ping (one bounded read)           29 us       192 us       136 us
    since, one page of 100           433 us       808 us       614 us
    one append waited for alone      530 us       771 us       711 us
    64 concurrent appenders       12,400/s      9,200/s      9,700/s

    * inline blocks the event loop for the whole call: a baseline, not a choice.

apsw.aio costs 30 % less per call than ``to_thread`` on reads (its worker is
already waiting on a queue; ``to_thread`` hands each call to a pooled thread and
back) and is the only one of the two that can abandon or interrupt a call when
its caller is cancelled, so it is the dispatch used (``dispatch="aio"``). Appends
are dominated by the fsync, which is why group commit matters more than dispatch
there. ``dispatch="thread"`` stays for measurement and for backends whose drivers
have no async mode; ``dispatch="inline"`` runs the store on the event loop thread
and exists for tests under Trio's mock clock, where a real thread would let the
clock jump while SQLite works.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import trio

from streamd.errors import BUDGET_EXCEEDED, CLOSED, INTERNAL_ERROR, RpcError, is_closed
from streamd.eventlog.model import (
    DEFAULT_SINCE_LIMIT,
    DEFAULT_STALE_AFTER_MS,
    DEFAULT_WATCH_BUFFER_BYTES,
    AppendParams,
    AppendResult,
    Boot,
    BootRecentParams,
    BootRecordParams,
    BootUpdateParams,
    BranchesParams,
    Entry,
    Event,
    Filter,
    LatestSeqParams,
    LeaseInfo,
    LockAcquireParams,
    Session,
    SessionCreateParams,
    SessionDeleteParams,
    SessionGetParams,
    SessionListParams,
    SessionWithEvents,
    SinceParams,
    SinceResult,
    WatchParams,
    checked,
    to_us,
    wire_size,
)
from streamd.eventlog.store import Backend, SqliteOptions, SqliteStore, closed_error

__all__ = [
    "DEFAULT_WATCH_INTERVAL",
    "EventLog",
    "EventLogStats",
    "Lease",
    "Watch",
    "new_holder_id",
    "resolve_db_path",
]

logger = logging.getLogger(__name__)

_decode_content = msgspec.json.Decoder().decode

DEFAULT_WATCH_INTERVAL = 0.2
# How long close lets work already inside SQLite finish before interrupting it.
_CLOSE_GRACE = 0.5
Dispatch = Literal["aio", "thread", "inline"]
Role = Literal["writer", "reader"]


def resolve_db_path(
    explicit: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None
) -> Path:
    """Where the log lives: an explicit path, else ``$STREAMD_DB``, else
    ``$XDG_STATE_HOME/streamd/events.db`` (``~/.local/state`` when unset or not
    absolute, as the XDG spec says), so it works with no configuration."""
    environ = os.environ if env is None else env
    if explicit is not None:
        return Path(explicit).expanduser()
    if environ.get("STREAMD_DB"):
        return Path(environ["STREAMD_DB"]).expanduser()
    state = environ.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "streamd" / "events.db"


def new_holder_id() -> str:
    """``host/pid/8-hex``: which machine and process holds a lease, plus enough
    randomness that two acquisitions by one process are told apart."""
    host = socket.gethostname() or "unknown"
    return f"{host}/{os.getpid()}/{secrets.token_hex(4)}"


@dataclass
class EventLogStats:
    """Counters for diagnostics and benchmarks (group commit at work)."""

    appends: int = 0
    batches: int = 0
    largest_batch: int = 0


@dataclass(eq=False)
class _PendingAppend:
    params: AppendParams
    done: trio.Event = field(default_factory=trio.Event)
    outcome: AppendResult | RpcError | None = None

    def resolve(self, outcome: AppendResult | RpcError) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.done.set()


def _never_written() -> RpcError:
    return RpcError(CLOSED, "event log closed before the append was written; it was not written")


class _ThreadedStore:
    """Run a synchronous backend through ``trio.to_thread`` (one call at a time)."""

    def __init__(self, inner: SqliteStore) -> None:
        self._inner = inner
        self._limiter = trio.CapacityLimiter(1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._inner.close, limiter=self._limiter)


class Lease:
    """An exclusive lease on one session, kept fresh by a heartbeat task.

    ``lost`` is set if another process stole the lease (our heartbeat found the row
    no longer ours); whoever works under the lease should stop then, or two
    processes drive one session. ``lost`` is never set by a clean release.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        lock: str,
        holder: str,
        app: str,
        user: str,
        session: str,
        heartbeat_ms: int,
        on_lost: Callable[[Lease], Awaitable[None]] | None,
    ) -> None:
        self.lock = lock
        self.holder = holder
        self.app = app
        self.user = user
        self.session = session
        self.heartbeat_ms = heartbeat_ms
        self.lost = trio.Event()
        self.beats = 0
        """Successful heartbeats so far (diagnostics; tests watch it advance)."""
        self._log = log
        self._on_lost = on_lost
        self._scope = trio.CancelScope()
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    async def release(self) -> None:
        """Stop the heartbeat and delete the lease row if it is still ours.

        Idempotent. After the log is closed this does nothing: close already
        released every lease.
        """
        if self._released:
            return
        self._released = True
        self._scope.cancel()
        self._log._leases.pop(self.lock, None)
        if self.lost.is_set() or self._log.closed:
            return
        await self._log._call(
            "writer", "release_lease", self.app, self.user, self.session, self.holder
        )


class Watch:
    """An async iterator over the entries after ``from_seq`` that match a filter,
    replayed and then followed live, each exactly once and in seq order.

    Use as ``async with log.watch(...) as w: async for entry in w: ...`` so the
    reader task stops when you leave the block. ``last_seq`` is the seq of the
    last entry handed out (``from_seq`` before the first): resume from it.
    """

    def __init__(
        self,
        log: EventLog,
        from_seq: int,
        flt: Filter | None,
        capacity: int,
        budget_bytes: int,
        raw_content: bool,
    ) -> None:
        self.from_seq = from_seq
        self.filter = flt
        self.last_seq = from_seq
        self._log = log
        self._raw = raw_content
        # Each entry travels with its size on the wire, so the consumer can give
        # back exactly what the producer counted.
        self._send, self._recv = trio.open_memory_channel[tuple[Entry, int]](capacity)
        self._page = min(256, capacity)
        self._budget = budget_bytes
        self._held = 0  # bytes of entries sent into the channel and not yet taken
        self._taken = trio.Event()  # set (and replaced) whenever the consumer takes one
        self._scope = trio.CancelScope()
        self._error: RpcError | None = None

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Entry:
        if self._log.closed:
            raise closed_error()
        try:
            entry, size = await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            if self._log.closed:
                raise closed_error() from None
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None
        self._held -= size
        self._taken.set()
        self._taken = trio.Event()
        content = entry.event.content
        if not self._raw and isinstance(content, msgspec.Raw):
            # Valid JSON: raw reads turn content that is not into a damaged null.
            entry.event.content = _decode_content(content)
        self.last_seq = entry.seq
        return entry

    async def aclose(self) -> None:
        self._scope.cancel()
        self._recv.close()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def error(self) -> RpcError | None:
        """Why the watch ended, once it has (raised again by the iterator)."""
        return self._error

    @property
    def buffered(self) -> int:
        """Entries read from the log but not yet taken by the consumer."""
        return self._recv.statistics().current_buffer_used

    @property
    def buffered_bytes(self) -> int:
        """Their size on the wire: at most the budget, or one entry beyond it."""
        return self._held

    @property
    def budget_bytes(self) -> int:
        return self._budget


class EventLog:
    """The durable event log, opened lazily on first use.

    ``async with EventLog(path) as log:`` creates no file; the database is opened
    (and created, with its directory) by the first operation. Every method raises
    :class:`~streamd.errors.RpcError`; after :meth:`aclose` every method raises
    ``closed`` promptly.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        watch_interval: float = DEFAULT_WATCH_INTERVAL,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout_ms: int = 5000,
        watch_buffer: int = 1000,
        watch_buffer_bytes: int = DEFAULT_WATCH_BUFFER_BYTES,
        watch_stall_timeout: float = 30.0,
        max_batch: int = 512,
        wall_clock: Callable[[], float] = time.time,
        dispatch: Dispatch = "aio",
        open_backend: Callable[[Role], Awaitable[Backend]] | None = None,
    ) -> None:
        if watch_interval <= 0 or watch_buffer < 1 or watch_buffer_bytes < 1 or max_batch < 1:
            raise ValueError(
                "watch_interval, watch_buffer, watch_buffer_bytes and max_batch must be positive"
            )
        self.path = resolve_db_path(path)
        self.watch_interval = watch_interval
        self.stats = EventLogStats()
        self._options = SqliteOptions(synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        self._watch_buffer = watch_buffer
        self._watch_buffer_bytes = watch_buffer_bytes
        self._stall_timeout = watch_stall_timeout
        self._max_batch = max_batch
        self._wall_clock = wall_clock
        self._dispatch = dispatch
        self._open_backend = open_backend or self._open_sqlite

        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None
        self._open_lock = trio.Lock()
        self._writer: Backend | None = None
        self._reader: Backend | None = None
        self._closed = False
        self._close_done = trio.Event()

        self._queue_send, self._queue_recv = trio.open_memory_channel[_PendingAppend](4 * max_batch)
        self._writer_done = trio.Event()
        self._writer_started = False

        self._wake = trio.Event()
        self._watchers = 0
        self._poller_running = False
        self._watches: set[Watch] = set()
        self._op_scopes: set[trio.CancelScope] = set()
        self._leases: dict[str, Lease] = {}

    # -- lifecycle --

    async def __aenter__(self) -> EventLog:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        try:
            await self.aclose()
        finally:
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            cm, self._nursery_cm = self._nursery_cm, None
        try:
            return await cm.__aexit__(*exc)
        except BaseExceptionGroup as group:
            # The background tasks never raise, so a group holding only the
            # body's own exception is noise: let that exception through as is,
            # so `except RpcError` around the block works.
            if exc[1] is not None and list(group.exceptions) == [exc[1]]:
                return False
            raise

    @property
    def watch_buffer_bytes(self) -> int:
        """Bytes one watch may hold for a consumer that is not reading."""
        return self._watch_buffer_bytes

    @property
    def watch_stall_timeout(self) -> float:
        """How long a watch waits on a consumer that does not read before it
        ends with budget_exceeded."""
        return self._stall_timeout

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def opened(self) -> bool:
        """Whether the database has been opened (it is opened by the first call)."""
        return self._writer is not None

    async def aclose(self) -> None:
        """Close promptly; see the module docstring for what happens to work in
        flight. Safe to call more than once."""
        if self._closed:
            with trio.CancelScope(shield=True):
                await self._close_done.wait()
            return
        self._closed = True
        # Shielded: closing must finish even when the caller is being cancelled,
        # or the connections' worker threads would keep the process alive.
        with trio.CancelScope(shield=True):
            try:
                await self._close()
            finally:
                self._close_done.set()

    async def _close(self) -> None:
        for scope in list(self._op_scopes):
            scope.cancel()
        for w in list(self._watches):
            w._scope.cancel()
        leases = list(self._leases.values())
        for lease in leases:
            lease._scope.cancel()
        self._queue_send.close()
        async with self._open_lock:
            pass  # an open in progress finishes, so its connections get closed too
        if self._writer_started:
            # The batch being committed normally lands in milliseconds and its
            # callers then learn the truth; one stuck behind another process's
            # lock is interrupted (rolled back, reported as not written).
            with trio.move_on_after(_CLOSE_GRACE):
                await self._writer_done.wait()
            if not self._writer_done.is_set():
                self._interrupt()
                await self._writer_done.wait()
        else:
            self._fail_queued()
        if self._writer is not None and leases:
            # Release what we hold so another process need not wait for
            # staleness; bounded, a wedged database must not hang close.
            with trio.move_on_after(_CLOSE_GRACE):
                for lease in leases:
                    try:
                        await self._writer.run(
                            self._writer.release_lease,
                            lease.app,
                            lease.user,
                            lease.session,
                            lease.holder,
                        )
                    except RpcError as exc:
                        logger.warning("releasing lease %s at close: %s", lease.lock, exc)
        self._leases.clear()
        # Every caller has been answered; whatever a connection is still doing
        # (a cancelled call waiting on a lock) is abandoned, not waited out.
        self._interrupt()
        for backend in (self._reader, self._writer):
            if backend is not None:
                try:
                    await backend.aclose()
                except RpcError as exc:
                    logger.warning("closing event log connection: %s", exc)

    def _interrupt(self) -> None:
        for backend in (self._reader, self._writer):
            if backend is not None:
                backend.interrupt()

    # -- plumbing --

    async def _open_sqlite(self, role: Role) -> Backend:
        path = str(self.path)
        if role == "writer":
            _prepare_file(self.path)
        migrate = role == "writer"
        if self._dispatch == "aio":
            return await SqliteStore.open_async(path, self._options, migrate=migrate)
        if self._dispatch == "thread":
            store = await trio.to_thread.run_sync(
                lambda: SqliteStore.open(path, self._options, migrate=migrate)
            )
            return _ThreadedStore(store)  # type: ignore[return-value]
        return SqliteStore.open(path, self._options, migrate=migrate)

    async def _ensure_open(self) -> tuple[Backend, Backend]:
        if self._closed:
            raise closed_error()
        if self._writer is not None and self._reader is not None:
            return self._writer, self._reader
        if self._nursery is None:
            raise RuntimeError("use the EventLog as `async with EventLog(...) as log:`")
        async with self._open_lock:
            if self._closed:
                raise closed_error()
            if self._writer is None:
                # Shielded: a half-finished open could leave a connection (and its
                # worker thread) that nobody closes. It is short, and close waits
                # for it on the open lock.
                with trio.CancelScope(shield=True):
                    writer = await self._open_backend("writer")
                    try:
                        reader = await self._open_backend("reader")
                    except BaseException:
                        await writer.aclose()
                        raise
                self._writer, self._reader = writer, reader
                self._writer_started = True
                self._nursery.start_soon(self._write_batches)
            if self._closed:
                raise closed_error()
        assert self._writer is not None and self._reader is not None
        return self._writer, self._reader

    async def _call(self, role: Role, name: str, *args: Any) -> Any:
        """Run one store method; if close interrupts it, raise ``closed``."""
        if self._closed:
            raise closed_error()
        scope = trio.CancelScope()
        self._op_scopes.add(scope)
        try:
            with scope:
                writer, reader = await self._ensure_open()
                backend = writer if role == "writer" else reader
                return await backend.run(getattr(backend, name), *args)
        finally:
            self._op_scopes.discard(scope)
        raise closed_error()

    def _now_us(self) -> int:
        return int(self._wall_clock() * 1_000_000)

    def _bump(self) -> None:
        """Wake every caught-up watcher: something may have been committed."""
        wake, self._wake = self._wake, trio.Event()
        wake.set()

    # -- appends --

    async def append(
        self,
        app: str,
        user: str,
        session: str,
        event: Event,
        metadata: dict[str, str] | None = None,
    ) -> AppendResult:
        """Append one event; returns its seq (and ``duplicate`` for a safe retry).

        The result is returned only after the transaction holding the event has
        committed (durable per the ``synchronous`` setting).
        """
        return await self.append_params(
            checked(
                AppendParams, app=app, user=user, session=session, event=event, metadata=metadata
            )
        )

    async def append_params(self, params: AppendParams) -> AppendResult:
        """:meth:`append` for already-validated params (the JSON-RPC path)."""
        if self._closed:
            raise closed_error()
        pending = _PendingAppend(params)
        try:
            # The common case, an open log with room in the queue, needs no
            # scope for close to cancel: nothing here can block. A cancel scope
            # costs about a tenth of the event loop's time per append.
            if self._writer is None:
                raise trio.WouldBlock
            self._queue_send.send_nowait(pending)
        except trio.ClosedResourceError:
            raise closed_error() from None
        except trio.WouldBlock:
            await self._enqueue(pending)
        # Outside the close-cancelled scope: once queued, the writer resolves
        # every append, even at close, and the caller deserves the true outcome
        # of a batch that was committing when close began.
        await pending.done.wait()
        assert pending.outcome is not None
        if isinstance(pending.outcome, RpcError):
            raise pending.outcome
        return pending.outcome

    async def _enqueue(self, pending: _PendingAppend) -> None:
        """Queue an append, opening the log or waiting for room; close cancels it."""
        scope = trio.CancelScope()
        self._op_scopes.add(scope)
        try:
            with scope:
                await self._ensure_open()
                try:
                    await self._queue_send.send(pending)
                except trio.ClosedResourceError:
                    raise closed_error() from None
        finally:
            self._op_scopes.discard(scope)
        if scope.cancelled_caught:
            raise closed_error()

    async def _write_batches(self) -> None:
        assert self._writer is not None
        writer = self._writer
        batch: list[_PendingAppend] = []
        try:
            async for first in self._queue_recv:
                batch = [first]
                while len(batch) < self._max_batch:
                    try:
                        batch.append(self._queue_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if self._closed:
                    for p in batch:
                        p.resolve(_never_written())
                    continue
                try:
                    # Not cancelled by close: the batch in flight finishes, so its
                    # callers hear whether it committed.
                    with trio.CancelScope(shield=True):
                        results: Sequence[AppendResult | RpcError] = await writer.run(
                            writer.append_batch, [p.params for p in batch], self._now_us()
                        )
                except RpcError as exc:
                    # Interrupted by close means rolled back: say so precisely.
                    results = [_never_written() if is_closed(exc) else exc] * len(batch)
                wrote = False
                for p, outcome in zip(batch, results, strict=True):
                    p.resolve(outcome)
                    if isinstance(outcome, AppendResult) and not outcome.duplicate:
                        wrote = True
                self.stats.batches += 1
                self.stats.appends += len(batch)
                self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
                batch = []
                if wrote:
                    self._bump()
        finally:
            for p in batch:
                p.resolve(_never_written())
            self._fail_queued()
            self._writer_done.set()

    def _fail_queued(self) -> None:
        while True:
            try:
                pending = self._queue_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            pending.resolve(_never_written())

    # -- reads --

    async def since(
        self,
        from_seq: int = 0,
        filter: Filter | None = None,
        limit: int = DEFAULT_SINCE_LIMIT,
        *,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SinceResult:
        """One page of matching entries after ``from_seq``, in seq order.

        ``raw_content`` leaves each event's content as its JSON text
        (``msgspec.Raw``), and ``encoded`` each whole entry, for callers that
        only write them out (the JSON-RPC methods); everyone else gets decoded
        values. ``max_bytes`` also ends the page before its entries pass that
        many bytes on the wire (at least one entry; ``caught_up`` is then
        false)."""
        p = checked(SinceParams, from_seq=from_seq, filter=filter, limit=limit)
        return await self._call(
            "reader", "since", p.from_seq, p.filter, p.limit, raw_content, max_bytes, encoded
        )

    async def latest_seq(self, filter: Filter | None = None) -> int:
        """The newest matching seq, 0 when nothing matches."""
        p = checked(LatestSeqParams, filter=filter)
        return await self._call("reader", "latest_seq", p.filter)

    async def nth_newest_seq(self, offset: int, filter: Filter | None = None) -> int:
        """The seq ``offset`` entries behind the newest match (0 = the newest), 0
        when fewer match. Watching from the entry before it replays the last
        ``offset + 1`` matches, as ``tail -n`` does."""
        p = checked(LatestSeqParams, filter=filter)
        return await self._call("reader", "nth_newest_seq", p.filter, offset)

    async def branches(self, filter: Filter | None = None, limit: int | None = None) -> list[str]:
        """Distinct non-empty branch labels under the filter, sorted ascending."""
        p = checked(BranchesParams, filter=filter, limit=limit)
        return await self._call("reader", "branches", p.filter, p.limit)

    def watch(
        self,
        from_seq: int = 0,
        filter: Filter | None = None,
        *,
        raw_content: bool = False,
        buffer_bytes: int | None = None,
    ) -> Watch:
        """Follow the log from ``from_seq``: see :class:`Watch`. ``buffer_bytes``
        overrides the log's ``watch_buffer_bytes`` for this watch (the JSON-RPC
        watch reads ahead less, because the connection holds the rest)."""
        if self._closed:
            raise closed_error()
        if self._nursery is None:
            raise RuntimeError("use the EventLog as `async with EventLog(...) as log:`")
        if buffer_bytes is not None and buffer_bytes < 1:
            raise ValueError("buffer_bytes must be positive")
        p = checked(WatchParams, from_seq=from_seq, filter=filter)
        budget = self._watch_buffer_bytes if buffer_bytes is None else buffer_bytes
        w = Watch(self, p.from_seq, p.filter, self._watch_buffer, budget, raw_content)
        self._watches.add(w)
        self._nursery.start_soon(self._produce, w)
        return w

    async def _produce(self, w: Watch) -> None:
        cursor = w.from_seq
        registered = False
        try:
            with w._scope:
                _, reader = await self._ensure_open()
                self._watchers += 1
                registered = True
                if not self._poller_running:
                    self._poller_running = True
                    assert self._nursery is not None
                    self._nursery.start_soon(self._poll_changes)
                while True:
                    # Taken before the query: a commit that lands during the query
                    # sets this very event, so the wait below cannot miss it.
                    wake = self._wake
                    # Read only what there is room for (always at least one
                    # entry), so the page waiting here and the channel together
                    # stay within the budget.
                    room = max(w._budget - w._held, 1)
                    page = await reader.run(
                        reader.since, cursor, w.filter, w._page, True, room
                    )
                    for entry in page.entries:
                        size = wire_size(entry)
                        with trio.move_on_after(self._stall_timeout) as stall:
                            while w._held and w._held + size > w._budget:
                                await w._taken.wait()
                            w._held += size
                            try:
                                await w._send.send((entry, size))
                            except BaseException:
                                w._held -= size  # not sent
                                raise
                        if stall.cancelled_caught:
                            raise _stalled(cursor, w, self._stall_timeout)
                        cursor = entry.seq
                    if page.caught_up:
                        await wake.wait()
        except RpcError as exc:
            w._error = exc
        except trio.BrokenResourceError:
            pass  # the consumer closed its end
        except Exception as exc:
            # This task lives in the log's nursery: letting a bug escape would
            # take down every client of the daemon, not just this watch.
            logger.exception("watch from seq %s failed", cursor)
            w._error = RpcError(
                INTERNAL_ERROR, f"watch failed: {exc!r}; resume with from_seq={cursor}"
            )
        finally:
            if registered:
                self._watchers -= 1
            self._watches.discard(w)
            w._send.close()

    async def _poll_changes(self) -> None:
        """Notice other processes' commits while anyone is watching."""
        try:
            assert self._reader is not None
            reader = self._reader
            last: int | None = None
            while self._watchers > 0:
                try:
                    version = await reader.run(reader.change_counter)
                except RpcError as exc:
                    if is_closed(exc):
                        return
                    logger.warning("event log change poll failed (will retry): %s", exc)
                else:
                    # The first reading is only a baseline, and a commit between a
                    # watcher's last query and that baseline would go unseen; so
                    # the baseline itself wakes everyone once.
                    if version != last:
                        last = version
                        self._bump()
                await trio.sleep(self.watch_interval)
        finally:
            self._poller_running = False

    # -- sessions --

    async def create_session(
        self,
        app: str,
        user: str,
        session: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> Session:
        """Create a session (an id is generated when none is given); creating one
        that exists is invalid_params."""
        p = checked(SessionCreateParams, app=app, user=user, session=session, state=state)
        return await self._call(
            "writer", "create_session", p.app, p.user, p.session, p.state, self._now_us()
        )

    async def get_session(
        self,
        app: str,
        user: str,
        session: str,
        after_seq: int = 0,
        recent: int | None = None,
        *,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SessionWithEvents:
        """The session with its events; ``session_not_found`` if never written.
        ``raw_content``, ``max_bytes`` and ``encoded`` as for :meth:`since`; an
        answer cut by ``max_bytes`` is ``truncated`` and continues after its
        ``next_seq``."""
        p = checked(
            SessionGetParams,
            app=app,
            user=user,
            session=session,
            after_seq=after_seq,
            recent=recent,
        )
        return await self._call(
            "reader",
            "get_session",
            p.app,
            p.user,
            p.session,
            p.after_seq,
            p.recent,
            raw_content,
            max_bytes,
            encoded,
        )

    async def list_sessions(self, app: str, user: str | None = None) -> list[Session]:
        p = checked(SessionListParams, app=app, user=user)
        return await self._call("reader", "list_sessions", p.app, p.user)

    async def delete_session(self, app: str, user: str, session: str) -> None:
        """Delete a session and its events (idempotent)."""
        p = checked(SessionDeleteParams, app=app, user=user, session=session)
        await self._call("writer", "delete_session", p.app, p.user, p.session)

    # -- leases --

    async def acquire_lock(
        self,
        app: str,
        user: str,
        session: str,
        *,
        nursery: trio.Nursery | None = None,
        stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
        heartbeat_ms: int | None = None,
        on_lost: Callable[[Lease], Awaitable[None]] | None = None,
    ) -> Lease:
        """Take the session's lease and start its heartbeat in ``nursery``, or in
        the log's own nursery when none is given (then it beats until the lease is
        released or lost, or the log closes).

        ``stale_after_ms`` is our promise to others (how old our heartbeat may
        get before the lease may be taken from us), stored with the lease;
        ``heartbeat_ms`` defaults to a third of it, at most 5 s (see
        :class:`~streamd.eventlog.model.LockAcquireParams` for the floors).
        Raises ``session_locked`` (data: holder, heartbeat_age_ms) while the
        current holder's heartbeat is fresher than the window *that holder*
        declared; a staler lease is stolen. Leases are not re-entrant: a second
        acquire of a held session is ``session_locked`` even from the same
        process.
        """
        p = checked(
            LockAcquireParams,
            app=app,
            user=user,
            session=session,
            stale_after_ms=stale_after_ms,
            heartbeat_ms=heartbeat_ms,
        )
        holder = new_holder_id()
        await self._call(
            "writer",
            "acquire_lease",
            p.app,
            p.user,
            p.session,
            holder,
            p.stale_after_ms,
            self._now_us(),
        )
        lease = Lease(
            self,
            lock=secrets.token_hex(8),
            holder=holder,
            app=p.app,
            user=p.user,
            session=p.session,
            heartbeat_ms=p.interval_ms,
            on_lost=on_lost,
        )
        self._leases[lease.lock] = lease
        try:
            if nursery is not None:
                nursery.start_soon(self._heartbeat, lease)
            else:
                assert self._nursery is not None  # the store call above opened the log
                self._nursery.start_soon(self._heartbeat, lease)
        except BaseException:
            await lease.release()
            raise
        return lease

    async def release_lock(self, lock: str) -> None:
        """Release by lock id; unknown or already released ids are fine."""
        if self._closed:
            raise closed_error()
        lease = self._leases.get(lock)
        if lease is not None:
            await lease.release()

    def lease(self, lock: str) -> Lease | None:
        return self._leases.get(lock)

    async def _heartbeat(self, lease: Lease) -> None:
        interval = lease.heartbeat_ms / 1000
        with lease._scope:
            while True:
                await trio.sleep(interval)
                try:
                    # Bounded so a wedged database delays the next beat, not all.
                    with trio.fail_after(interval):
                        held = await self._call(
                            "writer",
                            "heartbeat_lease",
                            lease.app,
                            lease.user,
                            lease.session,
                            lease.holder,
                            self._now_us(),
                        )
                except (RpcError, trio.TooSlowError) as exc:
                    if isinstance(exc, RpcError) and is_closed(exc):
                        return
                    # The lease may well still be ours: retry at the next tick.
                    logger.warning("lease %s heartbeat failed (will retry): %r", lease.lock, exc)
                    continue
                if held:
                    lease.beats += 1
                    continue
                self._leases.pop(lease.lock, None)
                lease.lost.set()
                if lease._on_lost is not None:
                    await lease._on_lost(lease)
                return

    async def list_locks(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        return await self._call("reader", "list_leases", app, user)

    # -- boots --

    async def record_boot(self, at: _dt.datetime, attempted: Sequence[str]) -> int:
        p = checked(BootRecordParams, at=at, attempted=list(attempted))
        return await self._call("writer", "record_boot", to_us(p.at), p.attempted)

    async def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None:
        """Rewrite a boot's attempted list; an unknown id is invalid_params."""
        p = checked(BootUpdateParams, id=boot_id, attempted=list(attempted))
        await self._call("writer", "update_boot", p.id, p.attempted)

    async def recent_boots(self, since: _dt.datetime) -> list[Boot]:
        """Boots at or after ``since``, oldest first."""
        p = checked(BootRecentParams, since=since)
        return await self._call("reader", "recent_boots", to_us(p.since))

    # -- health --

    async def ping(self) -> None:
        """Succeeds only after a real, bounded read of the log."""
        await self._call("reader", "ping")

    async def synchronous_level(self) -> int:
        """The writer's ``PRAGMA synchronous`` (2 = FULL, 1 = NORMAL)."""
        return await self._call("writer", "synchronous")


def _stalled(cursor: int, w: Watch, timeout: float) -> RpcError:
    return RpcError(
        BUDGET_EXCEEDED,
        f"watch consumer stopped reading: {w.buffered} entries ({w.buffered_bytes} bytes,"
        f" budget {w.budget_bytes}) unread for {timeout:g} s; resume with from_seq={cursor}",
        {"last_seq": cursor, "buffered": w.buffered, "buffered_bytes": w.buffered_bytes},
    )


def _prepare_file(path: Path) -> None:
    """Create the directory (0700) and an empty database file (0600) so an audit
    log of agent sessions is private to its user from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        from streamd.errors import SOURCE_UNAVAILABLE

        raise RpcError(SOURCE_UNAVAILABLE, f"cannot create event log {path}: {exc}") from exc
    os.close(fd)
