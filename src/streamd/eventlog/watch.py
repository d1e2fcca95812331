"""Watches: the entries after a seq that match a filter, replayed then followed live.

A :class:`Watch` is two halves joined by a memory channel: the consumer's
async iterator, and a producer task (:meth:`Watch.run`, started by the log in
its own nursery) that reads pages from the store. Its rules:

* **A cursor, not a subscription.** The producer keeps the seq it last sent and
  asks the store for matching entries after it, so replaying history and
  following the live log are the same loop, and no entry can be skipped or sent
  twice at the switch. (SQLite assigns seqs inside the single writer's
  transaction, so commit order is seq order and a cursor never passes an
  uncommitted seq.)
* **Caught up, it sleeps on** :class:`Commits`, which the log sets after every
  commit that added a row (in-process appends wake watchers at once) and when
  its poller sees ``PRAGMA data_version`` move (another process committed). It
  never re-queries blindly.
* **The buffer is bounded, in bytes.** The producer reads ahead at most
  ``budget_bytes`` of entries (their size on the wire; at most ``capacity``
  entries, and always at least one) that the consumer has not taken, and reads
  the next page only for the room left, so what it holds never exceeds the
  budget by more than one entry whatever the entries weigh. When the consumer
  leaves no room for ``stall_timeout`` the watch ends with ``budget_exceeded``
  naming the seq to resume from, after the consumer has drained what was
  buffered; nothing follows that error. Entries are read with their content as
  raw JSON and decoded when handed out, so the buffer holds about the bytes it
  counts (``raw_content=True`` hands them out raw, for a consumer that only
  re-encodes them: the JSON-RPC watch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import msgspec
import trio

from streamd.errors import BUDGET_EXCEEDED, INTERNAL_ERROR, RpcError
from streamd.eventlog.model import Entry, Filter, SinceResult, wire_size
from streamd.eventlog.store import Backend, Runner, closed_error

__all__ = ["Commits", "Feed", "Watch"]

logger = logging.getLogger(__name__)

_decode_content = msgspec.json.Decoder().decode


class Commits:
    """Tells caught-up watchers that something may have been committed."""

    def __init__(self) -> None:
        self._next = trio.Event()

    def next(self) -> trio.Event:
        """The event the next :meth:`notify` sets. Take it *before* a query: a
        commit that lands during the query then sets this very event, so a wait
        on it after the query cannot miss that commit."""
        return self._next

    def notify(self) -> None:
        event, self._next = self._next, trio.Event()
        event.set()


Feed = Callable[[], AbstractAsyncContextManager[tuple[Runner, Commits]]]
"""Where a watch reads from: the log opens its reader (lazily) and counts the
watch in while the context is entered, so it polls for other processes'
commits only while someone watches."""


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
        raw_content: bool,
        log_closed: Callable[[], bool],
    ) -> None:
        self.from_seq = from_seq
        self.filter = flt
        self.last_seq = from_seq
        self._raw = raw_content
        self._log_closed = log_closed
        # Each entry travels with its size on the wire, so the consumer can give
        # back exactly what the producer counted.
        self._send, self._recv = trio.open_memory_channel[tuple[Entry, int]](capacity)
        self._page = min(256, capacity)
        self._budget = budget_bytes
        self._stall_timeout = stall_timeout
        self._held = 0  # bytes of entries sent into the channel and not yet taken
        self._taken = trio.Event()  # set (and replaced) whenever the consumer takes one
        self._scope = trio.CancelScope()  # the producer's
        self._error: RpcError | None = None

    # -- the consumer --

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Entry:
        if self._log_closed():
            raise closed_error()
        try:
            entry, size = await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            if self._log_closed():
                raise closed_error() from None
            if self._error is not None:
                raise self._error from None
            raise StopAsyncIteration from None
        self._held -= size
        self._taken.set()
        self._taken = trio.Event()
        content = entry.event.content
        if not self._raw and isinstance(content, msgspec.Raw):
            # Valid JSON: raw reads turn content that is not into a damaged null.
            entry.event.content = _decode_content(content)
        self.last_seq = entry.seq
        return entry

    async def aclose(self) -> None:
        self._scope.cancel()
        self._recv.close()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def error(self) -> RpcError | None:
        """Why the watch ended, once it has (raised again by the iterator)."""
        return self._error

    @property
    def buffered(self) -> int:
        """Entries read from the log but not yet taken by the consumer."""
        return self._recv.statistics().current_buffer_used

    @property
    def buffered_bytes(self) -> int:
        """Their size on the wire: at most the budget, or one entry beyond it."""
        return self._held

    @property
    def budget_bytes(self) -> int:
        return self._budget

    # -- the producer --

    def stop_reading(self) -> None:
        """End the producer (the log is closing); the consumer's next read
        raises ``closed``."""
        self._scope.cancel()

    async def run(self, feed: Feed) -> None:
        """The producer task. It never raises: how the watch ended is
        :attr:`error` (None for a consumer that left, or a stop)."""
        cursor = self.from_seq
        try:
            with self._scope:
                async with feed() as (reader, commits):
                    while True:
                        wake = commits.next()
                        # Read only what there is room for (always at least one
                        # entry), so the page waiting here and the channel
                        # together stay within the budget.
                        room = max(self._budget - self._held, 1)
                        page = await reader.run(self._page_after(cursor, room))
                        for entry in page.entries:
                            await self._hand_over(entry, cursor)
                            cursor = entry.seq
                        if page.caught_up:
                            await wake.wait()
        except RpcError as exc:
            self._error = exc
        except trio.BrokenResourceError:
            pass  # the consumer closed its end
        except Exception as exc:
            # This task lives in the log's nursery: letting a bug escape would
            # take down every client of the log, not just this watch.
            logger.exception("watch from seq %s failed", cursor)
            self._error = RpcError(
                INTERNAL_ERROR, f"watch failed: {exc!r}; resume with from_seq={cursor}"
            )
        finally:
            self._send.close()

    def _page_after(self, cursor: int, room: int) -> Callable[[Backend], SinceResult]:
        flt, limit = self.filter, self._page
        return lambda store: store.since(cursor, flt, limit, True, room)

    async def _hand_over(self, entry: Entry, cursor: int) -> None:
        """Send one entry once the budget has room for it; ``budget_exceeded``
        (resume after ``cursor``, the last entry sent) if it gets none in time."""
        size = wire_size(entry)
        with trio.move_on_after(self._stall_timeout) as stall:
            while self._held and self._held + size > self._budget:
                await self._taken.wait()
            self._held += size
            try:
                await self._send.send((entry, size))
            except BaseException:
                self._held -= size  # not sent
                raise
        if stall.cancelled_caught:
            raise RpcError(
                BUDGET_EXCEEDED,
                f"watch consumer stopped reading: {self.buffered} entries"
                f" ({self.buffered_bytes} bytes, budget {self._budget}) unread for"
                f" {self._stall_timeout:g} s; resume with from_seq={cursor}",
                {"last_seq": cursor, "buffered": self.buffered, "buffered_bytes": self._held},
            )
