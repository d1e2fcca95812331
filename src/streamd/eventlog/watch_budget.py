"""What all the watches of one log hold together, and which gives way past it.

A watch's own budget (:mod:`~streamd.eventlog.watch`) bounds what one
consumer that stops reading costs, not how many such consumers there are: a
connection may have 256 requests in flight, each of them a watch, and the
daemon serves 512 connections. Measured with ``bench/held_memory.py
watches`` (256 watches from seq 0 over a busy log, none of them read): 277
MiB more RSS with one connection, 685 MiB with four, and so on with every
connection. The rules:

* Every watch of the log counts, from its opening until its consumer closes
  it, what it holds for that consumer: its buffer, what it collects while it
  joins the live stream, and a batch its consumer took and has not handed on
  (``given_later``). Entries one commit hands to several watches are the
  same bytes, counted once for each: the sum errs high.
* When the sum passes :attr:`WatchBudget.limit` (``--watch-total-bytes``,
  :data:`DEFAULT_WATCH_TOTAL_BYTES`), the watch holding the most gives way at
  once: it drops what it holds and ends with ``budget_exceeded`` naming the
  seq its consumer resumes from (nothing is lost: the entries are in the
  log). That is the consumer furthest behind, or one that stopped reading; a
  watch whose consumer keeps up holds next to nothing and is not chosen
  while another holds more. Each giving way frees at least the average
  holding, and more give way until the sum is within the limit.
* Choosing scans the watches, and only while the sum is past the limit:
  what a commit's fan-out pays on the ordinary path is an addition.

No I/O here, and no trio.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["DEFAULT_WATCH_TOTAL_BYTES", "Holder", "WatchBudget"]

DEFAULT_WATCH_TOTAL_BYTES = 256 << 20
"""Sixty-four watches holding the whole of a 4 MiB watch budget each; a JSON-RPC
watch holds at most three eighths of it (its read-ahead, once buffered, once
being sent, once collected while joining), so some 170 stalled ones."""


class Holder(Protocol):
    """A watch, as the budget sees it."""

    @property
    def held_bytes(self) -> int:
        """What it holds for its consumer now."""
        ...

    def give_way(self, total: int, limit: int) -> None:
        """Drop everything held and end (the budget has already let go of it
        and of its bytes); ``total`` is the sum that passed ``limit``."""
        ...


class WatchBudget:
    """The bytes all of a log's watches hold, and the limit on them."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the watches' total budget must be positive")
        self.limit = limit
        self.total = 0
        """The sum of every member's ``held_bytes``, kept by :meth:`add`."""
        self._members: set[Holder] = set()

    def __len__(self) -> int:
        return len(self._members)

    def join(self, holder: Holder) -> None:
        """``holder`` counts from now; it holds nothing yet."""
        self._members.add(holder)

    def leave(self, holder: Holder) -> None:
        """``holder`` counts no more, nor what it still holds."""
        if holder in self._members:
            self._members.discard(holder)
            self.total -= holder.held_bytes

    def add(self, n: int) -> None:
        """A member holds ``n`` bytes more (fewer when negative); past the
        limit, the members holding the most give way until it is met."""
        self.total += n
        if n > 0 and self.total > self.limit:
            self._relieve()

    def _relieve(self) -> None:
        members = self._members
        while self.total > self.limit and members:
            biggest = max(members, key=_held)
            held = biggest.held_bytes
            if held <= 0:
                return
            members.discard(biggest)
            total, self.total = self.total, self.total - held
            biggest.give_way(total, self.limit)


def _held(holder: Holder) -> int:
    return holder.held_bytes
