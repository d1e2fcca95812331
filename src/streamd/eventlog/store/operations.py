"""The :class:`~streamd.eventlog.store.backend.Backend` operations both
backends answer alike, written once over :class:`~streamd.eventlog.store.sql.Sql`.

A backend subclasses :class:`SqlOperations` and gives it one method,
:meth:`SqlOperations._call`: its storage boundary, which runs a rule on its
connection (as :class:`Sql`) and translates whatever its driver raises into
an :class:`~streamd.errors.RpcError`. What stays in the backend is what truly
differs: how seq is numbered and the batch write, connection lifecycle and
setup, change notification, error translation, and its own maintenance
(vacuum, checkpoints, query plans).

Each operation taking text is :func:`~streamd.eventlog.store.storable.checked_texts`:
a text no database can store (a lone surrogate) is refused with -32602 here,
once for every backend, before the driver meets it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from streamd.errors import RpcError
from streamd.eventlog.model import (
    AppendParams,
    AppendResult,
    Boot,
    BootRecentResult,
    Filter,
    LeaseAcquireParams,
    LeaseInfo,
    RetentionPolicy,
    Session,
    SessionCreateParams,
    SessionGetParams,
    SessionListParams,
    SessionListResult,
    SessionsGetParams,
    SessionsResult,
    SessionWithEvents,
    SinceParams,
    SinceResult,
    StateSnapshot,
)
from streamd.eventlog.store import boots, branches, leases, reads, retention, sessions, state
from streamd.eventlog.store.backend import (
    DECODED,
    AppendGroup,
    CommitOutcome,
    Committed,
    EventRow,
    EventRows,
    LeaseKey,
    LeaseTime,
    ReadShape,
)
from streamd.eventlog.store.sql import Sql
from streamd.eventlog.store.steps import Bounds, KeepAfter, Step
from streamd.eventlog.store.storable import checked_texts

__all__ = ["SqlOperations"]

_T = TypeVar("_T")


class SqlOperations:
    """The shared half of a SQL backend (see the module docstring)."""

    def _call(self, op: Callable[[Sql], _T]) -> _T:
        """``op`` on this backend's connection, inside its storage boundary."""
        raise NotImplementedError

    # -- appends --

    def append_commit(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int, capture: bool
    ) -> CommitOutcome:
        """The batch write: the backend's own (how seq is numbered differs)."""
        raise NotImplementedError

    def append(self, params: AppendParams, now_us: int) -> AppendResult:
        result = self.append_batch([params], now_us)[0]
        if isinstance(result, RpcError):
            raise result
        assert isinstance(result, AppendResult)
        return result

    def append_batch(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int
    ) -> list[AppendResult | list[AppendResult] | RpcError]:
        """Write every append in one transaction; per-item outcomes in order.

        An event that conflicts (or that the database refuses) fails alone and
        the others still commit; an :class:`AppendGroup` fails whole at its
        first refusal. A fault of the transaction itself (I/O error, busy)
        fails the whole batch, because then nothing was written.
        """
        return self.append_commit(batch, now_us, capture=False).results

    # -- reads --

    def newest_seq(self) -> int:
        """The newest seq ever given and committed (deleted events still count)."""
        return self._call(lambda db: db.newest_seq())

    @checked_texts
    def since(self, p: SinceParams, shape: ReadShape = DECODED) -> SinceResult:
        return self._call(lambda db: reads.since(db, p, shape))

    @checked_texts
    def since_committed(
        self, from_seq: int, flt: Filter | None, limit: int, max_bytes: int
    ) -> tuple[list[Committed], bool]:
        return self._call(lambda db: reads.since_committed(db, from_seq, flt, limit, max_bytes))

    @checked_texts
    def latest_seq(self, flt: Filter | None) -> int:
        return self._call(lambda db: reads.latest_seq(db, flt))

    def event_rows(self, from_seq: int, limit: int) -> list[EventRow]:
        return self._call(lambda db: reads.event_rows(db, from_seq, limit))

    def event_page(self, from_seq: int, limit: int) -> EventRows:
        return self.event_rows(from_seq, limit)

    def event_rows_at(self, seqs: Sequence[int]) -> list[EventRow]:
        return self._call(lambda db: reads.event_rows_at(db, seqs))

    def removed_after(self, mark: int, limit: int) -> list[tuple[int, int]]:
        return self._call(lambda db: reads.removed_after(db, mark, limit))

    def newest_removal(self) -> tuple[int, int]:
        return self._call(lambda db: reads.newest_removal(db))

    @checked_texts
    def nth_newest_seq(self, flt: Filter | None, offset: int) -> int:
        return self._call(lambda db: reads.nth_newest_seq(db, flt, offset))

    @checked_texts
    def branches(self, flt: Filter | None, limit: int | None) -> list[str]:
        return self._call(lambda db: branches.branches(db, flt, limit))

    # -- sessions --

    @checked_texts
    def create_session(self, p: SessionCreateParams, now_us: int) -> Session:
        return self._call(lambda db: sessions.create_session(db, p, now_us))

    @checked_texts
    def get_session(self, p: SessionGetParams, shape: ReadShape = DECODED) -> SessionWithEvents:
        return self._call(lambda db: sessions.get_session(db, p, shape))

    @checked_texts
    def get_sessions(self, p: SessionsGetParams, shape: ReadShape = DECODED) -> SessionsResult:
        return self._call(lambda db: sessions.get_sessions(db, p, shape))

    @checked_texts
    def list_sessions(self, app: str, user: str | None) -> list[Session]:
        return self._call(lambda db: sessions.list_sessions(db, app, user))

    @checked_texts
    def list_sessions_page(self, p: SessionListParams) -> SessionListResult:
        return self._call(lambda db: sessions.list_sessions_page(db, p))

    @checked_texts
    def delete_session(self, app: str, user: str, session: str) -> None:
        self._call(lambda db: sessions.delete_session(db, app, user, session))

    # -- state --

    @checked_texts
    def get_state(
        self, app: str, user: str | None, session: str | None, as_of_seq: int | None
    ) -> StateSnapshot:
        return self._call(lambda db: state.get_state(db, app, user, session, as_of_seq))

    # -- retention --

    @checked_texts
    def set_retention(self, policy: RetentionPolicy, now_us: int) -> None:
        self._call(lambda db: retention.set_retention(db, policy, now_us))

    @checked_texts
    def retention_policies(self, app: str | None = None) -> list[RetentionPolicy]:
        return self._call(lambda db: retention.retention_policies(db, app))

    @checked_texts
    def leased_sessions(self, app: str, now_us: int) -> int:
        return self._call(lambda db: leases.leased_sessions(db, app, now_us))

    @checked_texts
    def drop_idle_sessions(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: KeepAfter,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        return self._call(
            lambda db: retention.drop_idle_sessions(
                db, app, cutoff_us, keep_after_seq, now_us, previous, bounds
            )
        )

    @checked_texts
    def drop_old_events(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: KeepAfter,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        return self._call(
            lambda db: retention.drop_old_events(
                db, app, cutoff_us, keep_after_seq, now_us, previous, bounds
            )
        )

    @checked_texts
    def trim_sessions(
        self,
        app: str,
        max_events: int,
        keep_after_seq: KeepAfter,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        return self._call(
            lambda db: retention.trim_sessions(
                db, app, max_events, keep_after_seq, now_us, previous, bounds
            )
        )

    # -- leases --

    @checked_texts
    def acquire_lease(self, p: LeaseAcquireParams, holder: str, now_us: LeaseTime) -> None:
        self._call(lambda db: leases.acquire(db, p, holder, now_us))

    @checked_texts
    def heartbeat_lease(
        self, app: str, user: str, session: str, holder: str, now_us: LeaseTime
    ) -> bool:
        return self._call(lambda db: leases.heartbeat(db, app, user, session, holder, now_us))

    @checked_texts
    def heartbeat_leases(self, beats: Sequence[LeaseKey], now_us: LeaseTime) -> list[bool]:
        return self._call(lambda db: leases.heartbeats(db, beats, now_us))

    @checked_texts
    def release_lease(self, app: str, user: str, session: str, holder: str) -> bool:
        return self._call(lambda db: leases.release(db, app, user, session, holder))

    @checked_texts
    def release_leases(self, keys: Sequence[LeaseKey]) -> int:
        return self._call(lambda db: leases.releases(db, keys))

    @checked_texts
    def list_leases(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        return self._call(lambda db: leases.listed(db, app, user))

    # -- boots --

    @checked_texts
    def record_boot(self, at_us: int, attempted: Sequence[str]) -> int:
        return self._call(lambda db: boots.record_boot(db, at_us, attempted))

    @checked_texts
    def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None:
        self._call(lambda db: boots.update_boot(db, boot_id, attempted))

    def recent_boots(self, since_us: int) -> list[Boot]:
        return self._call(lambda db: boots.recent_boots(db, since_us))

    def recent_boots_page(self, since_us: int, after: int | None) -> BootRecentResult:
        return self._call(lambda db: boots.recent_boots_page(db, since_us, after))
