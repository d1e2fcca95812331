"""The group-commit writer: every append of one log, queued, taken in batches
and committed one transaction a batch on the writer's connection.

Under load the appends already queued when a commit returns are taken at once
into the next batch (up to ``max_batch``), so a thousand clients share a
handful of fsyncs; an append alone, with nothing queued or running on the
writer's thread, may commit inline on the event loop thread (see
:mod:`~streamd.eventlog.sqlite.runner` for why and when). Each append's caller
is answered only after the commit that holds it, with its own outcome (an
event's conflict fails that event alone); once queued, an append is resolved
whatever its caller does, even at close, so a caller learns whether it was
written. The watch hub is told of every commit in the step its callers are.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import trio

from streamd.errors import CLOSED, RpcError, is_closed
from streamd.eventlog import inline
from streamd.eventlog.model import AppendBatchParams, AppendParams, AppendResult
from streamd.eventlog.sqlite.file_identity import is_file_fault
from streamd.eventlog.sqlite.runner import NOT_RUN, ConnectionRunner, InlineGate
from streamd.eventlog.store import AppendGroup, Backend, CommitOutcome, Runner, closed_error
from streamd.eventlog.watch_hub import WatchHub
from streamd.rpc.outbox import gathered

__all__ = ["AppendOutcome", "EventLogStats", "GroupCommitWriter", "never_written"]

logger = logging.getLogger(__name__)


@dataclass
class EventLogStats:
    """Counters for diagnostics and benchmarks (group commit at work)."""

    appends: int = 0
    batches: int = 0
    largest_batch: int = 0
    inline_commits: int = 0
    """Batches committed on the event loop thread, without a thread hop."""
    checkpoints: int = 0
    """WAL checkpoints made beside the writes (SQLite)."""


AppendOutcome = AppendResult | list[AppendResult] | RpcError
"""What an append (an :class:`AppendResult`) or a batch (a list) came to, or
why it was not written."""


def never_written() -> RpcError:
    return RpcError(CLOSED, "event log closed before the append was written; it was not written")


@dataclass(eq=False)
class _Pending:
    params: AppendParams | AppendGroup
    on_done: Callable[[AppendOutcome], None] | None = None
    done: trio.Event = field(default_factory=trio.Event)
    outcome: AppendOutcome | None = None

    def resolve(self, outcome: AppendOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            if self.on_done is None:
                self.done.set()
                return
            try:
                self.on_done(outcome)
            except Exception:
                # The writer calls this for a whole batch: one failing callback
                # must not leave the others unanswered or stop the writer.
                logger.exception("an append's completion callback failed")


class GroupCommitWriter:
    def __init__(
        self,
        *,
        max_batch: int,
        hub: WatchHub,
        stats: EventLogStats,
        now_us: Callable[[], int],
        open_log: Callable[[], Awaitable[object]],
        log_closed: Callable[[], bool],
        cancelled_by_close: Callable[[], AbstractContextManager[trio.CancelScope]],
        after_commit: Callable[[Runner], None],
    ) -> None:
        self._max_batch = max_batch
        self._hub = hub
        self._stats = stats
        self._now_us = now_us
        self._open_log = open_log
        self._log_closed = log_closed
        self._cancelled_by_close = cancelled_by_close
        self._after_commit = after_commit
        self._send, self._recv = trio.open_memory_channel[_Pending](4 * max_batch)
        self._started = False
        self._done = trio.Event()
        self._inline = InlineGate(inline.SLOW_WRITE_S, inline.BACKOFF_S)

    # -- the callers' side --

    async def append(self, params: AppendParams | AppendGroup) -> AppendResult | list[AppendResult]:
        """Queue and wait for the commit that holds it; raises its error."""
        if self._log_closed():
            raise closed_error()
        pending = _Pending(params)
        try:
            # The common case, an open log with room in the queue, needs no
            # scope for close to cancel: nothing here can block. A cancel scope
            # costs about a tenth of the event loop's time per append.
            if not self._started:
                raise trio.WouldBlock
            self._send.send_nowait(pending)
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

    def submit(
        self,
        params: AppendParams | AppendBatchParams,
        on_done: Callable[[AppendOutcome], None],
        nursery: trio.Nursery | None,
    ) -> None:
        """Queue without waiting; ``on_done`` is called exactly once with the
        outcome (see :meth:`streamd.eventlog.log.EventLog.submit_append`)."""
        pending = _Pending(
            AppendGroup(params.appends) if isinstance(params, AppendBatchParams) else params,
            on_done,
        )
        if self._log_closed():
            pending.resolve(closed_error())
            return
        if self._started:
            try:
                self._send.send_nowait(pending)
                return
            except trio.ClosedResourceError:
                pending.resolve(closed_error())
                return
            except trio.WouldBlock:
                pass
        # Not open yet, or the queue is full: wait for it in the background.
        assert nursery is not None, "use the EventLog as `async with EventLog(...) as log:`"
        nursery.start_soon(self._enqueue_later, pending)

    async def _enqueue_later(self, pending: _Pending) -> None:
        try:
            await self._enqueue(pending)
        except RpcError as exc:
            pending.resolve(exc)

    async def _enqueue(self, pending: _Pending) -> None:
        """Queue an append, opening the log or waiting for room; close cancels it."""
        with self._cancelled_by_close() as scope:
            await self._open_log()
            try:
                await self._send.send(pending)
            except trio.ClosedResourceError:
                raise closed_error() from None
        if scope.cancelled_caught:
            raise closed_error()

    # -- the writer's side --

    def start(self, nursery: trio.Nursery, writer: Runner) -> None:
        self._started = True
        nursery.start_soon(self._run, writer)

    def close_queue(self) -> None:
        """No append is queued from now on (each caller hears ``closed``)."""
        self._send.close()

    async def finish(self, grace: float, interrupt: Callable[[], None]) -> None:
        """At close: let the batch being committed land (it normally does in
        milliseconds and its callers then learn the truth); one stuck behind
        another process's lock is interrupted after ``grace`` seconds (rolled
        back, reported as not written)."""
        if not self._started:
            self._fail_queued()
            return
        with trio.move_on_after(grace):
            await self._done.wait()
        if not self._done.is_set():
            interrupt()
            await self._done.wait()

    async def _run(self, writer: Runner) -> None:
        batch: list[_Pending] = []
        try:
            while True:
                try:
                    # Under load appends are already queued when a commit returns:
                    # take them at once, not after a turn of the event loop (a
                    # channel's receive checkpoints), while the connection's
                    # thread sits idle. The commit's await is the checkpoint.
                    first = self._recv.receive_nowait()
                except trio.WouldBlock:
                    self._hub.writer_idle()
                    try:
                        first = await self._recv.receive()
                    except trio.EndOfChannel:
                        break
                except trio.EndOfChannel:
                    break
                batch = [first]
                while len(batch) < self._max_batch:
                    try:
                        batch.append(self._recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if self._log_closed():
                    for p in batch:
                        p.resolve(never_written())
                    continue
                with self._hub.committing():
                    outcome = await self._commit(writer, batch)
                    # The commit's answers and its watchers' notifications
                    # leave as one write per idle connection at the block's
                    # end, with no wake of each one's writer task (rpc.outbox).
                    # Before the next batch goes to the worker thread: written
                    # beside it, each write would hand the GIL back and forth.
                    with gathered():
                        self._answer(batch, outcome)
                    self._after_commit(writer)
                self._stats.batches += 1
                self._stats.appends += len(batch)
                self._stats.largest_batch = max(self._stats.largest_batch, len(batch))
                batch = []
        finally:
            self._hub.writer_idle()
            for p in batch:
                p.resolve(never_written())
            self._fail_queued()
            self._done.set()

    def _answer(self, batch: list[_Pending], outcome: CommitOutcome | RpcError) -> None:
        results = outcome.results if isinstance(outcome, CommitOutcome) else [outcome] * len(batch)
        for p, result in zip(batch, results, strict=True):
            p.resolve(result)
        # In the same step as the commit's return, so nothing this process
        # does can see the commit before its watchers do.
        if isinstance(outcome, CommitOutcome):
            self._hub.committed(outcome)

    async def _commit(self, writer: Runner, batch: list[_Pending]) -> CommitOutcome | RpcError:
        params, now_us = [p.params for p in batch], self._now_us()
        # Entries are captured (encoded for the watchers) only while someone
        # watches; a batch committed without them makes the fan-out drop every
        # watch, which then reads the store: correct, only slower.
        capture = self._hub.watching

        def op(store: Backend) -> CommitOutcome:
            return store.append_commit(params, now_us, capture)

        try:
            if isinstance(writer, ConnectionRunner) and self._inline_fits(params):
                done = self._inline.attempt(writer, op)
                if done is not NOT_RUN:
                    # No await here: the writer's next receive, which finds
                    # the queue empty (the batch was alone), is the checkpoint.
                    self._stats.inline_commits += 1
                    return done
            # Not cancelled by close: the batch in flight finishes, so its
            # callers hear whether it committed.
            with trio.CancelScope(shield=True):  # never cancelled: it swallows nothing
                outcome = await writer.run(op)
            return outcome
        except RpcError as exc:
            # Interrupted by close means rolled back: say so precisely.
            if is_file_fault(exc):
                self._hub.end_all()
            return never_written() if is_closed(exc) else exc

    def _inline_fits(self, params: list[AppendParams | AppendGroup]) -> bool:
        """Whether a batch may commit on the event loop thread (see
        :mod:`~streamd.eventlog.sqlite.runner`): it is one append (or one
        small group). Whether nothing else waits for the writer is the
        runner's to say, and whether the disk has been slow lately the
        gate's (an inline commit that took long keeps the next ones on the
        worker thread for a while, so a slow disk stalls the writer's callers,
        never the whole event loop, more than once)."""
        if len(params) != 1:
            return False
        item = params[0]
        return not isinstance(item, AppendGroup) or len(item.appends) <= inline.MAX_INLINE_GROUP

    def _fail_queued(self) -> None:
        while True:
            try:
                pending = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            pending.resolve(never_written())
