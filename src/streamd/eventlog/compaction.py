"""Compaction: the retention policies applied step by step, and the space given
back, on demand (``eventlog/compact``) or every ``retention_interval`` seconds.

How a policy is cut into bounded steps, and why, is in
:mod:`~streamd.eventlog.retention`; each step is a storage operation
(:mod:`~streamd.eventlog.store.retention`). What this module adds is the
order of a whole compaction and what it may not touch: every step is its own
short transaction on the writer, so appends interleave; what an open watch of
this log has not been given yet is read by each step inside its transaction
(:meth:`~streamd.eventlog.watch_hub.WatchHub.retention_step`) and never
removed; leased sessions are skipped whole by the store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import trio

from streamd.errors import RpcError, is_closed
from streamd.eventlog import retention
from streamd.eventlog.dbtarget import DbTarget
from streamd.eventlog.model import CompactParams, CompactResult
from streamd.eventlog.sqlite.file_identity import is_file_fault
from streamd.eventlog.store import Backend, StoreCall

__all__ = ["Compactor"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


VACUUM_PAGES = 2000
"""Pages one incremental vacuum transaction gives back (retention's own steps
are bounded in :mod:`streamd.eventlog.retention`)."""


def _nothing(store: Backend) -> None:
    """A call on the writer that ends after those queued before it."""


class Compactor:
    def __init__(
        self,
        *,
        target: DbTarget,
        read: StoreCall,
        write: StoreCall,
        checkpoint: Callable[[], Awaitable[bool]],
        now_us: Callable[[], int],
        keep_after_seq: Callable[[], int | None],
        retention_step: Callable[[], AbstractAsyncContextManager[Callable[[], int | None]]],
        bounds: retention.Bounds,
        observer: retention.Observer | None,
    ) -> None:
        self._target = target
        self._read = read
        self._write = write
        self._checkpoint = checkpoint
        self._now_us = now_us
        self._keep_after_seq = keep_after_seq
        self._retention_step = retention_step
        self._bounds = bounds
        self._observer = observer
        self._lock = trio.Lock()  # one compaction at a time
        self.last: CompactResult | None = None
        """What the latest compaction (background or asked for) did."""

    async def compact(self, p: CompactParams) -> CompactResult:
        async with self._lock:
            before = self._file_bytes()
            policies = await self._read(lambda store: store.retention_policies(p.app))
            events = sessions = leased = 0
            for policy in policies:
                e, s = await retention.apply(policy, self._step, self._bounds, self._observer)
                events += e
                sessions += s
                now_us = self._now_us()

                def leased_now(store: Backend, a: str = policy.app, n: int = now_us) -> int:
                    return store.leased_sessions(a, n)

                leased += await self._read(leased_now)
            freed = 0
            if p.vacuum == "incremental":
                while n := await self._write(lambda store: store.incremental_vacuum(VACUUM_PAGES)):
                    freed += n
            elif p.vacuum == "full":
                _, free, _ = await self._write(lambda store: store.pages())
                await self._write(lambda store: store.full_vacuum())
                freed = free
            checkpointed = await self._checkpoint()
            result = CompactResult(
                events_deleted=events,
                sessions_deleted=sessions,
                leased_sessions=leased,
                keep_after_seq=self._keep_after_seq(),
                pages_freed=freed,
                bytes_before=before,
                bytes_after=self._file_bytes(),
                checkpointed=checkpointed,
            )
            self.last = result
            return result

    async def run(self, interval: float) -> None:
        """The background task: compact every ``interval`` seconds, when some
        app has a policy."""
        while True:
            await trio.sleep(interval)
            try:
                if await self._read(lambda store: store.retention_policies()):
                    await self.compact(CompactParams())
            except RpcError as exc:
                if is_closed(exc) or is_file_fault(exc):
                    return
                logger.warning("event log retention failed (will retry): %s", exc)
            except Exception:
                # This task lives in the log's nursery: a bug escaping it would
                # take down every client of the log (a policy's overflow did).
                logger.exception("event log retention failed (will retry)")

    async def _step(self, op: retention.StepOp) -> retention.Step:
        """A retention step on the writer, with the clock read just before it
        is queued and the watch horizon read inside its transaction (see
        :meth:`~streamd.eventlog.watch_hub.WatchHub.retention_step`)."""
        async with self._retention_step() as keep:
            now_us = self._now_us()
            try:
                return await self._write(lambda store: op(store, now_us, keep))
            except trio.Cancelled:
                # SQLite's runner abandons a cancelled call only at its next
                # progress check: a short step goes on and commits. Until it
                # has ended, the hub must go on counting it (a watch opened
                # meanwhile lowers its horizon and waits for it); let go at
                # once, a watch opened then read its first page, then lost
                # what the step removed under it. Shielded from the caller,
                # not from the log's close (which refuses new watches).
                with trio.CancelScope(shield=True):
                    await self._writer_settled()
                raise

    async def _writer_settled(self) -> None:
        """Return once every call queued on the writer so far has ended (the
        writer runs its calls one at a time, in order)."""
        try:
            await self._write(_nothing)
        except RpcError as exc:
            if not is_closed(exc):
                logger.warning("event log retention: waiting for a cancelled step: %s", exc)

    def _file_bytes(self) -> int:
        if self._target.kind != "sqlite":
            return 0  # PostgreSQL: the server's files, not ours to measure
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(str(self._target.target) + suffix).st_size
            except OSError:
                pass
        return total
