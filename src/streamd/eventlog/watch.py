"""Watches: the entries after a seq that match a filter, replayed then followed live.

A :class:`Watch` is a bounded buffer with two ways in and one way out. Its
rules:

* **A cursor, not a subscription.** The watch keeps the seq of the last entry
  it buffered, and every way in continues from it, so replaying history and
  following the live log hand over each entry exactly once and in seq order.
* **History from the store, the present from memory.** The producer task
  (:meth:`Watch.run`, started by the log in its own nursery) reads pages after
  the cursor until a page reaches the end of the log. It then *joins* the
  log's :class:`~streamd.eventlog.fanout.Fanout`, which hands it this
  process's commits as they happen, already encoded; the producer sleeps
  until the fan-out drops the watch, and then reads the store again.
* **Joining without a gap.** The watch subscribes *before* the page query
  that may be its last, and collects what the fan-out hands it meanwhile
  (``pending``). A commit the query's snapshot missed is then in ``pending``,
  one the snapshot saw is skipped there by the cursor, and only when
  ``pending`` is empty does the watch go live, with no await between. A drop
  while joining (another process committed, or ``pending`` outgrew the budget)
  sends it back to the store.
* **The buffer is bounded, in bytes.** Entries are held encoded, and count
  their size on the wire: at most ``budget_bytes`` (and ``capacity``
  entries), always at least one. The producer waits for room before adding a
  page's entry; a live watch that has no room for a commit takes what fits and
  drops itself, so the writer never waits for a reader. What a joining watch
  collects in ``pending`` is bounded the same way (past the budget it drops
  itself and reads the store), so a watch holds at most twice its budget and
  one entry. When the consumer
  leaves no room for ``stall_timeout`` the watch ends with ``budget_exceeded``
  naming the seq to resume from, after the consumer has drained what was
  buffered; nothing follows that error.
* **All of a log's watches share a budget too**
  (:mod:`~streamd.eventlog.watch_budget`): each counts what it holds there,
  and when the sum passes it the watch holding the most *gives way*: it drops
  its buffer, what it collects and a batch its consumer has not handed on,
  and ends at once with ``budget_exceeded`` naming :attr:`Watch.last_seq`,
  where its consumer resumes; nothing follows that error either.
* **Consumers** take one decoded :class:`~streamd.eventlog.model.Entry` at a
  time (``async for``), or everything buffered at once as encoded entries
  (:meth:`Watch.receive_batch`, for the JSON-RPC watch, which writes a whole
  commit's notifications in one send).
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple

import msgspec
import trio

from streamd.errors import BUDGET_EXCEEDED, INTERNAL_ERROR, RpcError
from streamd.eventlog.fanout import Fanout
from streamd.eventlog.filters import matches
from streamd.eventlog.model import Entry, Filter
from streamd.eventlog.store import Backend, Committed, StoreCall, closed_error
from streamd.eventlog.watch_budget import WatchBudget

__all__ = ["Batch", "Feed", "Sink", "Watch"]

logger = logging.getLogger(__name__)

_decode_entry = msgspec.json.Decoder(Entry).decode

Feed = Callable[[], AbstractAsyncContextManager[tuple[StoreCall, Fanout]]]
"""Where a watch reads from: the log opens its reader (lazily) and counts the
watch in while the context is entered, so it watches for other processes'
commits only while someone watches."""


Sink = Callable[[Sequence[Committed], int], bool]
"""Takes a commit's entries (and their wire bytes) on, or says it cannot."""


class Batch(NamedTuple):
    """What :meth:`Watch.receive_batch` takes: the entries, and their ``wire``
    sizes added up (what the buffer held), so a sender need not add them again."""

    entries: list[Committed]
    nbytes: int


class _Mode(enum.Enum):
    READING = "reading"  # paging through the store; not subscribed
    JOINING = "joining"  # subscribed, collecting into pending while a query runs
    LIVE = "live"  # subscribed; the fan-out fills the buffer


class Watch:
    """An async iterator over the entries after ``from_seq`` that match a filter,
    replayed and then followed live, each exactly once and in seq order.

    Use as ``async with log.watch(...) as w: async for entry in w: ...`` so the
    reader task stops when you leave the block. ``last_seq`` is the seq of the
    last entry handed out (``from_seq`` before the first): resume from it.
    """

    def __init__(
        self,
        from_seq: int,
        flt: Filter | None,
        *,
        capacity: int,
        budget_bytes: int,
        stall_timeout: float,
        log_closed: Callable[[], bool],
        shared: WatchBudget | None = None,
    ) -> None:
        self.from_seq = from_seq
        self.filter = flt
        self.last_seq = from_seq
        self._log_closed = log_closed
        self._capacity = capacity
        self._page = min(256, capacity)
        self._budget = budget_bytes
        self._stall_timeout = stall_timeout

        self._buffer: deque[Committed] = deque()
        self._held = 0  # bytes in the buffer
        self._cursor = from_seq  # seq of the newest entry buffered
        self._arrived = trio.Event()  # set when the buffer gains entries or the watch ends
        self._waiting = False  # the consumer waits in receive_batch on an empty buffer
        self._sink: Sink | None = None
        self._taken = trio.Event()  # set (and replaced) whenever the consumer takes some
        self._ended = False
        self._error: RpcError | None = None

        self._mode = _Mode.READING
        self._fanout: Fanout | None = None
        self._pending: deque[Committed] = deque()
        self._pending_bytes = 0
        self._drop = trio.Event()  # set when the fan-out lets go of the watch
        self._scope = trio.CancelScope()  # the producer's

        # A batch taken with given_later, held by the consumer until given up
        # to its last seq: its bytes, and that seq.
        self._in_hand = 0
        self._in_hand_from = self._in_hand_until = from_seq
        # The log's budget over all its watches, while this one counts there.
        self._shared = shared
        if shared is not None:
            shared.join(self)
        self.gave_way = trio.Event()
        """Set when the shared budget ended the watch (:meth:`give_way`)."""

    # -- the consumer --

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Entry:
        await self._wait_buffered()
        c = self._buffer.popleft()
        self._took(len(c.wire), c.seq)
        return _decode_entry(c.wire)

    async def receive_batch(self, *, given_later: bool = False) -> Batch:
        """Everything buffered, at least one entry, encoded; raises as the
        iterator does (``StopAsyncIteration`` once the watch has ended).

        ``given_later``: the caller hands the entries on in its own time and
        says how far it got with :meth:`given`. Until then :attr:`last_seq`
        stays where its client was given entries: retention keeps what comes
        after it, and the JSON-RPC watch, which may end before it sends the
        batch, tells its client to resume from there."""
        await self._wait_buffered()
        batch = Batch(list(self._buffer), self._held)
        self._buffer.clear()
        if given_later:
            # Still held, by the consumer now, until given.
            self._held -= batch.nbytes
            if not self._in_hand:
                self._in_hand_from = batch.entries[0].seq
            self._in_hand += batch.nbytes
            self._in_hand_until = batch.entries[-1].seq
            self._took()
        else:
            self._took(batch.nbytes, batch.entries[-1].seq)
        return batch

    def given(self, seq: int) -> None:
        """Entries up to ``seq`` taken with ``given_later`` are with the client."""
        self.last_seq = max(self.last_seq, seq)
        if self._in_hand and seq >= self._in_hand_until:
            self._charge(-self._in_hand)
            self._in_hand = 0

    def sink(self, sink: Sink) -> None:
        """Let ``sink`` take a live commit's entries directly, when the consumer
        waits in :meth:`receive_batch` with nothing buffered (so nothing is
        ahead of them); it returns False to leave them to the buffer. For the
        JSON-RPC watch, whose sink queues the frames on its connection when
        they fit its budget."""
        self._sink = sink

    async def _wait_buffered(self) -> None:
        if self._log_closed():
            raise closed_error()
        while not self._buffer:
            if self._ended:
                if self._log_closed():
                    raise closed_error()
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._arrived = trio.Event()
            self._waiting = True
            try:
                await self._arrived.wait()
            finally:
                self._waiting = False

    def _took(self, size: int = 0, seq: int | None = None) -> None:
        """The consumer took ``size`` bytes, up to ``seq``: room for more."""
        if size:
            self._held -= size
            self._charge(-size)
        if seq is not None:
            self.last_seq = seq
        self._taken.set()
        self._taken = trio.Event()

    async def aclose(self) -> None:
        self._scope.cancel()
        self._end()
        self._leave_shared()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def error(self) -> RpcError | None:
        """Why the watch ended, once it has (raised again by the iterator)."""
        return self._error

    @property
    def keeps_after(self) -> int:
        """The seq after which retention must keep every entry for this watch.

        What its consumer was given (:attr:`last_seq`) is the floor, but not
        the answer: a filtered watch gives only what matches, and a watch of
        one quiet session, placed at what it had given, held back retention
        of every app for as long as it stayed open. What it has read (the
        cursor, which the fan-out moves past a live commit it has looked
        through) holds nothing more for it beyond what it holds unsent, so
        the position is the cursor, or just before the first entry it still
        holds (buffered, in its consumer's hand, or collected while joining)."""
        keep = self._cursor
        if self._buffer:
            keep = min(keep, self._buffer[0].seq - 1)
        if self._pending:
            keep = min(keep, self._pending[0].seq - 1)
        if self._in_hand:
            keep = min(keep, self._in_hand_from - 1)
        return max(self.last_seq, keep)

    @property
    def buffered(self) -> int:
        """Entries read from the log but not yet taken by the consumer."""
        return len(self._buffer)

    @property
    def buffered_bytes(self) -> int:
        """Their size on the wire: at most the budget, or one entry beyond it."""
        return self._held

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def live(self) -> bool:
        """Whether the fan-out feeds this watch (it is caught up)."""
        return self._mode is _Mode.LIVE

    # -- the log's budget over all its watches (streamd.eventlog.watch_budget) --

    @property
    def held_bytes(self) -> int:
        """What the watch holds for its consumer: its buffer, what it collects
        while joining, and a batch taken with ``given_later`` and not given."""
        return self._held + self._pending_bytes + self._in_hand

    def give_way(self, total: int, limit: int) -> None:
        """The shared budget ends this watch, which held the most when all
        held ``total`` bytes, over ``limit``: drop everything held, and end
        with ``budget_exceeded`` naming where the consumer resumes."""
        held, self._shared = self.held_bytes, None  # the budget let go of it
        self._error = RpcError(
            BUDGET_EXCEEDED,
            f"the event log's watches held {total} bytes for their consumers, over the"
            f" {limit} byte budget they share, and this watch held the most ({held} bytes)"
            f" for a consumer that is behind; the watch has ended, resume with"
            f" from_seq={self.last_seq}",
            {"last_seq": self.last_seq, "held_bytes": held, "total_bytes": total,
             "budget_bytes": limit},
        )
        self._buffer.clear()
        self._pending.clear()
        self._held = self._pending_bytes = self._in_hand = 0
        if self._fanout is not None:
            self._fanout.unsubscribe(self)
        self._scope.cancel()
        self._end()
        self.gave_way.set()

    def fail(self, error: RpcError) -> None:
        """End the watch with ``error`` at once, nothing handed over after it
        (the log it followed went back, say): its consumer is given what it
        had taken, then the error. The producer stops; what is buffered goes."""
        if self._ended:
            return
        self._error = error
        self._buffer.clear()
        self._charge(-self._held)
        self._held = 0
        if self._fanout is not None:
            self._fanout.unsubscribe(self)
        self._scope.cancel()
        self._end()

    def _charge(self, n: int) -> None:
        if self._shared is not None:
            self._shared.add(n)

    def _leave_shared(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.leave(self)

    # -- the fan-out's side (see streamd.eventlog.fanout.Subscriber) --

    def deliver(self, entries: Sequence[Committed], nbytes: int) -> None:
        if self._ended:
            return  # gave way, within this commit's fan-out
        flt = self.filter
        if self._mode is _Mode.JOINING:
            collected = 0
            for c in entries:
                if flt is None or matches(flt, c):
                    self._pending.append(c)
                    collected += len(c.wire)
            self._pending_bytes += collected
            self._charge(collected)
            if self._pending_bytes > self._budget:
                self._let_go()
            return
        # Live. Only this method moves the cursor while live, and only to what
        # the commit added, which is past it.
        buffer = self._buffer
        if (
            flt is None
            and entries[0].seq > self._cursor
            and (self._held + nbytes <= self._budget or (not buffer and len(entries) == 1))
            and len(buffer) + len(entries) <= self._capacity
        ):
            # A whole-log watch with room for the whole commit takes it in one
            # step: the same outcome as the loop below (entries are in seq
            # order and each would fit), without a Python step per entry for
            # each of the watches a commit is handed to. And while its consumer
            # waits on an empty buffer, the sink may send the commit on at once
            # (nothing is ahead of it), sparing the consumer a wake per commit.
            # Empty, not only waiting: a consumer woken for the commit before
            # this one is still "waiting" until it runs, and that commit is
            # still buffered ahead of this one.
            if not buffer and self._waiting and self._sink is not None and self._sink(
                entries, nbytes
            ):
                self._cursor = self.last_seq = entries[-1].seq
                return
            buffer.extend(entries)
            self._held += nbytes
            self._cursor = entries[-1].seq
            self._arrived.set()
            self._charge(nbytes)
            return
        took = 0
        for c in entries:
            if c.seq <= self._cursor or (flt is not None and not matches(flt, c)):
                continue
            size = len(c.wire)
            if buffer and (
                self._held + size > self._budget or len(buffer) >= self._capacity
            ):
                self._let_go()  # the producer continues from the cursor, from the store
                break
            buffer.append(c)
            self._held += size
            self._cursor = c.seq
            took += size
        else:
            # Looked through whole: the fan-out hands over a commit only when
            # every entry before it was (its tail), so nothing up to its last
            # seq is left for this watch but what it took. A filter that
            # matched none of it moves the cursor on all the same, so that a
            # read of the store after a drop starts here and retention is
            # not held back for entries the watch will never send.
            self._cursor = max(self._cursor, entries[-1].seq)
        if took:
            self._arrived.set()
            self._charge(took)

    def dropped(self) -> None:
        self._mode = _Mode.READING
        self._pending.clear()
        self._charge(-self._pending_bytes)
        self._pending_bytes = 0
        self._drop.set()

    def _let_go(self) -> None:
        assert self._fanout is not None
        self._fanout.drop(self)

    # -- the producer --

    def stop_reading(self) -> None:
        """End the producer (the log is closing); the consumer's next read
        raises ``closed``."""
        self._scope.cancel()

    async def run(self, feed: Feed) -> None:
        """The producer task. It never raises: how the watch ended is
        :attr:`error` (None for a consumer that left, or a stop)."""
        try:
            with self._scope:
                async with feed() as (read, fanout):
                    self._fanout = fanout
                    try:
                        await self._follow(read, fanout)
                    finally:
                        fanout.unsubscribe(self)
                        self._mode = _Mode.READING
        except RpcError as exc:
            self._error = exc
        except Exception as exc:
            # This task lives in the log's nursery: letting a bug escape would
            # take down every client of the log, not just this watch.
            logger.exception("watch from seq %s failed", self._cursor)
            self._error = RpcError(
                INTERNAL_ERROR, f"watch failed: {exc!r}; resume with from_seq={self._cursor}"
            )
        finally:
            self._end()

    def _end(self) -> None:
        self._ended = True
        self._arrived.set()

    async def _follow(self, read: StoreCall, fanout: Fanout) -> None:
        while not self._ended:
            # Subscribe before the query, so what commits while it runs is
            # collected in pending rather than missed.
            self._drop = trio.Event()
            self._mode = _Mode.JOINING
            fanout.subscribe(self)
            # Read only what there is room for (always at least one entry), so
            # the page and the buffer together stay within the budget.
            room = max(self._budget - self._held, 1)
            page, caught_up = await read(self._page_after(self._cursor, room))
            for c in page:
                await self._hand_over(c)
            if not caught_up:
                fanout.unsubscribe(self)
                self.dropped()
                continue
            # Caught up with the store's snapshot: what came after it is in
            # pending (entries the snapshot also saw are behind the cursor).
            while self._mode is _Mode.JOINING and self._pending:
                c = self._pending.popleft()
                self._pending_bytes -= len(c.wire)
                self._charge(-len(c.wire))
                if c.seq > self._cursor:
                    await self._hand_over(c)
            if self._mode is _Mode.JOINING:
                self._mode = _Mode.LIVE
                await self._drop.wait()

    def _page_after(
        self, cursor: int, room: int
    ) -> Callable[[Backend], tuple[list[Committed], bool]]:
        flt, limit = self.filter, self._page
        return lambda store: store.since_committed(cursor, flt, limit, room)

    async def _hand_over(self, c: Committed) -> None:
        """Buffer one entry once the budget has room for it; ``budget_exceeded``
        (resume after the cursor, the last entry buffered) if it gets none in
        time."""
        if self._ended:
            # Gave way while a page was read: its scope is cancelled, and
            # nothing may follow the error.
            await trio.lowlevel.checkpoint()
        size = len(c.wire)
        with trio.move_on_after(self._stall_timeout) as stall:
            while self._buffer and (
                self._held + size > self._budget or len(self._buffer) >= self._capacity
            ):
                await self._taken.wait()
        if stall.cancelled_caught:
            raise RpcError(
                BUDGET_EXCEEDED,
                f"watch consumer stopped reading: {self.buffered} entries"
                f" ({self.buffered_bytes} bytes, budget {self._budget}) unread for"
                f" {self._stall_timeout:g} s; resume with from_seq={self._cursor}",
                {"last_seq": self._cursor, "buffered": self.buffered, "buffered_bytes": self._held},
            )
        self._buffer.append(c)
        self._held += size
        self._cursor = c.seq
        self._arrived.set()
        self._charge(size)
