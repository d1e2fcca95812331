"""What a search leaves mapped of a segment file, and what it reads instead.

Segment files are mapped (``segment.read``), and a search reading a few
kilobytes of one through the mapping leaves far more than that mapped in
the process: the kernel maps the whole page-cache folio around each fault
(64 pages, 256 KB, on the machine the bench runs on; ``MADV_RANDOM`` does
not change it). After the bench's 140 searches of a 1M-record index, 189 of
the index's 262 MB were mapped into the daemon and counted in its resident
set (and PSS), though each search had read little; 140 MB of it were
postings (record numbers and their counts) and identifier records. The
pages are the page cache's either way; what this module bounds is how many
of them the process holds mapped.

Rules:

* A term's postings in a segment are read (``postings``: two ``pread``s
  into arrays that die with the search) when they are short, under
  ``READ_POSTINGS``: through the mapping they would map a folio of each
  array, up to a hundred times what is read. Long ones (a term most records
  hold) are read through the mapping, where a copy would cost more than the
  faults, and so may stay mapped: before each search (``keep_within``) the
  file pages the process has mapped since the last drop are measured
  (``/proc/self/statm``, a few microseconds), and past ``MAPPED_BUDGET`` the
  posting pages of every segment of the index are dropped from the process
  (``MADV_DONTNEED``: a read-only file mapping faults them back in from the
  page cache when they are read again).
* Tried and left: every postings read through ``pread`` (a search over a
  common term 11 % slower in process, the copy of its long lists); every one
  through the mapping under the budget (the budget passed after a few
  searches of middling terms, whose short lists each mapped two folios);
  counting each mapped read against the budget instead of measuring (a loose
  bound: it dropped after almost every search of three terms).
* The records of an exact identifier are read from the file (``read``):
  one read in the few segments that hold the identifier.
* A restart copies every segment's ids and columns into the index: through
  the mapping (as fast as before), then their pages are dropped
  (``Segment.copied``). Reading them with ``pread`` instead cost the
  restart's first answer about 80 ms more: a second copy of the columns.
* The sorted tables that locate postings (term and identifier hashes,
  local ids, posting starts: about a fifth of an index) are searched
  through the mapping and stay mapped. Reading those too (a fence of every
  128th hash in memory, one block read per lookup) kept them out of the
  process as well, but made a search 1.7-2.5 times slower in process: five
  reads per segment and term, each a system call and a few Python steps.
* The tiny arrays every lookup of a saturated count needs are read once,
  when the file is opened.
* A new process adopting a segment checks its arrays against the checksums
  in its header (``unmatched``) by reading the file, never through the
  mapping (``checksum``).
* The file stays open as long as the segment is referenced: a merged or
  rewritten index removes files that an older published View may still be
  reading, and an open descriptor keeps an unlinked file readable, as the
  mapping does: a segment holds two descriptors (its own and the mapping's),
  about 50 for a 1M-record index.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterable

import numpy as np

from streamd.recall.index import checksum

# A term's postings in a segment shorter than this are read (``read``), not
# mapped: 32 KB of record numbers.
READ_POSTINGS = 8_192
# File pages a search may find mapped (since the last drop) before the
# postings of every segment are dropped.
MAPPED_BUDGET = 32 << 20
_PAGE = mmap.PAGESIZE


class _Mapped:
    """File pages this process had mapped after its last drop."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.base: int | None = None
        self.drops = 0  # how many times the budget was passed (for tests)


_mapped = _Mapped()


def _mapped_file_bytes() -> int | None:
    """Bytes of files this process has mapped and resident (Linux), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def keep_within(files: Iterable[SegmentFile]) -> bool:
    """Before a search: drop the posting pages of ``files`` (an index's
    segments) from this process if it has mapped more than ``MAPPED_BUDGET``
    of files since the last drop. Whether it dropped them."""
    now = _mapped_file_bytes()
    if now is None:
        return False
    with _mapped.lock:
        if _mapped.base is None or now < _mapped.base:
            _mapped.base = now
        if now - _mapped.base <= MAPPED_BUDGET:
            return False
        for f in files:
            f.drop_postings()
        _mapped.base = _mapped_file_bytes()
        _mapped.drops += 1
        return True


class SegmentFile:
    """The open file of one segment and where each of its arrays lies."""

    def __init__(self, path: str, layout: dict[str, tuple[np.dtype, int, int]],
                 mapped: mmap.mmap, sums: dict[str, int] | None = None) -> None:
        # Unbuffered: every read is one pread of exactly what was asked.
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (lives with the segment)
        self._fd = self._file.fileno()
        self._layout = layout
        self._mapped = mapped
        # Each array's CRC-32 as the header gives it; None in a file written
        # before segment files had checksums.
        self._sums = sums
        self.big_pos = self.read("big_pos")
        self.big_count = self.read("big_count")
        # Where postings lie, looked up once (``postings`` is a search's
        # most frequent read).
        self._recs_at = layout["recs"][2]
        self._recs_size = layout["recs"][0].itemsize
        self._recs_dtype = layout["recs"][0]
        self._meta_at = layout["meta"][2]
        self._meta_dtype = layout["meta"][0]

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

    def unmatched(self) -> list[str] | None:
        """The arrays whose bytes in the file are not those their checksums
        were taken of, read in bounded chunks and never mapped; None for a
        file that holds no checksums (which is adopted unchecked)."""
        if self._sums is None:
            return None
        names = list(self._layout)
        spans = [(at, count * dtype.itemsize)
                 for dtype, count, at in (self._layout[n] for n in names)]
        found = checksum.file_crc32(self._fd, spans)
        return [n for n, crc in zip(names, found, strict=True) if crc != self._sums[n]]

    def postings(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Record numbers and metadata of postings ``[lo, hi)`` (``read``'s
        two reads, without its checks: the caller has them from ``starts``)."""
        fd, n = self._fd, hi - lo
        recs = os.pread(fd, n * self._recs_size, self._recs_at + lo * self._recs_size)
        meta = os.pread(fd, n, self._meta_at + lo)
        if len(recs) != n * self._recs_size or len(meta) != n:
            raise OSError(f"{self._file.name} is shorter than its header says")
        return np.frombuffer(recs, dtype=self._recs_dtype), np.frombuffer(meta, self._meta_dtype)

    def drop_postings(self) -> None:
        """Drop the pages of this file's postings (record numbers and
        their counts) from this process's mapping."""
        self.drop("recs", "meta")

    def drop(self, *names: str) -> None:
        """Drop the pages of arrays ``names`` (adjacent in the file, in any
        order) from this process's mapping."""
        spans = [(at, at + count * dtype.itemsize)
                 for dtype, count, at in (self._layout[n] for n in names)]
        start = min(a for a, _ in spans) // _PAGE * _PAGE
        end = min(max(b for _, b in spans), len(self._mapped))
        if end > start and not self._mapped.closed:
            self._mapped.madvise(mmap.MADV_DONTNEED, start, end - start)


__all__ = ["MAPPED_BUDGET", "READ_POSTINGS", "SegmentFile", "keep_within"]
