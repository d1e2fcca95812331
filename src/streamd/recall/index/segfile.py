"""A segment file's postings read for a search with ``pread``, not through its mapping.

Segment files are mapped (``segment.read``), and a search reading a few
kilobytes of one through the mapping left far more than that mapped in the
process: the kernel maps the whole page-cache folio around each fault (64
pages, 256 KB, on the machine the bench runs on; ``MADV_RANDOM`` does not
change it). After the bench's 140 searches of a 1M-record index, 189 of the
index's 262 MB were mapped into the daemon and counted in its resident set,
though each search had read little; 140 MB of it were postings (record
numbers and their counts) and identifier records. Read with ``pread``, what
a search reads is copied from the page cache into arrays that live as long
as the search: the file's pages stay in the page cache (shared,
reclaimable) and out of the process.

Rules:

* Postings and the records of an exact identifier are read from the file;
  the sorted tables that locate them (term and identifier hashes, local ids,
  posting starts: about a fifth of an index) are still searched through the
  mapping. Reading those too (a fence of every 128th hash in memory, one
  block read per lookup) kept them out of the process as well, but made a
  search 1.7-2.5 times slower in process: five reads per segment and term,
  each a system call and a few Python steps.
* The tiny arrays every lookup of a saturated count needs are read once,
  when the file is opened.
* The file stays open as long as the segment is referenced: a merged or
  rewritten index removes files that an older published View may still be
  reading, and an open descriptor keeps an unlinked file readable, as the
  mapping does.
"""

from __future__ import annotations

import os

import numpy as np


class SegmentFile:
    """The open file of one segment and where each of its arrays lies."""

    def __init__(self, path: str, layout: dict[str, tuple[np.dtype, int, int]]) -> None:
        # Unbuffered: every read is one pread of exactly what was asked.
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (lives with the segment)
        self._fd = self._file.fileno()
        self._layout = layout
        self.big_pos = self.read("big_pos")
        self.big_count = self.read("big_count")

    def read(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Elements ``[lo, hi)`` of array ``name`` (a fresh array, not a view
        of the file)."""
        dtype, count, offset = self._layout[name]
        hi = count if hi is None else min(hi, count)
        if hi <= lo:
            return np.zeros(0, dtype=dtype)
        size = dtype.itemsize
        data = os.pread(self._fd, (hi - lo) * size, offset + lo * size)
        if len(data) != (hi - lo) * size:
            raise OSError(f"{self._file.name} is shorter than its header says")
        return np.frombuffer(data, dtype=dtype)


__all__ = ["SegmentFile"]
