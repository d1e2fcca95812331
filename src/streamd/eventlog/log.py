"""The Trio layer: :class:`EventLog`, a typed async API over a storage backend.

This module owns tasks and nothing else; every storage rule lives in the store,
the rules of a watch in :mod:`~streamd.eventlog.watch` and those of a lease in
:mod:`~streamd.eventlog.lease`. Every store call is a typed call of one
:class:`~streamd.eventlog.store.Backend` operation, run on the writer's or the
reader's connection.

Tasks and their rules
---------------------
* **One writer task** owns appends. Callers queue an append and wait; the writer
  takes everything queued, commits it in one transaction (group commit), then
  acknowledges each caller. No caller is acknowledged before the commit that holds
  its event, and while one batch is being fsynced the next one gathers, so under
  load many appends share one fsync without any added delay when idle. A caller
  cancelled while waiting may still have its event committed; a retry with the
  same event id is answered ``duplicate: true``.
* **Watch producers** run in the log's nursery, one per watch, reading history
  through the reader's connection. A caught-up watch is fed in memory by the
  writer's :class:`~streamd.eventlog.fanout.Fanout` (each commit's entries,
  encoded once, handed to every matching watch) and reads the store again only
  when it fell behind or another process committed. Those commits are noticed
  by a **change watcher** (:mod:`~streamd.eventlog.sqlite.changes`: inotify on the
  database's directory, else a poll every ``watch_interval``) whose every wake
  is confirmed by ``PRAGMA data_version`` and the newest seq; it runs only
  while someone watches.
* **Lease heartbeats** run in the log's own nursery, or in one the caller
  supplies, one task per lease.
* **Retention** runs every ``retention_interval`` seconds (and on
  :meth:`EventLog.compact`), one compaction at a time, each step its own short
  write on the writer's connection, bounded by rows whatever the policy
  (:mod:`~streamd.eventlog.retention`), so appends interleave; before each
  step it re-reads the oldest position of the open watches, and removes
  nothing after it.
* **Close** cancels every in-flight operation, which then raises ``closed``; the
  writer finishes the batch it is committing (so its callers learn the truth) and
  fails the rest as never written; leases are released; connections close.

Two ways in: the keyword methods (``since(from_seq, filter, limit)``) validate
their values exactly as the wire would (:func:`~streamd.eventlog.model.checked`);
the ``*_params`` methods take params already validated, decoded from the wire by
the JSON-RPC layer, so a request is validated once (params built in Python must
come from ``checked`` to be valid: a Struct's constructor skips its constraints).

Why ``apsw.aio`` and not ``trio.to_thread``
-------------------------------------------
Both keep SQLite off the event loop. APSW's Trio controller gives each connection
its own worker thread and honours Trio cancellation and deadlines (a queued call is
skipped, a running statement is interrupted); ``to_thread.run_sync`` cannot
interrupt a running call. Measured on this machine (2 vCPU, ext4, APSW 3.54.1,
Trio 0.35, synchronous=FULL; medians of 5 interleaved rounds, each store call
dispatched from Trio; ``python bench/eventlog_bench.py --dispatch``)::

    per call                          inline*    to_thread    apsw.aio
    ping (one bounded read)           29 us       192 us       136 us
    since, one page of 100           433 us       808 us       614 us
    one append waited for alone      530 us       771 us       711 us
    64 concurrent appenders       12,400/s      9,200/s      9,700/s

    * inline blocks the event loop for the whole call: a baseline, not a choice.

apsw.aio costs 30 % less per call than ``to_thread`` on reads (its worker is
already waiting on a queue; ``to_thread`` hands each call to a pooled thread and
back) and is the only one of the two that can abandon or interrupt a call when
its caller is cancelled, so it is the dispatch used (``dispatch="aio"``) for the
reader. The writer's connection, under the same name, has a worker thread of its
own with the same cancellation rules, and commits a lone append (the agent loop's
case: one event, awaited, then the next) inline on the event loop thread,
sparing the two thread hops that were a third of its latency
(:mod:`~streamd.eventlog.sqlite.runner`). ``dispatch="thread"`` stays for
measurement and for backends whose drivers have no async mode;
``dispatch="inline"`` runs the store on the event loop thread and exists for
tests under Trio's mock clock, where a real thread would let the clock jump
while SQLite works.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import trio

from streamd.errors import RpcError, is_closed
from streamd.eventlog import dbtarget, retention
from streamd.eventlog.compaction import Compactor
from streamd.eventlog.lease import Lease, LeaseHost, new_holder_id
from streamd.eventlog.model import (
    DEFAULT_SINCE_LIMIT,
    DEFAULT_STALE_AFTER_MS,
    DEFAULT_WATCH_BUFFER_BYTES,
    DEFAULT_WATCH_INTERVAL,
    AppendBatchParams,
    AppendParams,
    AppendResult,
    Boot,
    BootRecentParams,
    BootRecordParams,
    BootUpdateParams,
    BranchesParams,
    CompactParams,
    CompactResult,
    Event,
    Filter,
    LatestSeqParams,
    LeaseInfo,
    LockAcquireParams,
    RetentionGetParams,
    RetentionPolicy,
    Session,
    SessionCreateParams,
    SessionDeleteParams,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionListResult,
    SessionsGetParams,
    SessionsResult,
    SessionWithEvents,
    SinceParams,
    SinceResult,
    StateDelta,
    StateGetParams,
    StateSnapshot,
    WatchParams,
    checked,
    to_us,
)
from streamd.eventlog.opener import Dispatch, Role, opener_for
from streamd.eventlog.sqlite import SqliteOptions
from streamd.eventlog.sqlite.runner import WriterRunner
from streamd.eventlog.store import (
    AppendGroup,
    Backend,
    ChangeSource,
    Runner,
    Synchronous,
    closed_error,
)
from streamd.eventlog.watch import Watch
from streamd.eventlog.watch_hub import SAFETY_POLL as SAFETY_POLL
from streamd.eventlog.watch_hub import WatchHub
from streamd.eventlog.writer import AppendOutcome as AppendOutcome
from streamd.eventlog.writer import EventLogStats as EventLogStats
from streamd.eventlog.writer import GroupCommitWriter

__all__ = [
    "DEFAULT_WATCH_INTERVAL",
    "EventLog",
    "EventLogStats",
    "resolve_db_path",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_RETENTION_INTERVAL = 600.0
"""Seconds between the background task's compactions (0: none). Each costs a
query when no app has a policy."""

CHECKPOINT_PAGES = 1000
"""WAL pages after which the log checkpoints (SQLite's own default threshold)."""
# How long close lets work already inside SQLite finish before interrupting it.
_CLOSE_GRACE = 0.5


def resolve_db_path(
    explicit: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None
) -> Path | str:
    """Where the log lives: an explicit path, else ``$STREAMD_DB``, else
    ``$XDG_STATE_HOME/streamd/events.db``; a PostgreSQL URL or connection
    string is returned as given (a ``str``). :func:`dbtarget.resolve
    <streamd.eventlog.dbtarget.resolve>` says the same with its kind and a
    safe description; this raises its :class:`~streamd.eventlog.dbtarget.DbTargetError`."""
    return dbtarget.resolve(explicit, env).target


class EventLog:
    """The durable event log, opened lazily on first use.

    ``async with EventLog(path) as log:`` creates no file; the database is opened
    (and created) by the first operation. ``path`` is read by
    :mod:`~streamd.eventlog.dbtarget` (a file, or PostgreSQL); a string it
    refuses raises its ``DbTargetError`` here. Only the default location has
    its directory created: a given file's directory must exist. Every method
    raises :class:`~streamd.errors.RpcError`; after :meth:`aclose` every method
    raises ``closed`` promptly.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        watch_interval: float = DEFAULT_WATCH_INTERVAL,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = 5000,
        watch_buffer: int = 1000,
        watch_buffer_bytes: int = DEFAULT_WATCH_BUFFER_BYTES,
        watch_stall_timeout: float = 30.0,
        max_batch: int = 512,
        wall_clock: Callable[[], float] = time.time,
        retention_interval: float = DEFAULT_RETENTION_INTERVAL,
        retention_bounds: retention.Bounds = retention.DEFAULT_BOUNDS,
        on_retention_step: retention.Observer | None = None,
        dispatch: Dispatch = "aio",
        open_backend: Callable[[Role], Awaitable[Runner]] | None = None,
        open_changes: Callable[[], AbstractAsyncContextManager[ChangeSource]] | None = None,
    ) -> None:
        if watch_interval <= 0 or watch_buffer < 1 or watch_buffer_bytes < 1 or max_batch < 1:
            raise ValueError(
                "watch_interval, watch_buffer, watch_buffer_bytes and max_batch must be positive"
            )
        self.target = dbtarget.resolve(path)
        """What the log is in (raises DbTargetError, a ValueError, for a
        string that names nothing served)."""
        self.path = self.target.target
        self.watch_interval = watch_interval
        self.stats = EventLogStats()
        self._options = SqliteOptions(synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        self._watch_buffer = watch_buffer
        self._watch_buffer_bytes = watch_buffer_bytes
        self._stall_timeout = watch_stall_timeout
        self._wall_clock = wall_clock
        self._retention_interval = retention_interval
        self._opener = opener_for(self.target, self._options, dispatch, watch_interval)
        self._open_backend = open_backend or self._opener.open
        self._open_changes = open_changes or (
            lambda: self._opener.changes(lambda: self._read(lambda store: store.newest_seq()))
        )

        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None
        self._open_lock = trio.Lock()
        self._writer: Runner | None = None
        self._reader: Runner | None = None
        self._checkpointing = False
        self._closed = False
        self._close_done = trio.Event()
        self._op_scopes: set[trio.CancelScope] = set()

        self._hub = WatchHub(
            reader=self._open_reader,
            open_changes=self._open_changes,
            watch_interval=watch_interval,
            capacity=watch_buffer,
            budget_bytes=watch_buffer_bytes,
            stall_timeout=watch_stall_timeout,
            log_closed=lambda: self._closed,
        )
        self._appends = GroupCommitWriter(
            max_batch=max_batch,
            hub=self._hub,
            stats=self.stats,
            now_us=self._now_us,
            open_log=self._ensure_open,
            log_closed=lambda: self._closed,
            cancelled_by_close=self._cancelled_by_close,
            after_commit=self._checkpoint_if_due,
        )
        self._compactor = Compactor(
            target=self.target,
            read=self._read,
            write=self._write,
            now_us=self._now_us,
            keep_after_seq=self._hub.oldest_position,
            bounds=retention_bounds,
            observer=on_retention_step,
        )

        self._leases: dict[str, Lease] = {}
        self._lease_host = LeaseHost(
            write=self._write,
            now_us=self._now_us,
            closed=lambda: self._closed,
            forget=self._forget_lease,
        )

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
    def fault(self) -> str | None:
        """Why the log has stopped serving for good, if it has: its database
        file was deleted or replaced under it (see
        :mod:`~streamd.eventlog.sqlite.file_identity`). A restart is the recovery."""
        return self._opener.fault

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
        self._hub.stop_reading()
        leases = list(self._leases.values())
        for lease in leases:
            lease.stop_heartbeat()
        self._appends.close_queue()
        async with self._open_lock:
            pass  # an open in progress finishes, so its connections get closed too
        await self._appends.finish(_CLOSE_GRACE, self._interrupt)
        if self._writer is not None and leases:
            # Release what we hold so another process need not wait for
            # staleness; bounded, a wedged database must not hang close.
            with trio.move_on_after(_CLOSE_GRACE):
                for lease in leases:
                    try:
                        await self._writer.run(lease.release_op())
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

    @property
    def where(self) -> str:
        """The database in words, for messages and logs: never a secret."""
        return self.target.description

    async def _ensure_open(self) -> tuple[Runner, Runner]:
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
                self._appends.start(self._nursery, writer)
                if self._retention_interval > 0:
                    self._nursery.start_soon(self._compactor.run, self._retention_interval)
            if self._closed:
                raise closed_error()
        assert self._writer is not None and self._reader is not None
        return self._writer, self._reader

    async def _call(self, role: Role, op: Callable[[Backend], _T]) -> _T:
        """Run one store operation; if close interrupts it, raise ``closed``."""
        if self._closed:
            raise closed_error()
        scope = trio.CancelScope()
        self._op_scopes.add(scope)
        try:
            with scope:
                writer, reader = await self._ensure_open()
                return await (writer if role == "writer" else reader).run(op)
        finally:
            self._op_scopes.discard(scope)
        raise closed_error()

    @contextmanager
    def _cancelled_by_close(self) -> Iterator[trio.CancelScope]:
        """A scope that close cancels (a wait that must not outlive the log)."""
        scope = trio.CancelScope()
        self._op_scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._op_scopes.discard(scope)

    async def _read(self, op: Callable[[Backend], _T]) -> _T:
        return await self._call("reader", op)

    async def _write(self, op: Callable[[Backend], _T]) -> _T:
        try:
            return await self._call("writer", op)
        finally:
            # Not only appends fill the WAL: creates, state writes, heartbeats
            # and compaction's deletes do too, and the writer leaves every
            # checkpoint to this log.
            if self._writer is not None:
                self._checkpoint_if_due(self._writer)

    def _now_us(self) -> int:
        return int(self._wall_clock() * 1_000_000)

    # -- appends --

    async def append(
        self,
        app: str,
        user: str,
        session: str,
        event: Event,
        metadata: dict[str, str] | None = None,
        *,
        state_delta: StateDelta | None = None,
        expected_seq: int | None = None,
    ) -> AppendResult:
        """Append one event; returns its seq (and ``duplicate`` for a safe retry).

        ``state_delta`` is applied to the app's, user's and session's state in
        the same transaction as the event. ``expected_seq`` (the session's
        ``last_seq`` as the caller saw it) refuses the append with
        ``stale_session`` if the session moved on. The result is returned only
        after the transaction holding the event has committed (durable per the
        ``synchronous`` setting).
        """
        return await self.append_params(
            checked(
                AppendParams,
                app=app,
                user=user,
                session=session,
                event=event,
                metadata=metadata,
                state_delta=state_delta,
                expected_seq=expected_seq,
            )
        )

    async def append_params(self, params: AppendParams) -> AppendResult:
        """:meth:`append` for already-validated params (the JSON-RPC path)."""
        outcome = await self._appends.append(params)
        assert isinstance(outcome, AppendResult)
        return outcome

    async def append_batch(self, appends: Sequence[AppendParams]) -> list[AppendResult]:
        """Append in order, in one transaction, all or none (see
        :class:`~streamd.eventlog.model.AppendBatchParams`); it shares the group
        commit with every other append, as one unit."""
        return await self.append_batch_params(checked(AppendBatchParams, appends=list(appends)))

    async def append_batch_params(self, p: AppendBatchParams) -> list[AppendResult]:
        outcome = await self._appends.append(AppendGroup(p.appends))
        assert isinstance(outcome, list)
        return outcome

    def submit_append(
        self,
        params: AppendParams | AppendBatchParams,
        on_done: Callable[[AppendOutcome], None],
    ) -> None:
        """Queue an append (or a batch) without waiting: ``on_done`` is called
        exactly once, on the event loop, with its outcome, after the commit that
        holds it (or with the error that kept it out). For callers that cannot
        cancel an append once sent and would otherwise pay a task, a cancel
        scope and an event per append just to wait: the JSON-RPC layer."""
        self._appends.submit(params, on_done, self._nursery)

    def _checkpoint_if_due(self, writer: Runner) -> None:
        """Once the writer's WAL holds :data:`CHECKPOINT_PAGES`, copy it into
        the database in the background, one checkpoint at a time, the bulk
        from the reader's connection (see :mod:`~streamd.eventlog.sqlite.runner`)."""
        if (
            isinstance(writer, WriterRunner)
            and writer.wal_pages >= CHECKPOINT_PAGES
            and not self._checkpointing
            and not self._closed
            and self._nursery is not None
        ):
            self._checkpointing = True
            self._nursery.start_soon(self._checkpoint)

    async def _checkpoint(self) -> None:
        try:
            # The bulk beside the writes, then what they added meanwhile
            # (a few pages) on the writer itself, between two of its
            # transactions: SQLite starts the WAL over only at a write that
            # finds all of it copied, which a checkpoint racing the writes
            # never leaves behind.
            await self._read(lambda store: store.checkpoint_passive())  # type: ignore[attr-defined]
            await self._write(lambda store: store.checkpoint_passive())  # type: ignore[attr-defined]
            self.stats.checkpoints += 1
        except RpcError as exc:
            if not is_closed(exc):
                logger.warning("checkpointing the event log: %s", exc)
        finally:
            self._checkpointing = False

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
        return await self.since_params(
            p, raw_content=raw_content, max_bytes=max_bytes, encoded=encoded
        )

    async def since_params(
        self,
        p: SinceParams,
        *,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SinceResult:
        return await self._read(
            lambda store: store.since(
                p.from_seq, p.filter, p.limit, raw_content, max_bytes, encoded
            )
        )

    async def latest_seq(self, filter: Filter | None = None) -> int:
        """The newest matching seq, 0 when nothing matches."""
        return await self.latest_seq_params(checked(LatestSeqParams, filter=filter))

    async def latest_seq_params(self, p: LatestSeqParams) -> int:
        return await self._read(lambda store: store.latest_seq(p.filter))

    async def nth_newest_seq(self, offset: int, filter: Filter | None = None) -> int:
        """The seq ``offset`` entries behind the newest match (0 = the newest), 0
        when fewer match. Watching from the entry before it replays the last
        ``offset + 1`` matches, as ``tail -n`` does."""
        p = checked(LatestSeqParams, filter=filter)
        return await self._read(lambda store: store.nth_newest_seq(p.filter, offset))

    async def branches(self, filter: Filter | None = None, limit: int | None = None) -> list[str]:
        """Distinct non-empty branch labels under the filter, sorted ascending."""
        return await self.branches_params(checked(BranchesParams, filter=filter, limit=limit))

    async def branches_params(self, p: BranchesParams) -> list[str]:
        return await self._read(lambda store: store.branches(p.filter, p.limit))

    def watch(
        self,
        from_seq: int = 0,
        filter: Filter | None = None,
        *,
        buffer_bytes: int | None = None,
    ) -> Watch:
        """Follow the log from ``from_seq``: see :class:`~streamd.eventlog.watch.Watch`.
        ``buffer_bytes`` overrides the log's ``watch_buffer_bytes`` for this
        watch (the JSON-RPC watch reads ahead less, because the connection holds
        the rest)."""
        self._check_watchable(buffer_bytes)
        p = checked(WatchParams, from_seq=from_seq, filter=filter)
        return self.watch_params(p, buffer_bytes=buffer_bytes)

    def watch_params(self, p: WatchParams, *, buffer_bytes: int | None = None) -> Watch:
        self._check_watchable(buffer_bytes)
        assert self._nursery is not None
        return self._hub.watch(p, self._nursery, buffer_bytes)

    def _check_watchable(self, buffer_bytes: int | None) -> None:
        if self._closed:
            raise closed_error()
        if self._nursery is None:
            raise RuntimeError("use the EventLog as `async with EventLog(...) as log:`")
        if buffer_bytes is not None and buffer_bytes < 1:
            raise ValueError("buffer_bytes must be positive")

    async def _open_reader(self) -> Runner:
        _, reader = await self._ensure_open()
        return reader

    # -- sessions --

    async def create_session(
        self,
        app: str,
        user: str,
        session: str | None = None,
        state: dict[str, Any] | None = None,
        *,
        app_state: dict[str, Any] | None = None,
        user_state: dict[str, Any] | None = None,
    ) -> Session:
        """Create a session (an id is generated when none is given) with its own
        ``state``, merging ``app_state`` and ``user_state`` into the state its
        app and user share; creating one that exists is invalid_params (data
        ``reason: "session_exists"``)."""
        return await self.create_session_params(
            checked(
                SessionCreateParams,
                app=app,
                user=user,
                session=session,
                state=state,
                app_state=app_state,
                user_state=user_state,
            )
        )

    async def create_session_params(self, p: SessionCreateParams) -> Session:
        now_us = self._now_us()
        return await self._write(
            lambda store: store.create_session(
                p.app, p.user, p.session, p.state, now_us, p.app_state, p.user_state
            )
        )

    async def get_session(
        self,
        app: str,
        user: str,
        session: str,
        after_seq: int = 0,
        recent: int | None = None,
        *,
        after_time: _dt.datetime | None = None,
        scoped_state: bool = False,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SessionWithEvents:
        """The session with its events; ``session_not_found`` if never written.

        ``after_seq``, ``after_time`` and ``recent`` bound the events (see
        :class:`~streamd.eventlog.model.SessionGetParams`); ``scoped_state``
        adds the app's and the user's state. ``raw_content``, ``max_bytes``
        and ``encoded`` as for :meth:`since`; an answer cut by ``max_bytes`` is
        ``truncated`` and continues after its ``next_seq``."""
        p = checked(
            SessionGetParams,
            app=app,
            user=user,
            session=session,
            after_seq=after_seq,
            recent=recent,
            after_time=after_time,
            scoped_state=scoped_state,
        )
        return await self.get_session_params(
            p, raw_content=raw_content, max_bytes=max_bytes, encoded=encoded
        )

    async def get_session_params(
        self,
        p: SessionGetParams,
        *,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SessionWithEvents:
        after_time_us = None if p.after_time is None else to_us(p.after_time)
        return await self._read(
            lambda store: store.get_session(
                p.app,
                p.user,
                p.session,
                p.after_seq,
                p.recent,
                raw_content,
                max_bytes,
                encoded,
                p.scoped_state,
                after_time_us,
                p.content,
            )
        )

    async def get_sessions(
        self,
        app: str,
        sessions: Sequence[SessionKey | tuple[str, str]],
        *,
        recent: int | None = None,
        after_time: _dt.datetime | None = None,
        scoped_state: bool = False,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SessionsResult:
        """Many sessions of one app with their events, in one snapshot; keys
        are :class:`SessionKey` or ``(user, session)`` pairs."""
        keys = [
            k if isinstance(k, SessionKey) else SessionKey(user=k[0], session=k[1])
            for k in sessions
        ]
        p = checked(
            SessionsGetParams,
            app=app,
            sessions=keys,
            recent=recent,
            after_time=after_time,
            scoped_state=scoped_state,
        )
        return await self.get_sessions_params(
            p, raw_content=raw_content, max_bytes=max_bytes, encoded=encoded
        )

    async def get_sessions_params(
        self,
        p: SessionsGetParams,
        *,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SessionsResult:
        after_time_us = None if p.after_time is None else to_us(p.after_time)
        return await self._read(
            lambda store: store.get_sessions(
                p.app,
                p.sessions,
                p.recent,
                after_time_us,
                raw_content,
                max_bytes,
                encoded,
                p.scoped_state,
            )
        )

    async def list_sessions(self, app: str, user: str | None = None) -> list[Session]:
        """Every session of the app (of one user), without events, in
        ``(user, session)`` order; for a bounded read, :meth:`list_sessions_page`."""
        p = checked(SessionListParams, app=app, user=user)
        return await self._read(lambda store: store.list_sessions(p.app, p.user))

    async def list_sessions_page(
        self,
        app: str,
        user: str | None = None,
        *,
        limit: int = DEFAULT_SINCE_LIMIT,
        after: SessionKey | None = None,
        scoped_state: bool = False,
    ) -> SessionListResult:
        """One page of sessions after ``after`` (the previous page's ``next``)."""
        return await self.list_sessions_params(
            checked(
                SessionListParams,
                app=app,
                user=user,
                limit=limit,
                after=after,
                scoped_state=scoped_state,
            )
        )

    async def list_sessions_params(self, p: SessionListParams) -> SessionListResult:
        return await self._read(
            lambda store: store.list_sessions_page(
                p.app, p.user, p.limit, p.after, p.scoped_state
            )
        )

    async def delete_session(self, app: str, user: str, session: str) -> None:
        """Delete a session and its events (idempotent)."""
        await self.delete_session_params(
            checked(SessionDeleteParams, app=app, user=user, session=session)
        )

    async def delete_session_params(self, p: SessionDeleteParams) -> None:
        await self._write(lambda store: store.delete_session(p.app, p.user, p.session))

    # -- state --

    async def get_state(
        self,
        app: str,
        user: str | None = None,
        session: str | None = None,
        *,
        as_of_seq: int | None = None,
    ) -> StateSnapshot:
        """The app's state, and the user's and the session's when named:
        current, or as of ``as_of_seq`` (the state when that seq was the
        newest). One snapshot, so the scopes agree with each other."""
        return await self.get_state_params(
            checked(StateGetParams, app=app, user=user, session=session, as_of_seq=as_of_seq)
        )

    async def get_state_params(self, p: StateGetParams) -> StateSnapshot:
        return await self._read(
            lambda store: store.get_state(p.app, p.user, p.session, p.as_of_seq)
        )

    # -- retention --

    async def set_retention(
        self,
        app: str,
        *,
        max_age_s: int | None = None,
        max_events: int | None = None,
        idle_s: int | None = None,
    ) -> None:
        """Set the app's retention policy (none of the limits: remove it). It is
        applied by :meth:`compact` and by the background task."""
        await self.set_retention_params(
            checked(RetentionPolicy, app=app, max_age_s=max_age_s, max_events=max_events,
                    idle_s=idle_s)
        )

    async def set_retention_params(self, p: RetentionPolicy) -> None:
        now_us = self._now_us()
        await self._write(lambda store: store.set_retention(p, now_us))

    async def retention(self, app: str | None = None) -> list[RetentionPolicy]:
        return await self.retention_params(checked(RetentionGetParams, app=app))

    async def retention_params(self, p: RetentionGetParams) -> list[RetentionPolicy]:
        return await self._read(lambda store: store.retention_policies(p.app))

    async def compact(
        self,
        app: str | None = None,
        *,
        vacuum: Literal["incremental", "full", "none"] = "incremental",
    ) -> CompactResult:
        """Apply the retention policies (of one app, or all) and give the space
        back; see :class:`~streamd.eventlog.model.CompactParams`."""
        return await self.compact_params(checked(CompactParams, app=app, vacuum=vacuum))

    async def compact_params(self, p: CompactParams) -> CompactResult:
        """See :mod:`~streamd.eventlog.compaction` for the rules kept."""
        return await self._compactor.compact(p)

    @property
    def last_compaction(self) -> CompactResult | None:
        """What the latest compaction (background or asked for) did."""
        return self._compactor.last

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
        return await self.acquire_lock_params(p, nursery=nursery, on_lost=on_lost)

    async def acquire_lock_params(
        self,
        p: LockAcquireParams,
        *,
        nursery: trio.Nursery | None = None,
        on_lost: Callable[[Lease], Awaitable[None]] | None = None,
    ) -> Lease:
        holder, now_us = new_holder_id(), self._now_us()
        await self._write(
            lambda store: store.acquire_lease(
                p.app, p.user, p.session, holder, p.stale_after_ms, now_us
            )
        )
        lease = Lease(
            self._lease_host,
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
                nursery.start_soon(lease.keep_alive)
            else:
                assert self._nursery is not None  # the store call above needed it
                self._nursery.start_soon(self._keep_alive, lease)
        except BaseException:
            await lease.release()
            raise
        return lease

    async def _keep_alive(self, lease: Lease) -> None:
        try:
            await lease.keep_alive()
        except Exception:
            # This task lives in the log's nursery: a failing on_lost must not
            # take down every client of the log.
            logger.exception("lease %s: on_lost failed", lease.lock)

    def _forget_lease(self, lease: Lease) -> None:
        self._leases.pop(lease.lock, None)

    async def release_lock(self, lock: str) -> None:
        """Release by lock id; unknown or already released ids are fine."""
        if self._closed:
            raise closed_error()
        lease = self._leases.get(lock)
        if lease is not None:
            await lease.release()

    def lease(self, lock: str) -> Lease | None:
        return self._leases.get(lock)

    async def list_locks(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        return await self._read(lambda store: store.list_leases(app, user))

    # -- boots --

    async def record_boot(self, at: _dt.datetime, attempted: Sequence[str]) -> int:
        return await self.record_boot_params(
            checked(BootRecordParams, at=at, attempted=list(attempted))
        )

    async def record_boot_params(self, p: BootRecordParams) -> int:
        at_us = to_us(p.at)
        return await self._write(lambda store: store.record_boot(at_us, p.attempted))

    async def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None:
        """Rewrite a boot's attempted list; an unknown id is invalid_params."""
        await self.update_boot_params(
            checked(BootUpdateParams, id=boot_id, attempted=list(attempted))
        )

    async def update_boot_params(self, p: BootUpdateParams) -> None:
        await self._write(lambda store: store.update_boot(p.id, p.attempted))

    async def recent_boots(self, since: _dt.datetime) -> list[Boot]:
        """Boots at or after ``since``, oldest first."""
        return await self.recent_boots_params(checked(BootRecentParams, since=since))

    async def recent_boots_params(self, p: BootRecentParams) -> list[Boot]:
        since_us = to_us(p.since)
        return await self._read(lambda store: store.recent_boots(since_us))

    # -- health --

    async def ping(self) -> None:
        """Succeeds only after a real, bounded read of the log."""
        await self._read(lambda store: store.ping())

    async def synchronous_level(self) -> int:
        """The writer's ``PRAGMA synchronous`` (2 = FULL, 1 = NORMAL)."""
        return await self._write(lambda store: store.synchronous())
