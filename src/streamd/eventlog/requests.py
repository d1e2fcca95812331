"""The log's operations as the wire asks for them: one method per request, params whole.

:class:`LogRequests` takes each operation's params Struct as it is, already
validated: decoded from the wire by the JSON-RPC layer (unknown fields
forbidden, constraints checked), or built by the keyword API of
:class:`~streamd.eventlog.log.EventLog` through
:func:`~streamd.eventlog.model.checked`. A Struct built any other way skips its
constraints, so this is the log's inner face and the keyword API its outer one.
A read also takes its :class:`~streamd.eventlog.store.ReadShape`: the JSON-RPC
layer asks for entries already encoded and cut at the reply budget.

Each method is one hop to the job that does the work: the group-commit
writer, the watch hub, the compactor, the lease keeper, or one store
operation on the writer's or the reader's connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from streamd.eventlog import filters, inline
from streamd.eventlog.compaction import Compactor
from streamd.eventlog.connections import Connections
from streamd.eventlog.lease import Lease, LeaseKeeper
from streamd.eventlog.model import (
    AppendBatchParams,
    AppendParams,
    AppendResult,
    Boot,
    BootRecentParams,
    BootRecentResult,
    BootRecordParams,
    BootUpdateParams,
    BranchesParams,
    CompactParams,
    CompactResult,
    LatestSeqParams,
    LeaseAcquireParams,
    RetentionGetParams,
    RetentionPolicy,
    Session,
    SessionCreateParams,
    SessionDeleteParams,
    SessionGetParams,
    SessionListParams,
    SessionListResult,
    SessionsGetParams,
    SessionsResult,
    SessionWithEvents,
    SinceParams,
    SinceResult,
    StateGetParams,
    StateSnapshot,
    WatchParams,
    to_us,
)
from streamd.eventlog.store import DECODED, AppendGroup, EventRow, EventRows, ReadShape
from streamd.eventlog.watch import Watch
from streamd.eventlog.watch_hub import WatchHub
from streamd.eventlog.writer import AppendOutcome, GroupCommitWriter

__all__ = ["LogRequests"]


class LogRequests:
    """Every operation of one log, by params Struct (see the module docstring)."""

    def __init__(
        self,
        *,
        connections: Connections,
        appends: GroupCommitWriter,
        hub: WatchHub,
        compactor: Compactor,
        leases: LeaseKeeper,
        now_us: Callable[[], int],
    ) -> None:
        self._connections = connections
        self._appends = appends
        self._hub = hub
        self._compactor = compactor
        self._leases = leases
        self._now_us = now_us
        self._read = connections.read
        self._write = connections.write

    # -- appends --

    async def append(self, p: AppendParams) -> AppendResult:
        outcome = await self._appends.append(p)
        assert isinstance(outcome, AppendResult)
        return outcome

    async def append_batch(self, p: AppendBatchParams) -> list[AppendResult]:
        outcome = await self._appends.append(AppendGroup(p.appends))
        assert isinstance(outcome, list)
        return outcome

    def submit_append(
        self, p: AppendParams | AppendBatchParams, on_done: Callable[[AppendOutcome], None]
    ) -> None:
        self._appends.submit(p, on_done, self._connections.nursery)

    # -- reads --

    # A read whose cost may grow with the log (``scan``) runs in a lane of
    # its own, so it never holds up the other clients' reads (see
    # connections.py).

    async def since(self, p: SinceParams, shape: ReadShape = DECODED) -> SinceResult:
        scan = filters.scans_the_log(p.filter)
        return await self._read(lambda store: store.since(p, shape), scan=scan)

    async def latest_seq(self, p: LatestSeqParams) -> int:
        return await self._read(
            lambda store: store.latest_seq(p.filter),
            small=p.filter is None,
            scan=filters.scans_the_log(p.filter),
        )

    async def nth_newest_seq(self, p: LatestSeqParams, offset: int) -> int:
        scan = filters.scans_the_log(p.filter)
        return await self._read(lambda store: store.nth_newest_seq(p.filter, offset), scan=scan)

    async def branches(self, p: BranchesParams) -> list[str]:
        # Every branch of the log, unless one session (or tree) is named.
        scan = p.filter is None or filters.scans_the_log(p.filter)
        return await self._read(lambda store: store.branches(p.filter, p.limit), scan=scan)

    # -- what an index of the log reads (the Recall event-log source) --

    async def event_rows(self, from_seq: int, limit: int) -> list[EventRow]:
        return await self._read(lambda store: store.event_rows(from_seq, limit))

    async def event_page(self, from_seq: int, limit: int) -> EventRows:
        return await self._read(lambda store: store.event_page(from_seq, limit))

    async def event_rows_at(self, seqs: Sequence[int]) -> list[EventRow]:
        return await self._read(lambda store: store.event_rows_at(seqs))

    async def removed_after(self, mark: int, limit: int) -> list[tuple[int, int]]:
        return await self._read(lambda store: store.removed_after(mark, limit))

    async def newest_removal(self) -> tuple[int, int]:
        return await self._read(lambda store: store.newest_removal())

    async def index_position(self) -> tuple[int, int, int]:
        """Where the log stands for an index, in one hop: the newest seq ever
        given, and the newest and oldest removal mark recorded."""
        return await self._read(lambda store: (store.newest_seq(), *store.newest_removal()))

    def watch(self, p: WatchParams, buffer_bytes: int | None = None) -> Watch:
        self._connections.check_open()
        if buffer_bytes is not None and buffer_bytes < 1:
            raise ValueError("buffer_bytes must be positive")
        return self._hub.watch(p, self._connections.nursery, buffer_bytes)

    # -- sessions and state --

    async def create_session(self, p: SessionCreateParams) -> Session:
        now_us = self._now_us()
        return await self._write(lambda store: store.create_session(p, now_us))

    async def get_session(
        self, p: SessionGetParams, shape: ReadShape = DECODED
    ) -> SessionWithEvents:
        small = p.recent is not None and p.recent <= inline.SMALL_READ_ROWS
        return await self._read(lambda store: store.get_session(p, shape), small=small)

    async def get_sessions(
        self, p: SessionsGetParams, shape: ReadShape = DECODED
    ) -> SessionsResult:
        return await self._read(lambda store: store.get_sessions(p, shape))

    async def list_sessions(self, p: SessionListParams) -> list[Session]:
        return await self._read(lambda store: store.list_sessions(p.app, p.user))

    async def list_sessions_page(self, p: SessionListParams) -> SessionListResult:
        return await self._read(
            lambda store: store.list_sessions_page(p), small=p.limit <= inline.SMALL_READ_ROWS
        )

    async def delete_session(self, p: SessionDeleteParams) -> None:
        await self._write(lambda store: store.delete_session(p.app, p.user, p.session))

    async def get_state(self, p: StateGetParams) -> StateSnapshot:
        # The current state is a row per scope; a past one replays deltas,
        # the app's from the whole log.
        return await self._read(
            lambda store: store.get_state(p.app, p.user, p.session, p.as_of_seq),
            small=p.as_of_seq is None,
            scan=p.as_of_seq is not None,
        )

    # -- retention --

    async def set_retention(self, p: RetentionPolicy) -> None:
        now_us = self._now_us()
        await self._write(lambda store: store.set_retention(p, now_us))

    async def retention(self, p: RetentionGetParams) -> list[RetentionPolicy]:
        return await self._read(lambda store: store.retention_policies(p.app))

    async def compact(self, p: CompactParams) -> CompactResult:
        """See :mod:`~streamd.eventlog.compaction` for the rules kept."""
        return await self._compactor.compact(p)

    # -- leases --

    async def acquire_lock(
        self,
        p: LeaseAcquireParams,
        *,
        nursery: trio.Nursery | None = None,
        on_lost: Callable[[Lease], Awaitable[None]] | None = None,
    ) -> Lease:
        return await self._leases.acquire(
            p, log_nursery=self._connections.nursery, nursery=nursery, on_lost=on_lost
        )

    # -- boots --

    async def record_boot(self, p: BootRecordParams) -> int:
        at_us = to_us(p.at)
        return await self._write(lambda store: store.record_boot(at_us, p.attempted))

    async def update_boot(self, p: BootUpdateParams) -> None:
        await self._write(lambda store: store.update_boot(p.id, p.attempted))

    async def recent_boots(self, p: BootRecentParams) -> list[Boot]:
        since_us = to_us(p.since)
        return await self._read(lambda store: store.recent_boots(since_us))

    async def recent_boots_page(self, p: BootRecentParams) -> BootRecentResult:
        since_us = to_us(p.since)
        return await self._read(lambda store: store.recent_boots_page(since_us, p.after))

    # -- health --

    async def ping(self) -> None:
        await self._read(lambda store: store.ping(), small=True)
