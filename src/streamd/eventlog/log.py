"""The Trio layer: :class:`EventLog`, a typed async API over a storage backend.

This module composes the log's jobs and owns its life cycle; every storage
rule lives in the store and every job in its own module:

* **The connections** (:mod:`~streamd.eventlog.connections`): the writer's and
  the reader's, opened by the first operation (the one place "not open yet" is
  answered), each running one store call at a time in a scope close cancels.
* **The group-commit writer** (:mod:`~streamd.eventlog.writer`) owns appends.
  Callers queue an append and wait; the writer takes everything queued,
  commits it in one transaction, then acknowledges each caller. No caller is
  acknowledged before the commit that holds its event, and while one batch is
  being fsynced the next one gathers, so under load many appends share one
  fsync without any added delay when idle. A caller cancelled while waiting
  may still have its event committed; a retry with the same event id is
  answered ``duplicate: true``.
* **The watch hub** (:mod:`~streamd.eventlog.watch_hub`): one producer per
  watch, reading history through the reader's connection. A caught-up watch is
  fed in memory by the writer's :class:`~streamd.eventlog.fanout.Fanout` and
  reads the store again only when it fell behind or another process
  committed, which a change source notices (inotify or a poll, confirmed by
  the newest seq); it runs only while someone watches.
* **Leases** (:class:`~streamd.eventlog.lease.LeaseKeeper`): one heartbeat task
  per lease, in the log's nursery or one the caller supplies.
* **Retention** (:mod:`~streamd.eventlog.compaction`) every
  ``retention_interval`` seconds and on :meth:`EventLog.compact`, each step its
  own short write bounded by rows, so appends interleave; it removes nothing
  after the oldest position of an open watch.
* **WAL checkpoints** (:mod:`~streamd.eventlog.sqlite.checkpoints`), from the
  reader's connection beside the writes.
* **Close** cancels every in-flight operation, which then raises ``closed``; the
  writer finishes the batch it is committing (so its callers learn the truth)
  and fails the rest as never written; leases are released; connections close.

Two ways in: the keyword methods here (``since(from_seq, filter, limit)``)
validate their values exactly as the wire would
(:func:`~streamd.eventlog.model.checked`) and pass the params Struct whole to
:attr:`EventLog.requests` (:class:`~streamd.eventlog.requests.LogRequests`),
which the JSON-RPC layer calls directly with the Struct it decoded, so a
request is validated once. Why the connections are dispatched through
``apsw.aio`` and not ``trio.to_thread``: see the design notes in the docs.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Literal

import trio

from streamd.eventlog import dbtarget, retention
from streamd.eventlog.compaction import Compactor
from streamd.eventlog.connections import Connections
from streamd.eventlog.lease import Lease, LeaseKeeper
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
    LeaseAcquireParams,
    LeaseInfo,
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
)
from streamd.eventlog.opener import Dispatch, Role, opener_for
from streamd.eventlog.requests import LogRequests
from streamd.eventlog.sqlite import SqliteOptions
from streamd.eventlog.sqlite.checkpoints import CHECKPOINT_PAGES as CHECKPOINT_PAGES
from streamd.eventlog.sqlite.checkpoints import Checkpoints
from streamd.eventlog.store import ChangeSource, ReadShape, Runner, Synchronous, closed_error
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

DEFAULT_RETENTION_INTERVAL = 600.0
"""Seconds between the background task's compactions (0: none). Each costs a
query when no app has a policy."""

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
        self._watch_buffer_bytes = watch_buffer_bytes
        self._stall_timeout = watch_stall_timeout
        self._wall_clock = wall_clock
        self._retention_interval = retention_interval
        options = SqliteOptions(synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        self._opener = opener_for(self.target, options, dispatch, watch_interval)
        self._nursery_cm: Any = None
        self._close_done = trio.Event()

        self.connections = conns = Connections(
            open_backend or self._opener.open,
            on_open=self._start_jobs,
            after_write=lambda writer: self.checkpoints.due(writer),
        )
        """The writer's and the reader's connection (for diagnostics and tests:
        a store call run here is outside every rule of the log)."""
        self.checkpoints = Checkpoints(
            read=conns.read,
            write=conns.write,
            nursery=lambda: conns.nursery,
            closed=lambda: conns.closed,
            stats=self.stats,
        )
        self._hub = WatchHub(
            reader=conns.open_reader,
            open_changes=open_changes
            or (lambda: self._opener.changes(lambda: conns.read(lambda store: store.newest_seq()))),
            watch_interval=watch_interval,
            capacity=watch_buffer,
            budget_bytes=watch_buffer_bytes,
            stall_timeout=watch_stall_timeout,
            log_closed=lambda: conns.closed,
        )
        self._appends = GroupCommitWriter(
            max_batch=max_batch,
            hub=self._hub,
            stats=self.stats,
            now_us=self._now_us,
            open_log=conns.ensure_open,
            log_closed=lambda: conns.closed,
            cancelled_by_close=conns.cancelled_by_close,
            after_commit=self.checkpoints.due,
        )
        self._compactor = Compactor(
            target=self.target,
            read=conns.read,
            write=conns.write,
            now_us=self._now_us,
            keep_after_seq=self._hub.oldest_position,
            bounds=retention_bounds,
            observer=on_retention_step,
        )
        self._leases = LeaseKeeper(
            write=conns.write, now_us=self._now_us, closed=lambda: conns.closed
        )
        self.requests = LogRequests(
            connections=conns,
            appends=self._appends,
            hub=self._hub,
            compactor=self._compactor,
            leases=self._leases,
            now_us=self._now_us,
        )
        """Every operation by its params Struct, already validated: the
        JSON-RPC layer's way in (see :mod:`~streamd.eventlog.requests`)."""

    def _start_jobs(self, nursery: trio.Nursery, writer: Runner) -> None:
        self._appends.start(nursery, writer)
        if self._retention_interval > 0:
            nursery.start_soon(self._compactor.run, self._retention_interval)

    def _now_us(self) -> int:
        return int(self._wall_clock() * 1_000_000)

    # -- lifecycle --

    async def __aenter__(self) -> EventLog:
        self._nursery_cm = trio.open_nursery()
        self.connections.serve_in(await self._nursery_cm.__aenter__())
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        try:
            await self.aclose()
        finally:
            self.connections.nursery.cancel_scope.cancel()
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
        return self.connections.closed

    @property
    def fault(self) -> str | None:
        """Why the log has stopped serving for good, if it has: its database
        file was deleted or replaced under it (see
        :mod:`~streamd.eventlog.sqlite.file_identity`). A restart is the recovery."""
        return self._opener.fault

    @property
    def opened(self) -> bool:
        """Whether the database has been opened (it is opened by the first call)."""
        return self.connections.opened

    @property
    def where(self) -> str:
        """The database in words, for messages and logs: never a secret."""
        return self.target.description

    async def aclose(self) -> None:
        """Close promptly; see the module docstring for what happens to work in
        flight. Safe to call more than once."""
        if self.connections.closed:
            with trio.CancelScope(shield=True):
                await self._close_done.wait()
            return
        # Shielded: closing must finish even when the caller is being cancelled,
        # or the connections' worker threads would keep the process alive.
        with trio.CancelScope(shield=True):
            try:
                await self._close()
            finally:
                self._close_done.set()

    async def _close(self) -> None:
        conns = self.connections
        conns.begin_close()
        self._hub.stop_reading()
        leases = self._leases.stop_heartbeats()
        self._appends.close_queue()
        await conns.opening_done()
        await self._appends.finish(_CLOSE_GRACE, conns.interrupt)
        if conns.writer is not None and leases:
            await self._leases.release_at_close(leases, conns.writer, _CLOSE_GRACE)
        # Every caller has been answered; whatever a connection is still doing
        # (a cancelled call waiting on a lock) is abandoned, not waited out.
        await conns.aclose()

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
        return await self.requests.append(
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

    async def append_batch(self, appends: Sequence[AppendParams]) -> list[AppendResult]:
        """Append in order, in one transaction, all or none (see
        :class:`~streamd.eventlog.model.AppendBatchParams`); it shares the group
        commit with every other append, as one unit."""
        return await self.requests.append_batch(checked(AppendBatchParams, appends=list(appends)))

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
        self.requests.submit_append(params, on_done)

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
        only write them out; everyone else gets decoded values. ``max_bytes``
        also ends the page before its entries pass that many bytes on the wire
        (at least one entry; ``caught_up`` is then false). The three are one
        :class:`~streamd.eventlog.store.ReadShape` inside."""
        return await self.requests.since(
            checked(SinceParams, from_seq=from_seq, filter=filter, limit=limit),
            ReadShape.of(raw_content=raw_content, encoded=encoded, max_bytes=max_bytes),
        )

    async def latest_seq(self, filter: Filter | None = None) -> int:
        """The newest matching seq, 0 when nothing matches."""
        return await self.requests.latest_seq(checked(LatestSeqParams, filter=filter))

    async def nth_newest_seq(self, offset: int, filter: Filter | None = None) -> int:
        """The seq ``offset`` entries behind the newest match (0 = the newest), 0
        when fewer match. Watching from the entry before it replays the last
        ``offset + 1`` matches, as ``tail -n`` does."""
        return await self.requests.nth_newest_seq(checked(LatestSeqParams, filter=filter), offset)

    async def branches(self, filter: Filter | None = None, limit: int | None = None) -> list[str]:
        """Distinct non-empty branch labels under the filter, sorted ascending."""
        return await self.requests.branches(checked(BranchesParams, filter=filter, limit=limit))

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
        self.connections.check_open()
        p = checked(WatchParams, from_seq=from_seq, filter=filter)
        return self.requests.watch(p, buffer_bytes)

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
        return await self.requests.create_session(
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
        return await self.requests.get_session(
            p, ReadShape.of(raw_content=raw_content, encoded=encoded, max_bytes=max_bytes)
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
        return await self.requests.get_sessions(
            p, ReadShape.of(raw_content=raw_content, encoded=encoded, max_bytes=max_bytes)
        )

    async def list_sessions(self, app: str, user: str | None = None) -> list[Session]:
        """Every session of the app (of one user), without events, in
        ``(user, session)`` order; for a bounded read, :meth:`list_sessions_page`."""
        return await self.requests.list_sessions(checked(SessionListParams, app=app, user=user))

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
        return await self.requests.list_sessions_page(
            checked(
                SessionListParams,
                app=app,
                user=user,
                limit=limit,
                after=after,
                scoped_state=scoped_state,
            )
        )

    async def delete_session(self, app: str, user: str, session: str) -> None:
        """Delete a session and its events (idempotent)."""
        await self.requests.delete_session(
            checked(SessionDeleteParams, app=app, user=user, session=session)
        )

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
        return await self.requests.get_state(
            checked(StateGetParams, app=app, user=user, session=session, as_of_seq=as_of_seq)
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
        await self.requests.set_retention(
            checked(
                RetentionPolicy, app=app, max_age_s=max_age_s, max_events=max_events, idle_s=idle_s
            )
        )

    async def retention(self, app: str | None = None) -> list[RetentionPolicy]:
        return await self.requests.retention(checked(RetentionGetParams, app=app))

    async def compact(
        self,
        app: str | None = None,
        *,
        vacuum: Literal["incremental", "full", "none"] = "incremental",
    ) -> CompactResult:
        """Apply the retention policies (of one app, or all) and give the space
        back; see :class:`~streamd.eventlog.model.CompactParams`."""
        return await self.requests.compact(checked(CompactParams, app=app, vacuum=vacuum))

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
        :class:`~streamd.eventlog.model.LeaseAcquireParams` for the floors).
        Raises ``session_locked`` (data: holder, heartbeat_age_ms) while the
        current holder's heartbeat is fresher than the window *that holder*
        declared; a staler lease is stolen. Leases are not re-entrant: a second
        acquire of a held session is ``session_locked`` even from the same
        process.
        """
        p = checked(
            LeaseAcquireParams,
            app=app,
            user=user,
            session=session,
            stale_after_ms=stale_after_ms,
            heartbeat_ms=heartbeat_ms,
        )
        return await self.requests.acquire_lock(p, nursery=nursery, on_lost=on_lost)

    async def release_lock(self, lock: str) -> None:
        """Release by lock id; unknown or already released ids are fine."""
        if self.connections.closed:
            raise closed_error()
        await self._leases.release(lock)

    def lease(self, lock: str) -> Lease | None:
        return self._leases.get(lock)

    async def list_locks(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        return await self.connections.read(lambda store: store.list_leases(app, user))

    # -- boots --

    async def record_boot(self, at: _dt.datetime, attempted: Sequence[str]) -> int:
        return await self.requests.record_boot(
            checked(BootRecordParams, at=at, attempted=list(attempted))
        )

    async def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None:
        """Rewrite a boot's attempted list; an unknown id is invalid_params."""
        await self.requests.update_boot(
            checked(BootUpdateParams, id=boot_id, attempted=list(attempted))
        )

    async def recent_boots(self, since: _dt.datetime) -> list[Boot]:
        """Boots at or after ``since``, oldest first."""
        return await self.requests.recent_boots(checked(BootRecentParams, since=since))

    # -- health --

    async def ping(self) -> None:
        """Succeeds only after a real, bounded read of the log."""
        await self.connections.read(lambda store: store.ping())

    async def synchronous_level(self) -> int:
        """The writer's ``PRAGMA synchronous`` (2 = FULL, 1 = NORMAL)."""
        return await self.connections.write(lambda store: store.synchronous())
