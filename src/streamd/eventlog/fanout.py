"""The fan-out: committed entries handed from the writer to the live watches, in memory.

The writer commits a batch and, on the event loop, hands the entries it added
(each encoded once, :class:`~streamd.eventlog.store.Committed`) to every watch
that is caught up; a watch takes the ones its filter matches into its buffer.
No watch reads the store for an entry this process wrote, so a tailing
dashboard costs the writers a filter test and a list append per entry, not a
query.

What memory cannot know is what *other* processes committed. The rule that
keeps every watch gapless is one number, :attr:`Fanout.tail`: the newest seq
such that this fan-out has handed over every entry up to it. A commit whose
``before_seq`` (read inside its transaction) equals the tail is the next thing
that happened to the log, so its entries are all there is and can be handed
over. Any other commit, or :meth:`Fanout.external` (another process's commit,
seen by the log's change watcher), means entries exist that memory never saw:
every watch is *dropped* and reads the store from its cursor, which holds
them all, before it joins again. Dropping is always safe and only costs a
query; handing over is done only when it is provably complete.

The tail also tells when the log went *back*: a log's newest seq never
decreases (a deleted event's seq still counts), so a newest seq read after
every entry up to the tail had committed, and found below it, is another
log's, or this one's restored from an older copy, whose next seqs will name
other events than those already handed over. No watch can continue from
its cursor then: the hub ends them, and :meth:`Fanout.rewind` starts the
tail again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from streamd.eventlog.store import CommitOutcome, Committed

__all__ = ["Fanout", "Subscriber"]


class Subscriber(Protocol):
    """A watch, as the fan-out sees it."""

    def deliver(self, entries: Sequence[Committed], nbytes: int) -> None:
        """Take the matching ones of a commit's entries (``nbytes``: their
        ``wire`` sizes added up, once for every watch); never blocks, and drops
        itself (see :meth:`Fanout.drop`) when it cannot take them."""
        ...

    def dropped(self) -> None:
        """Memory can no longer tell this watch everything: read the store."""
        ...


class Fanout:
    """The watches that follow this process's commits live, and the tail."""

    def __init__(self) -> None:
        self._subscribers: set[Subscriber] = set()
        self.tail: int | None = None
        """Every entry up to this seq has been handed over (None: nothing known
        yet, so the first commit drops everyone, who then read the store)."""

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self, sub: Subscriber) -> None:
        self._subscribers.add(sub)

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    def drop(self, sub: Subscriber) -> None:
        """One watch leaves the live stream (its buffer is full)."""
        if sub in self._subscribers:
            self._subscribers.discard(sub)
            sub.dropped()

    def committed(self, outcome: CommitOutcome) -> None:
        """A commit of this process's writer, on the event loop right after it."""
        if outcome.entries is not None and outcome.before_seq == self.tail:
            self.tail = outcome.after_seq
            entries = outcome.entries
            if entries:
                nbytes = sum(len(c.wire) for c in entries)
                for sub in list(self._subscribers):
                    sub.deliver(entries, nbytes)
            return
        # Someone else committed before this batch (or its entries were not
        # captured): only the store knows everything now.
        self._advance(outcome.after_seq)

    def external(self, newest_seq: int) -> None:
        """The store's newest seq as read after another process may have
        committed, once this process's own commits up to that read have been
        fanned out: anything past the tail is not ours."""
        if self.tail is None or newest_seq > self.tail:
            self._advance(newest_seq)

    def rewind(self, newest_seq: int) -> None:
        """The log went back to ``newest_seq`` (see the module's text): what was
        handed over is no longer the log's, so every watch leaves the live
        stream and the tail starts again from there."""
        self.tail = newest_seq
        subs, self._subscribers = self._subscribers, set()
        for sub in subs:
            sub.dropped()

    def _advance(self, newest_seq: int) -> None:
        self.tail = newest_seq if self.tail is None else max(self.tail, newest_seq)
        subs, self._subscribers = self._subscribers, set()
        for sub in subs:
            sub.dropped()
