"""What the event log needs from storage, as three protocols: the seams every
backend folder (:mod:`streamd.eventlog.sqlite`, :mod:`streamd.eventlog.postgres`)
fills.

* :class:`Backend` is the storage operations and nothing else. Each method is
  synchronous and one unit of work (a write is one transaction), takes typed
  values and raises only :class:`~streamd.errors.RpcError`: a driver's own errors
  are translated inside the backend. Contract tests run every implementation
  through it (``tests/eventlog/test_store*.py``).
* :class:`Runner` is a backend as the Trio layer holds it: where its operations
  run (a connection's worker thread, a thread pool, or inline) and how close
  reaches them. ``await runner.run(lambda store: store.since(...))`` is a typed
  call of one operation; a runner decides how its driver meets Trio.
* :class:`ChangeSource` is how a backend hears that another process committed
  (inotify on SQLite's files, LISTEN/NOTIFY on PostgreSQL), for the watchers.

Once a backend is closed, or interrupted for close, every operation raises
:func:`closed_error`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

import msgspec

from streamd.errors import CLOSED, RpcError
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
from streamd.eventlog.store.steps import Bounds, KeepAfter, Step

__all__ = [
    "AppendGroup",
    "Backend",
    "ChangeSource",
    "CommitOutcome",
    "Committed",
    "EventRow",
    "LeaseKey",
    "LeaseTime",
    "ReadShape",
    "Role",
    "Runner",
    "Shape",
    "StoreCall",
    "Synchronous",
    "closed_error",
    "lease_time",
]

Synchronous = Literal["FULL", "NORMAL"]
"""How durable a commit is: FULL survives power loss, NORMAL a killed process."""

_T = TypeVar("_T")


Shape = Literal["decoded", "raw", "encoded", "committed"]
"""How read entries come back: content decoded; content as its stored JSON text
(``msgspec.Raw``); each whole entry as its JSON (``msgspec.Raw``), encoded
where it is measured against the reply budget anyway, so the JSON-RPC layer
only copies it; or as :class:`Committed`, the encoded entry with its seq and
the fields a filter reads (what a watch buffers)."""


@dataclass(frozen=True, slots=True)
class ReadShape:
    """How a read answers: its entries' :data:`Shape`, and at most how many
    bytes of them on the wire (at least one entry; the answer then says it was
    cut). One value, so a read's signature carries no loose booleans."""

    entries: Shape = "decoded"
    max_bytes: int | None = None

    @classmethod
    def of(
        cls, *, raw_content: bool = False, encoded: bool = False, max_bytes: int | None = None
    ) -> ReadShape:
        """The shape the keyword API's ``raw_content``/``encoded`` flags name."""
        return cls("encoded" if encoded else "raw" if raw_content else "decoded", max_bytes)


DECODED = ReadShape()


EventRow = tuple[int, str, str, str, str, str, str, str, int, str, str | None]
"""One event as an index of the log reads it: seq, app, user, session, event
id, invocation id, author, branch, event time (microseconds), content and
state delta (as stored JSON text, the delta None when it set none). Plain
tuples, because a build reads a million of them and decodes only content."""


class EventRows(Protocol):
    """A page of :data:`EventRow` by position: a list of them, or a page the
    compiled core read in one buffer (``streamd._native.EventPage``), whose
    rows become tuples only where they are asked for."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> EventRow: ...


def closed_error() -> RpcError:
    return RpcError(CLOSED, "event log is closed")


LeaseTime = int | Callable[[], int]
"""The time a lease operation stamps and judges with, in microseconds: a time,
or the lease clock, which the operation reads inside its transaction once it
holds the write lock (on the servers, the lease's row: see
:mod:`~streamd.eventlog.store.leases`). The log passes its clock: SQLite's
``BEGIN IMMEDIATE`` waits up to the busy timeout (5 s) while another process
writes, and a lease stamped with the time read before that wait was as old as
the wait when it was written, stealable at once under a shorter window."""


def lease_time(now: LeaseTime) -> int:
    """The time of ``now``, read now (inside the operation's transaction)."""
    return now() if callable(now) else now


@dataclass(frozen=True, slots=True)
class AppendGroup:
    """Appends that commit in order, all or none, as one item of a group commit
    (``eventlog/append_batch``)."""

    appends: Sequence[AppendParams]


class Committed(msgspec.Struct, frozen=True):
    """One event a commit added, as the watchers need it: the fields a filter
    looks at, and the entry encoded once, byte for byte what ``since`` with
    ``encoded=True`` returns for it, so a watch fed from memory and one that
    reads the store send the same frames. A msgspec Struct, not a frozen
    dataclass: one is made per event a watched commit adds, and a frozen
    dataclass's ``__init__`` costs about 1.2 us against 0.1 us."""

    seq: int
    app: str
    user: str
    session: str
    branch: str
    author: str
    wire: bytes


class LeaseKey(msgspec.Struct, frozen=True):
    """One held lease's row as a heartbeat names it: its session and the holder
    that acquired it (a holder is one acquisition's, so a row that names
    another holder is no longer ours)."""

    app: str
    user: str
    session: str
    holder: str


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What :meth:`Backend.append_commit` did.

    ``before_seq`` and ``after_seq`` are the newest seq ever given, read inside
    the transaction before its first insert and when it committed. A log that
    last saw ``before_seq`` therefore knows that ``entries`` is everything that
    was added since, and one that saw less knows that someone else committed
    in between."""

    results: list[AppendResult | list[AppendResult] | RpcError]
    before_seq: int
    after_seq: int
    entries: list[Committed] | None
    """The new events in seq order, when asked for (``capture``)."""


class Backend(Protocol):
    """The storage operations of the event log. Times are integer microseconds
    since the epoch (``now_us``, ``at_us``): the caller's clock, so a test can
    say "30 seconds later" exactly. An operation a wire method asks for with
    more than a key takes that method's params whole (validated by whoever
    built them: :func:`~streamd.eventlog.model.checked` or the wire) and a
    read's :class:`ReadShape`; key-only operations take the key."""

    def append(self, params: AppendParams, now_us: int) -> AppendResult: ...

    def append_batch(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int
    ) -> list[AppendResult | list[AppendResult] | RpcError]: ...

    def append_commit(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int, capture: bool
    ) -> CommitOutcome:
        """:meth:`append_batch` with what the commit added (see :class:`CommitOutcome`)."""
        ...

    def newest_seq(self) -> int:
        """The newest seq ever given and committed (a deleted event's still counts)."""
        ...

    def since(self, p: SinceParams, shape: ReadShape = DECODED) -> SinceResult: ...

    def since_committed(
        self, from_seq: int, flt: Filter | None, limit: int, max_bytes: int
    ) -> tuple[list[Committed], bool]:
        """A page of :meth:`since` as :class:`Committed` entries (at most
        ``max_bytes`` of ``wire``, but at least one), and whether it was the
        last: what a watch reads."""
        ...

    def latest_seq(self, flt: Filter | None) -> int: ...

    def event_rows(self, from_seq: int, limit: int) -> list[EventRow]:
        """Up to ``limit`` events after ``from_seq`` as rows, in seq order."""
        ...

    def event_page(self, from_seq: int, limit: int) -> EventRows:
        """:meth:`event_rows`, for an index that reads the log's rows once:
        in one buffer where the backend can (SQLite, with the compiled core)."""
        ...

    def event_rows_at(self, seqs: Sequence[int]) -> list[EventRow]:
        """The events still stored at ``seqs`` (at most 500), in seq order."""
        ...

    def removed_after(self, mark: int, limit: int) -> list[tuple[int, int]]:
        """(mark, seq) of the events removed after ``mark``, oldest first: the
        deletion signal an index of the log reads at each catch-up."""
        ...

    def newest_removal(self) -> tuple[int, int]:
        """The newest and oldest removal mark still recorded; (0, 0) for none."""
        ...

    def nth_newest_seq(self, flt: Filter | None, offset: int) -> int: ...

    def branches(self, flt: Filter | None, limit: int | None) -> list[str]: ...

    def create_session(self, p: SessionCreateParams, now_us: int) -> Session: ...

    def get_session(self, p: SessionGetParams, shape: ReadShape = DECODED) -> SessionWithEvents:
        """``session_not_found`` if the session was never written."""
        ...

    def get_sessions(self, p: SessionsGetParams, shape: ReadShape = DECODED) -> SessionsResult:
        """``shape.max_bytes`` is shared by the sessions, in the order asked."""
        ...

    def list_sessions(self, app: str, user: str | None) -> list[Session]: ...

    def list_sessions_page(self, p: SessionListParams) -> SessionListResult: ...

    def delete_session(self, app: str, user: str, session: str) -> None: ...

    def get_state(
        self, app: str, user: str | None, session: str | None, as_of_seq: int | None
    ) -> StateSnapshot: ...

    # Retention: each call is one transaction within ``bounds``
    # (see streamd.eventlog.retention for the rules).

    # ``previous`` is the rule's step before (None for its first), which says
    # where this one goes on.

    def drop_idle_sessions(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: KeepAfter,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step: ...

    def drop_old_events(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: KeepAfter,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step: ...

    def trim_sessions(
        self,
        app: str,
        max_events: int,
        keep_after_seq: KeepAfter,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step: ...

    # Retention policies and giving space back (``compact``). A backend
    # without a file of its own reclaims the way its server does and answers
    # in its own units (see each implementation).

    def set_retention(self, policy: RetentionPolicy, now_us: int) -> None:
        """Store the app's policy; one without limits removes it."""
        ...

    def retention_policies(self, app: str | None = None) -> list[RetentionPolicy]:
        """The stored policies (of one app, or all), by app name."""
        ...

    def leased_sessions(self, app: str, now_us: int) -> int:
        """Sessions of the app under a live lease (skipped by retention)."""
        ...

    def incremental_vacuum(self, pages: int) -> int:
        """Give up to ``pages`` free pages back; the pages freed (0: none left)."""
        ...

    def full_vacuum(self) -> None:
        """Rewrite the storage whole, unbounded by rows: only when asked for."""
        ...

    def checkpoint(self) -> bool:
        """Make what was committed durable in the main storage; False when a
        reader still needed part of the log."""
        ...

    def pages(self) -> tuple[int, int, int]:
        """(pages in use, free pages, page size) of the storage."""
        ...

    def acquire_lease(self, p: LeaseAcquireParams, holder: str, now_us: LeaseTime) -> None: ...

    def heartbeat_lease(
        self, app: str, user: str, session: str, holder: str, now_us: LeaseTime
    ) -> bool: ...

    def heartbeat_leases(self, beats: Sequence[LeaseKey], now_us: LeaseTime) -> list[bool]:
        """Refresh every lease of ``beats`` in one transaction: for each, in
        order, whether its row is still ours (False: stolen or released). One
        call for a log's many leases, so their heartbeats cost the writer one
        write a tick, not one a lease."""
        ...

    def release_lease(self, app: str, user: str, session: str, holder: str) -> bool: ...

    def release_leases(self, keys: Sequence[LeaseKey]) -> int:
        """Delete, in one transaction, the row of every lease of ``keys`` that
        is still ours (never a successor's); how many were."""
        ...

    def list_leases(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]: ...

    def record_boot(self, at_us: int, attempted: Sequence[str]) -> int: ...

    def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None: ...

    def recent_boots(self, since_us: int) -> list[Boot]: ...

    def recent_boots_page(self, since_us: int, after: int | None) -> BootRecentResult:
        """One page of :meth:`recent_boots` after boot ``after``, cut by the
        reply budget (``next`` when more follow)."""
        ...

    def ping(self) -> None: ...

    def change_counter(self) -> int: ...

    def synchronous(self) -> int: ...


Role = Literal["writer", "reader"]
"""Which of a log's two connections: the writer's (appends, migrations) or
the reader's (reads, checkpoints)."""


class Runner(Protocol):
    """A backend opened for the Trio layer."""

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        """``op(backend)`` where the backend may be used, honouring Trio
        cancellation as far as the driver allows."""
        ...

    def expect_close(self) -> float | None:
        """A close is coming (the process is stopping): a runner that gives a
        server a grace before it cuts a connection counts the close's grace
        from now, for every wait of it alike, and returns when it ends (Trio's
        clock); one that gives nothing a grace returns None. Nothing is
        cancelled or refused."""
        ...

    def interrupt(self) -> None:
        """Abort what the backend is doing, for close; called on the Trio
        thread. Every later operation raises :func:`closed_error`."""
        ...

    async def aclose(self) -> None: ...


class ChangeSource(Protocol):
    """What the log's change watcher needs of a backend's notifications:
    :class:`FileChanges` for SQLite, LISTEN/NOTIFY for PostgreSQL."""

    async def wait(self) -> None:
        """Return when another process may have committed since the previous
        return; spurious returns are allowed, missed ones are not."""
        ...

    def expect_commit(self) -> None:
        """A commit may be under way that will raise no notification of its
        own (one begun before the source was entered): look for it anyway."""
        ...


class StoreCall(Protocol):
    """Run one store operation on one of the log's connections, opened on
    first use (:class:`~streamd.eventlog.connections.Connections`); raises
    ``closed`` once the log is closed or closing. What a lease, the compactor
    and the checkpoint policy are given to reach the store."""

    def __call__(self, op: Callable[[Backend], _T], /) -> Awaitable[_T]: ...
