"""Record ids in order, so that a ranking can cut its ties without sorting them.

The ranking orders hits that tie on every numeric key (exactness, score,
event time) by id, then by stream order. A stream whose records share one
event time and match a query equally (coarse timestamps, a common word) ties
on all of those for every match, and ordering them by id would build and sort
a Python row per match on the event loop: about 3 us a record, a second and
a half for 500,000 matches, which a search cannot spend in front of its
deadline. So the index keeps each record's rank by (id, record number), and
the ranking keeps the best few by that rank with numpy.

Rules:

* Records fall in fixed blocks of ``BLOCK`` records by number. A record's
  rank orders it within its block only: ranks of two blocks are not
  comparable, so :func:`best` keeps the best ``k`` of every block and leaves
  the exact order of those few to the caller, which compares the ids.
* Ids compare as Python strings: by code point, which for UTF-8 text is the
  byte order the reference sorts by.
* The build brings the ranks up to date before it publishes a generation
  (:meth:`IdOrder.extend`, off the event loop), so a search never computes
  them. A block that grows gets new arrays, merged from the old ones: the
  ones a reader holds are never changed in place, and ranks computed over
  more records order the records of an older generation the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BLOCK = 65_536


@dataclass(frozen=True, slots=True)
class _Block:
    ranks: np.ndarray  # int32: each local record's place in (id, record) order
    # What growing the block takes, dropped once it is full (4 bytes a record
    # kept, not 20): the ids in that order (object), and the local record
    # number at each place (int64).
    ids: np.ndarray | None
    order: np.ndarray | None

    @property
    def count(self) -> int:
        return len(self.ranks)


def _block(sorted_ids: np.ndarray, order: np.ndarray) -> _Block:
    ranks = np.empty(len(order), dtype=np.int32)
    ranks[order] = np.arange(len(order), dtype=np.int32)
    if len(order) >= BLOCK:
        return _Block(ranks, None, None)
    return _Block(ranks, sorted_ids, order)


def _grown(block: _Block | None, ids: Sequence[str], start: int) -> _Block:
    """``block`` (local records ``[0, start)``) with ``ids`` appended after them."""
    new = np.empty(len(ids), dtype=object)
    new[:] = ids
    by_id = np.argsort(new, kind="stable")
    new_sorted, new_order = new[by_id], by_id.astype(np.int64) + start
    if block is None or not block.count:
        return _block(new_sorted, new_order)
    assert block.ids is not None and block.order is not None  # only a full block drops them
    # An id equal to one already held goes after it: records tie on stream order.
    at = np.searchsorted(block.ids, new_sorted, side="right")
    return _block(np.insert(block.ids, at, new_sorted), np.insert(block.order, at, new_order))


class IdOrder:
    """The ranks of an Index's records. One writer (the build), any readers."""

    def __init__(self) -> None:
        self._blocks: list[_Block] = []

    @property
    def count(self) -> int:
        """How many records (from 0 on) have ranks."""
        if not self._blocks:
            return 0
        return (len(self._blocks) - 1) * BLOCK + self._blocks[-1].count

    def extend(self, ids: Sequence[str]) -> None:
        """Rank the records of ``ids`` (every record of the index, in order)
        past those ranked already."""
        self._rank(ids, 0, len(ids))

    def extend_new(self, ids: Sequence[str], new: list[str]) -> None:
        """Rank ``new``, the ids just appended at the end of ``ids``, from
        that list: an index holds its ids compactly (``idlist``), and reading
        a million back as strings took a restart 0.1-0.3 s. When records
        before them are not ranked yet, this leaves them all to ``extend``."""
        first = len(ids) - len(new)
        if new and self.count == first:
            self._rank(new, first, len(ids))

    def _rank(self, source: Sequence[str], first: int, end: int) -> None:
        """Rank records up to ``end``; ``source[i]`` is record ``first + i``'s id."""
        done = self.count
        while done < end:
            b, local = divmod(done, BLOCK)
            upto = min(end, (b + 1) * BLOCK)
            old = self._blocks[b] if b < len(self._blocks) else None
            grown = _grown(old, source[done - first:upto - first], local)
            if old is None:
                self._blocks.append(grown)
            else:
                self._blocks[b] = grown
            done = upto

    def truncate(self, ids: Sequence[str]) -> None:
        """Forget the ranks of records past ``ids`` (the index was truncated
        to them); a later extend ranks whatever records come there instead."""
        n = len(ids)
        if self.count <= n:
            return
        b, local = divmod(n, BLOCK)
        kept = [_grown(None, ids[b * BLOCK : n], 0)] if local else []
        # One assignment: a reader never finds a block of its records missing.
        self._blocks[b:] = kept

    def block_ranks(self) -> list[np.ndarray]:
        """Each block's ranks (int32, by local record number), for the
        compiled ranking, which keeps the best of each block itself."""
        return [b.ranks for b in self._blocks]

    def best(self, recs: np.ndarray, k: int) -> np.ndarray:
        """Positions in ``recs`` (record numbers, ascending, all ranked) of the
        ``k`` best records of each block by (id, record number): a set that
        holds the ``k`` best of all."""
        bounds = np.searchsorted(recs, np.arange(0, self.count + BLOCK, BLOCK)).tolist()
        out = []
        for b, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            if hi - lo <= k:
                out.append(np.arange(lo, hi))
                continue
            ranks = self._blocks[b].ranks[recs[lo:hi] - b * BLOCK]
            out.append(lo + np.argpartition(ranks, k - 1)[:k])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
