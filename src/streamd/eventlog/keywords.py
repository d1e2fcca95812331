"""The event log's keyword API: each method validates its values as the wire would.

:class:`KeywordApi` is what a Python caller of
:class:`~streamd.eventlog.log.EventLog` writes (``log.append(app, user,
session, Event(...))``): each method builds its params Struct with
:func:`~streamd.eventlog.model.checked`, so a value the wire would refuse is
refused here with the same ``invalid_params``, and hands it whole, with the
read's :class:`~streamd.eventlog.store.ReadShape`, to the log's
:class:`~streamd.eventlog.requests.LogRequests`. The JSON-RPC layer skips this
face: it calls the requests with the Struct it decoded.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import trio

from streamd.eventlog.lease import Lease
from streamd.eventlog.model import (
    DEFAULT_SINCE_LIMIT,
    DEFAULT_STALE_AFTER_MS,
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
from streamd.eventlog.requests import LogRequests
from streamd.eventlog.store import ReadShape
from streamd.eventlog.watch import Watch
from streamd.eventlog.writer import AppendOutcome

__all__ = ["KeywordApi"]


class KeywordApi:
    """The keyword methods of the event log, over its :attr:`requests`."""

    requests: LogRequests

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
        await self.requests.ping()
