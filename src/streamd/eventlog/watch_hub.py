"""The watch hub: every live watch of one log, the fan-out that feeds them from
this process's commits, and the poller that notices other processes'.

A :class:`~streamd.eventlog.watch.Watch` reads the store until it has caught up,
then follows the fan-out (:mod:`~streamd.eventlog.fanout`); the hub starts the
change poller with the first watch that reads and ends it after the last. The
log's writer tells the hub about its own commits: while a batch is between its
commit and its fan-out (:meth:`WatchHub.committing`), the poller waits before
it calls a seq it read another process's, so no commit of ours reaches a
watcher twice or not at all. The hub also keeps the budget all of the log's
watches share (:mod:`~streamd.eventlog.watch_budget`).

A log that went back under its watches (a PostgreSQL or MySQL database
restored from an older dump while the daemon ran: its next seqs name other
events than the ones already handed over) is seen by the fan-out's tail
(:mod:`~streamd.eventlog.fanout`), at this process's next
commit or the poller's next read; every open watch then ends with
``log_went_back`` rather than go on from a cursor the log has passed again
and skip what it holds there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager

import trio

from streamd.errors import SOURCE_UNAVAILABLE, RpcError, is_closed
from streamd.eventlog.fanout import Fanout
from streamd.eventlog.model import WatchParams
from streamd.eventlog.sqlite.changes import SETTLE_HORIZON
from streamd.eventlog.sqlite.file_identity import is_file_fault
from streamd.eventlog.store import Backend, ChangeSource, CommitOutcome, StoreCall
from streamd.eventlog.watch import Watch
from streamd.eventlog.watch_budget import WatchBudget

__all__ = ["LOG_WENT_BACK", "SAFETY_POLL", "WatchHub", "change_state", "went_back"]

logger = logging.getLogger(__name__)

SAFETY_POLL = SETTLE_HORIZON
"""The longest the poller waits on its change source before it reads the newest
seq anyway: a commit whose fsync outlasts the source's rechecks is still seen."""


LOG_WENT_BACK = "log_went_back"
"""``data.reason`` of the error that ends a watch whose log went back."""


def went_back(seen: int, newest: int) -> RpcError:
    """The end of a watch of a log that had reached ``seen`` and whose newest
    seq is now ``newest``. No ``last_seq`` to resume from: there is none."""
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"the event log went back: its newest seq is {newest}, below seq {seen} it had"
        f" reached (restored from an older copy, or another database); seqs after"
        f" {newest} will name other events than the ones this watch was given, so it"
        f" has ended: read the log again from a seq it still holds",
        {"reason": LOG_WENT_BACK, "newest_seq": newest, "seen_seq": seen},
    )


class _Horizon:
    """A retention step's horizon: set on the event loop, read by the step on
    the writer's thread (one attribute, read and written whole)."""

    __slots__ = ("seq",)

    def __init__(self, seq: int | None) -> None:
        self.seq = seq

    def lower(self, seq: int) -> None:
        self.seq = seq if self.seq is None else min(self.seq, seq)

    def __call__(self) -> int | None:
        return self.seq


def change_state(store: Backend) -> tuple[int, int]:
    """The change counter and the newest seq: what the poller confirms a
    wake with (two one-row reads, a small read for the log's reader)."""
    return store.change_counter(), store.newest_seq()


class WatchHub:
    def __init__(
        self,
        *,
        reader: Callable[[], Awaitable[StoreCall]],
        read_change_state: Callable[[], Awaitable[tuple[int, int]]],
        open_changes: Callable[[], AbstractAsyncContextManager[ChangeSource]],
        watch_interval: float,
        capacity: int,
        budget_bytes: int,
        total_bytes: int,
        stall_timeout: float,
        log_closed: Callable[[], bool],
    ) -> None:
        self._reader = reader
        self._read_change_state = read_change_state
        self._open_changes = open_changes
        self._watch_interval = watch_interval
        self._capacity = capacity
        self._budget_bytes = budget_bytes
        self.shared = WatchBudget(total_bytes)
        """What every watch of the log holds, together, and the limit on it."""
        self._stall_timeout = stall_timeout
        self._log_closed = log_closed
        self.fanout = Fanout()
        """This process's commits, for the watches that have caught up."""
        self._watches: set[Watch] = set()
        self._watchers = 0  # watches reading now; the poller runs while there are any
        self._poller: trio.CancelScope | None = None
        self._committing: trio.Event | None = None
        # Commits of this process's writer: how many have begun, and the number
        # of the newest whose outcome reached the fan-out (see _covered).
        self._begun = 0
        self._fanned_out = 0
        # Set (and dropped) when the writer next waits for appends, for a
        # poller following a steady writer (see _covered).
        self._idle: trio.Event | None = None
        # The retention step in flight: set when it has ended, and the horizon
        # it reads inside its transaction (see retention_step).
        self._step: trio.Event | None = None
        self._horizon: _Horizon | None = None
        self._rewinds = 0  # times the log was seen to go back (_went_back)

    @property
    def watching(self) -> bool:
        """Whether any watch is open: a commit then captures its entries."""
        return bool(self._watches)

    def oldest_position(self) -> int | None:
        """The oldest position an open watch has reached: events after it are
        what some watch (or a client resuming it) has still to be given."""
        return min((w.keeps_after for w in self._watches), default=None)

    @asynccontextmanager
    async def retention_step(self) -> AsyncIterator[Callable[[], int | None]]:
        """Around one retention step, until it has committed or failed, even
        when its caller is cancelled (the step may still commit on the
        writer's thread: ``Compactor._step`` waits for it): the horizon it may
        remove nothing after, which the step reads inside its transaction (on
        the writer's thread): the oldest position an open watch has reached
        (:meth:`oldest_position`), lowered by every watch opened since the
        step began. Read before the step waited for the writer, it let the
        step remove what another process committed after a watch opened
        meanwhile.

        A watch opened meanwhile also reads nothing of the store until the
        step has ended (later steps count it): opened after the step read its
        horizon, it would otherwise read its first pages, then lose what the
        step removes, and go on after a silent gap. One step at a time (the
        compactor's lock)."""
        await trio.lowlevel.checkpoint()
        self._step = ended = trio.Event()
        self._horizon = horizon = _Horizon(self.oldest_position())
        try:
            yield horizon
        finally:
            self._step = self._horizon = None
            ended.set()

    def watch(
        self, p: WatchParams, nursery: trio.Nursery, buffer_bytes: int | None = None
    ) -> Watch:
        w = Watch(
            p.from_seq,
            p.filter,
            capacity=self._capacity,
            budget_bytes=self._budget_bytes if buffer_bytes is None else buffer_bytes,
            stall_timeout=self._stall_timeout,
            log_closed=self._log_closed,
            shared=self.shared,
        )
        self._watches.add(w)
        if self._horizon is not None:
            self._horizon.lower(p.from_seq)
        # A retention step in flight did not count this watch (retention_step).
        nursery.start_soon(self._run_watch, w, nursery, self._step)
        return w

    def stop_reading(self) -> None:
        """The log is closing: every watch stops reading the store."""
        for w in list(self._watches):
            w.stop_reading()

    def end_all(self) -> None:
        """The file is gone: take every watch off the live stream, so each
        reads the store, gets the error, and ends with it."""
        for w in list(self._watches):
            self.fanout.drop(w)

    @contextmanager
    def committing(self) -> Iterator[None]:
        """Around one batch's commit and its fan-out (see the module's text)."""
        self._begun += 1
        self._committing = committing = trio.Event()
        try:
            yield
        finally:
            self._committing = None
            committing.set()

    def writer_idle(self) -> None:
        """This process's writer has nothing to commit and waits for appends
        (or has stopped): a poller following it looks for itself again."""
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.set()

    def committed(self, outcome: CommitOutcome) -> None:
        """The outcome of the commit :meth:`committing` is around, for the
        fan-out, in the step the commit returned in."""
        # Read under the seq's lock after every commit handed over: a seq
        # below the tail is the log's own, gone back.
        tail = self.fanout.tail
        if tail is not None and outcome.before_seq < tail:
            self._went_back(tail, outcome.before_seq)
        self.fanout.committed(outcome)
        self._fanned_out = self._begun

    async def _run_watch(self, w: Watch, nursery: trio.Nursery, step: trio.Event | None) -> None:
        try:
            await w.run(lambda: self._feed(nursery, step))
        finally:
            self._watches.discard(w)

    @asynccontextmanager
    async def _feed(
        self, nursery: trio.Nursery, step: trio.Event | None
    ) -> AsyncIterator[tuple[StoreCall, Fanout]]:
        """The reader and the fan-out, for one watch while it reads, once the
        retention step in flight when it was opened (``step``) has ended; the
        poller starts with the first watch and ends after the last."""
        if step is not None:
            await step.wait()  # see retention_step
        reader = await self._reader()
        self._watchers += 1
        if self._poller is None:
            self._poller = trio.CancelScope()
            nursery.start_soon(self._poll_changes, self._poller)
        try:
            yield reader, self.fanout
        finally:
            self._watchers -= 1
            if self._watchers == 0 and self._poller is not None:
                self._poller.cancel()
                self._poller = None

    async def _poll_changes(self, scope: trio.CancelScope) -> None:
        """Notice other processes' commits while anyone is watching: woken by
        the change source (inotify on the database's directory, LISTEN on
        PostgreSQL, else a timer), each wake confirmed by the change counter and
        the newest seq, read in one call on the reader."""
        with scope:
            async with self._open_changes() as changes:
                # Entered before the baseline read, so a commit between the two
                # still raises a wake; and one already writing when the watch
                # was armed is rechecked for.
                changes.expect_commit()
                last: int | None = None
                while True:
                    try:
                        # Under a steady writer of our own, each wake is covered
                        # by its next commit (_covered) and needs no read.
                        if last is None or not await self._covered():
                            last = await self._confirm(last)
                    except RpcError as exc:
                        if is_closed(exc):
                            return
                        if is_file_fault(exc):
                            self.end_all()  # logged once, by the guard
                            return
                        logger.warning("event log change check failed (will retry): %s", exc)
                        await trio.sleep(self._watch_interval)
                    # A slow poll behind the notifications too: a commit whose
                    # fsync outlasts the change source's rechecks is still seen.
                    with trio.move_on_after(max(SAFETY_POLL, self._watch_interval)):
                        await changes.wait()

    async def _confirm(self, last: int | None) -> int:
        """Read the change counter and the newest seq (one small read);
        returns the counter, to compare the next reading with."""
        # What had committed before the read: a commit handed over while the
        # read ran may be past what it saw, and is no sign of a log gone back;
        # nor is a read begun before the log was seen to go back.
        tail, rewinds = self.fanout.tail, self._rewinds
        version, newest = await self._read_change_state()
        if tail is not None and newest < tail and rewinds == self._rewinds:
            self._went_back(tail, newest)
        if version != last:
            # Our own writer moves the counter too: the newest seq tells whose
            # commit it was, once ours up to it are fanned out. The first
            # reading is a baseline, checked the same way, so a commit between
            # a watch's last query and it is not missed.
            await self._settled()
            self.fanout.external(newest)
        return version

    def _went_back(self, seen: int, newest: int) -> None:
        """The log's newest seq, read after every entry up to ``seen`` had
        committed, is ``newest``, below it: end every watch."""
        self._rewinds += 1
        logger.error(
            "EVENT LOG WENT BACK: its newest seq is %s, below seq %s this process had"
            " seen (restored from an older copy?); %s open watch(es) ended", newest, seen,
            len(self._watches))
        self.fanout.rewind(newest)
        for w in list(self._watches):
            w.fail(went_back(seen, newest))

    async def _covered(self) -> bool:
        """Whether, now that the change source woke the poller, a commit of this
        process's writer that began after the wake has reached the fan-out,
        waiting for it while the writer keeps committing; False as soon as the
        writer is idle (then the poller reads for itself). Once covered, it
        returns when the writer is next idle (:meth:`writer_idle`).

        Why a commit covers the wake: a commit reads the newest seq inside its
        transaction (:attr:`~streamd.eventlog.store.CommitOutcome.before_seq`),
        after any commit that had begun writing before it (one writer at a
        time: SQLite's write lock, the counter row elsewhere), and the fan-out
        drops every watch to the store when that seq is past its tail. Under a
        steady writer every wake is one of its own commits' writes, and each
        confirmation read was a thread hop and two queries per commit, paid
        only while someone watches."""
        mark = self._begun
        while self._fanned_out <= mark:
            committing = self._committing
            if committing is None:
                return False
            await committing.wait()
        if self._committing is not None:
            # Still committing: each of its commits would wake the change
            # source (its own WAL write) and be covered by the next, a wake
            # and a change source's read per commit for nothing. Every commit
            # until the writer is idle covers whatever woke the source
            # meanwhile, so the poller sleeps until then; what it finds
            # waiting afterwards is confirmed by one read.
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
        return True

    async def _settled(self) -> None:
        """Wait until the batch of ours that may be between its commit and its
        fan-out now has been fanned out, so a seq read before now is either
        fanned out or another process's. Only that one: a batch that starts
        later committed after the read, and waiting for every next one would
        starve the check under a steady writer."""
        committing = self._committing
        if committing is not None:
            await committing.wait()
