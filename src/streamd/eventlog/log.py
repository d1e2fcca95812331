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
* **Leases** (:class:`~streamd.eventlog.lease.LeaseKeeper`): a task per lease,
  in the log's nursery or one the caller supplies, and heartbeats by cadence
  (:mod:`~streamd.eventlog.heartbeats`): the leases of one interval are
  refreshed together, one write a tick for up to 1,000 of them.
* **Retention** (:mod:`~streamd.eventlog.compaction`) every
  ``retention_interval`` seconds and on :meth:`EventLog.compact`, each step its
  own short write bounded by rows, so appends interleave; it removes nothing
  after the oldest position of an open watch.
* **WAL checkpoints** (:mod:`~streamd.eventlog.sqlite.checkpoints`), from the
  reader's connection beside the writes.
* **Close** cancels every in-flight operation, which then raises ``closed``; the
  writer finishes the batch it is committing (so its callers learn the truth)
  and fails the rest as never written; leases are released; connections close.

Two ways in: the keyword methods (:mod:`~streamd.eventlog.keywords`, which
:class:`EventLog` inherits) validate their values exactly as the wire would and
pass the params Struct whole to :attr:`EventLog.requests`
(:class:`~streamd.eventlog.requests.LogRequests`), which the JSON-RPC layer
calls with the Struct it decoded, so a request is validated once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from streamd.eventlog import dbtarget, retention
from streamd.eventlog.compaction import Compactor
from streamd.eventlog.connections import Connections
from streamd.eventlog.dbtarget import resolve_db_path as resolve_db_path
from streamd.eventlog.keywords import KeywordApi
from streamd.eventlog.lease import Lease, LeaseKeeper
from streamd.eventlog.lease_budget import DEFAULT_MAX_LEASES
from streamd.eventlog.model import (
    DEFAULT_WATCH_BUFFER_BYTES,
    DEFAULT_WATCH_INTERVAL,
    CompactResult,
    LeaseInfo,
)
from streamd.eventlog.opener import Dispatch, Role, opener_for
from streamd.eventlog.requests import LogRequests
from streamd.eventlog.sqlite import SqliteOptions
from streamd.eventlog.sqlite.checkpoints import CHECKPOINT_PAGES as CHECKPOINT_PAGES
from streamd.eventlog.sqlite.checkpoints import Checkpoints
from streamd.eventlog.store import ChangeSource, Runner, Synchronous, closed_error
from streamd.eventlog.watch_budget import DEFAULT_WATCH_TOTAL_BYTES, WatchBudget
from streamd.eventlog.watch_hub import SAFETY_POLL as SAFETY_POLL
from streamd.eventlog.watch_hub import WatchHub, change_state
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


class EventLog(KeywordApi):
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
        watch_total_bytes: int = DEFAULT_WATCH_TOTAL_BYTES,
        max_leases: int = DEFAULT_MAX_LEASES,
        watch_stall_timeout: float = 30.0,
        max_batch: int = 512,
        wall_clock: Callable[[], float] = time.time,
        retention_interval: float = DEFAULT_RETENTION_INTERVAL,
        retention_bounds: retention.Bounds = retention.DEFAULT_BOUNDS,
        on_retention_step: retention.Observer | None = None,
        dispatch: Dispatch = "worker",
        open_backend: Callable[[Role], Awaitable[Runner]] | None = None,
        open_changes: Callable[[], AbstractAsyncContextManager[ChangeSource]] | None = None,
    ) -> None:
        if (watch_interval <= 0 or watch_buffer < 1 or watch_buffer_bytes < 1
                or watch_total_bytes < 1 or max_leases < 1 or max_batch < 1):
            raise ValueError("watch_interval, watch_buffer, watch_buffer_bytes,"
                             " watch_total_bytes, max_leases and max_batch must be positive")
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
            abandon_opens=self._opener.abandon,
        )
        """The writer's and the reader's connection (for diagnostics and tests:
        a store call run here is outside every rule of the log)."""
        self.checkpoints = Checkpoints(
            read=conns.read,
            write=conns.write,
            nursery=lambda: conns.nursery,
            closed=lambda: conns.closed,
            counted=self._count_checkpoint,
        )
        self._hub = WatchHub(
            reader=conns.open_reader,
            read_change_state=lambda: conns.read(change_state, small=True),
            open_changes=open_changes
            or (lambda: self._opener.changes(lambda: conns.read(lambda store: store.newest_seq()))),
            watch_interval=watch_interval,
            capacity=watch_buffer,
            budget_bytes=watch_buffer_bytes,
            total_bytes=watch_total_bytes,
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
            checkpoint=self.checkpoints.truncate,
            now_us=self._now_us,
            keep_after_seq=self._hub.oldest_position,
            retention_step=self._hub.retention_step,
            bounds=retention_bounds,
            observer=on_retention_step,
        )
        self._leases = LeaseKeeper(
            write=conns.write, now_us=self._now_us, closed=lambda: conns.closed,
            max_leases=max_leases,
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

    def _count_checkpoint(self) -> None:
        self.stats.checkpoints += 1

    def _now_us(self) -> int:
        return int(self._wall_clock() * 1_000_000)

    # -- lifecycle --

    async def __aenter__(self) -> EventLog:
        self._nursery_cm = trio.open_nursery()
        self.connections.serve_in(await self._nursery_cm.__aenter__())
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        closing: BaseException | None = None
        try:
            await self.aclose()
        except BaseException as exc_in_close:
            # A Ctrl-C reaches the close through its shield. The nursery must
            # still be left (Trio takes one left open for a corrupted run),
            # and that exception is the one the caller sees.
            closing = exc_in_close
            exc = (type(closing), closing, closing.__traceback__)
        finally:
            self.connections.nursery.cancel_scope.cancel()
            cm, self._nursery_cm = self._nursery_cm, None
        try:
            handled = await cm.__aexit__(*exc)
        except BaseExceptionGroup as group:
            # The background tasks never raise, so a group holding only the
            # body's own exception is noise: let that exception through as is,
            # so `except RpcError` around the block works.
            if exc[1] is None or list(group.exceptions) != [exc[1]]:
                raise
            handled = False
        if closing is not None and not handled:
            raise closing
        return handled

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
    def watch_budget(self) -> WatchBudget:
        """What all the log's watches hold together, and the limit past which
        the one holding the most gives way (``watch_total_bytes``)."""
        return self._hub.shared

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
    def connecting_s(self) -> float | None:
        """How long the oldest connect to the log's server under way has run,
        None while none runs: a server that accepts and never answers makes
        that no fault until it fails (never, with ``connect_timeout=0``). A
        reconnect counts as much as a first connect, and a watch's listening
        connection as much as the log's own (whether calls wait for it:
        :attr:`calls_wait`)."""
        return self._opener.connecting_s

    @property
    def calls_wait(self) -> bool:
        """Whether calls wait for a connect under way (see
        :attr:`~streamd.eventlog.opener.Opener.calls_wait`)."""
        return self._opener.calls_wait

    @property
    def reconnecting_s(self) -> float | None:
        """How long the log has been trying to reach its server again after
        losing a connection to it, None while it is not (see
        :attr:`~streamd.eventlog.opener.Opener.reconnecting_s`): an outage's
        length, which the newest failure (:attr:`fault`) does not tell, nor
        a connect under way (:attr:`connecting_s`) between two attempts."""
        return self._opener.reconnecting_s

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

    def expect_close(self) -> None:
        """The process is stopping and closes the log next: a database server
        that does not answer is given one grace from now (a server backend's
        ``unresponsive_s``), by every connection at once, before its calls are
        cut; not a grace per connection, one after the other, as the stop
        reaches each. Calls go on being served until :meth:`aclose`; a
        connection's release of its leases (:meth:`release_leases`) gives up
        within the close's grace, as the close's own does."""
        if not self.connections.closed:
            self._leases.bound_releases(self._close_deadline(self.connections.expect_close()))

    @staticmethod
    def _close_deadline(deadline: float | None) -> float:
        """When a connection's release of its leases gives up, a close being
        expected: as the close's own waits, one grace from now, or the
        connections' shared deadline if that is sooner."""
        graced = trio.current_time() + _CLOSE_GRACE
        return graced if deadline is None else min(graced, deadline)

    async def _close(self) -> None:
        conns = self.connections
        # Before anything waits: the close's graces all end one grace from
        # here, or from the stop that said it was coming.
        deadline = conns.expect_close()

        def grace() -> float:
            """The close's own short waits, within that deadline."""
            if deadline is None:
                return _CLOSE_GRACE
            return max(0.0, min(_CLOSE_GRACE, deadline - trio.current_time()))

        self._leases.bound_releases(self._close_deadline(deadline))
        conns.begin_close()
        self._hub.stop_reading()
        leases = self._leases.stop_heartbeats()
        self._appends.close_queue()
        await conns.opening_done()
        await self._appends.finish(grace(), conns.interrupt)
        if conns.writer is not None and (leases or self._leases.unanswered):
            await self._leases.release_at_close(leases, conns.writer, grace())
        # Every caller has been answered; whatever a connection is still doing
        # (a cancelled call waiting on a lock) is abandoned, not waited out.
        await conns.aclose()

    # -- diagnostics --

    @property
    def last_compaction(self) -> CompactResult | None:
        """What the latest compaction (background or asked for) did."""
        return self._compactor.last

    async def release_lock(self, lock: str) -> None:
        """Release by lock id; unknown or already released ids are fine."""
        if self.connections.closed:
            raise closed_error()
        await self._leases.release(lock)

    async def release_leases(self, leases: Iterable[Lease]) -> None:
        """Release ``leases`` of this log together (a closed connection's):
        their rows deleted a thousand a store call, each only if still ours.
        Nothing once the log is closed: its close released them."""
        if not self.connections.closed:
            await self._leases.release_all(leases)

    def lease(self, lock: str) -> Lease | None:
        return self._leases.get(lock)

    async def list_locks(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        return await self.connections.read(lambda store: store.list_leases(app, user))

    async def synchronous_level(self) -> int:
        """How durable a commit is (2 = FULL, 1 = NORMAL): SQLite's ``PRAGMA
        synchronous``, PostgreSQL's ``synchronous_commit``, MySQL's
        ``innodb_flush_log_at_trx_commit``."""
        return await self.connections.write(lambda store: store.synchronous())
