"""Record ids in stream order, held compactly.

An index keeps every record's id (ranking ties, exact matches, answers), and
as a ``list[str]`` a million ids of 11 characters took 65 MB: a string object
is 49 bytes before its first character, and the list 8 bytes a record more.
Here ids are held in blocks: one string of the block's ids end to end (one
byte a character for ASCII ids) and the end of each id in it (8 bytes), 18
MB for the same million. An id read back is a new string, sliced out of
its block (about half a microsecond), so the hot loops that read many ids
(a search's few candidates, an episode's window) read at most thousands.

Rules:

* Append-only, like the index, with one exception: ``truncate`` (a failed
  pass's records past a published view).
* Published views read ids while a build extends them, without locks: a
  block is never changed once added, the block list is replaced, not
  edited, and ids appended one by one wait in a tail list of their own.
* It equals any sequence of the same strings (``==``), as the list did.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

# Ids appended one at a time (the plain path) are folded into a block of
# their own once this many wait.
TAIL = 4_096


class _Block:
    __slots__ = ("ends", "text")

    def __init__(self, ids: list[str]) -> None:
        self.text = "".join(ids)
        self.ends = np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))

    def __len__(self) -> int:
        return len(self.ends)

    def get(self, i: int) -> str:
        ends = self.ends
        lo = int(ends[i - 1]) if i else 0
        return self.text[lo:int(ends[i])]

    def ids(self, lo: int = 0, hi: int | None = None) -> list[str]:
        ends = self.ends.tolist()
        hi = len(ends) if hi is None else hi
        text = self.text
        start = ends[lo - 1] if lo else 0
        out = []
        for end in ends[lo:hi]:
            out.append(text[start:end])
            start = end
        return out


class _State:
    """One consistent look at an IdList: replaced whole, never edited, but
    for appends to ``tail`` (past every id a published view reads)."""

    __slots__ = ("blocks", "held", "starts", "tail")

    def __init__(self, blocks: tuple[_Block, ...], starts: tuple[int, ...], held: int,
                 tail: list[str]) -> None:
        self.blocks = blocks
        self.starts = starts  # record number of each block's first id
        self.held = held  # ids in blocks
        self.tail = tail


class IdList(Sequence[str]):
    """The ids of an index's records, by record number."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._s = _State((), (), 0, [])
        self.extend(ids)

    def __len__(self) -> int:
        s = self._s
        return s.held + len(s.tail)

    def _add(self, ids: list[str]) -> None:
        """Fold the tail and then ``ids`` into blocks: one new state."""
        s = self._s
        blocks, starts, held = s.blocks, s.starts, s.held
        for part in (s.tail, ids):
            if part:
                starts, blocks = (*starts, held), (*blocks, _Block(part))
                held += len(part)
        self._s = _State(blocks, starts, held, [])

    def append(self, record_id: str) -> None:
        tail = self._s.tail
        tail.append(record_id)
        if len(tail) >= TAIL:
            self._add([])

    def extend(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        if len(ids) < TAIL:
            for record_id in ids:
                self.append(record_id)
            return
        self._add(ids)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        s = self._s
        n = s.held + len(s.tail)
        if isinstance(i, slice):
            return self._range(s, *i.indices(n))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("record number out of range")
        if i >= s.held:
            return s.tail[i - s.held]
        b = bisect_right(s.starts, i) - 1
        return s.blocks[b].get(i - s.starts[b])

    def _range(self, s: _State, lo: int, hi: int, step: int) -> list[str]:
        if step != 1:
            return [self[i] for i in range(lo, hi, step)]
        out: list[str] = []
        if hi <= lo:
            return out
        for start, block in zip(s.starts, s.blocks, strict=True):
            end = start + len(block)
            if end > lo and start < hi:
                out.extend(block.ids(max(lo - start, 0), min(hi, end) - start))
        if hi > s.held:
            out.extend(s.tail[max(lo - s.held, 0):hi - s.held])
        return out

    def __iter__(self) -> Iterator[str]:
        s = self._s
        n = len(s.tail)
        for block in s.blocks:
            yield from block.ids()
        yield from s.tail[:n]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it replaces

    def __repr__(self) -> str:
        return f"IdList({list(self)!r})"

    def truncate(self, n: int) -> None:
        """Forget ids past the first ``n``."""
        s = self._s
        if n >= s.held + len(s.tail):
            return
        if n >= s.held:
            self._s = _State(s.blocks, s.starts, s.held, s.tail[: n - s.held])
            return
        # Blocks wholly before n stay; the one n falls in is rebuilt.
        b = bisect_right(s.starts, n) - 1
        first = s.starts[b]
        keep = self._range(s, first, n, 1)
        self._s = _State(s.blocks[:b], s.starts[:b], first, [])
        self.extend(keep)


__all__ = ["IdList"]
