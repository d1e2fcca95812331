"""Immutable index segments: the postings of a contiguous run of records.

A segment covers records ``[base, base + count)`` in stream order. Its term
table is keyed by a stable 64-bit hash of the term (BLAKE2b), so a segment
needs no vocabulary object in memory and opens from disk with one ``mmap``:

* ``term_hash``   uint64, one per distinct term, sorted (binary-searched)
* ``term_local``  int32, the local id of the term at each position of ``term_hash``
* ``starts``      int64, postings of local term ``t`` are ``starts[t]:starts[t+1]``
* ``recs``        uint32, record numbers, ascending within a term
* ``meta``        uint8, ``count << 2 | weight code``; a count of 63 or more is
  saturated here and kept exactly in ``big_pos`` / ``big_count``
* ``ident_hash`` / ``ident_rec``: hashes of folded ids, refs and correlations,
  sorted, for the exact-identifier partition

The header gives each array's CRC-32 (``checksum``), taken as the segment
is written and checked when a new process adopts it, before the shape
(``check``); a file written before checksums has none, and is adopted on
its shape alone. The header has a CRC-32 of its own (``segheader``),
checked as the file is opened; a file written before that is adopted on
the checks it had then.

A 64-bit hash collision between two distinct terms is possible in principle
(about one in 10^7 for a billion-term store) and would add a spurious
posting; we accept that rather than hold every term string in memory.

The builder works in batches: records go in one at a time as token lists,
and everything per token after that is numpy.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Iterator
from dataclasses import dataclass, replace

import msgspec
import numpy as np

from streamd.recall.index import checksum, segheader, streamfile
from streamd.recall.index.segfile import READ_POSTINGS, SegmentFile
from streamd.recall.index.segheader import Damaged as Damaged

COUNT_CAP = 63
_FIELD_CODES = np.array([1, 2, 3], dtype=np.uint8)  # text, short fields, title


# Terms repeat across passes (Zipf), so their hashes are cached; the cache is
# dropped whole when it grows past its bound rather than tracked per entry.
_HASH_CACHE: dict[str, int] = {}
_HASH_CACHE_MAX = 1 << 19


def term_hash(term: str) -> int:
    h = _HASH_CACHE.get(term)
    if h is None:
        if len(_HASH_CACHE) >= _HASH_CACHE_MAX:
            _HASH_CACHE.clear()
        digest = hashlib.blake2b(term.encode(), digest_size=8).digest()
        h = _HASH_CACHE[term] = int.from_bytes(digest, "little")
    return h


def hashes(terms: list[str]) -> np.ndarray:
    return np.fromiter(map(term_hash, terms), dtype=np.uint64, count=len(terms))


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    base: int
    count: int
    term_hash: np.ndarray
    term_local: np.ndarray
    starts: np.ndarray
    recs: np.ndarray
    meta: np.ndarray
    big_pos: np.ndarray
    big_count: np.ndarray
    ident_hash: np.ndarray
    ident_rec: np.ndarray
    columns: np.ndarray  # structured, one row per record (COLUMNS)
    ids: np.ndarray  # uint8: the records' ids as a JSON array
    path: str = ""  # the file it was read from; empty while only in memory
    # The file open for searches' reads, which leave the mapping untouched
    # (see ``segfile``); None while only in memory.
    file: SegmentFile | None = None

    def find(self, h: np.uint64) -> int:
        """Local id of the term with hash ``h``, or -1."""
        i = int(np.searchsorted(self.term_hash, h))
        if i < len(self.term_hash) and self.term_hash[i] == h:
            return int(self.term_local[i])
        return -1

    def hashes_by_local(self) -> np.ndarray:
        out = np.empty(len(self.term_hash), dtype=np.uint64)
        out[self.term_local] = self.term_hash
        return out

    def postings(self, local: int) -> tuple[np.ndarray, np.ndarray, int]:
        lo, hi = int(self.starts[local]), int(self.starts[local + 1])
        if self.file is not None and hi - lo < READ_POSTINGS:
            # A short list costs two reads; through the mapping it would
            # map a folio of each array, a hundred times its size.
            return (*self.file.postings(lo, hi), lo)
        return self.recs[lo:hi], self.meta[lo:hi], lo

    def holds(self, local: int) -> bool:
        """Whether local term ``local`` has any posting."""
        return int(self.starts[local + 1]) > int(self.starts[local])

    def first(self, local: int) -> int | None:
        """The first record holding local term ``local``, or None."""
        lo, hi = int(self.starts[local]), int(self.starts[local + 1])
        if lo == hi:
            return None
        return int(self.recs[lo] if self.file is None else self.file.read("recs", lo, lo + 1)[0])

    def exact_count(self, pos: np.ndarray, meta: np.ndarray) -> np.ndarray:
        counts = (meta >> 2).astype(np.int64)
        saturated = np.flatnonzero(counts == COUNT_CAP)
        if len(saturated):
            big_pos, big_count = ((self.big_pos, self.big_count) if self.file is None
                                  else (self.file.big_pos, self.file.big_count))
            at = pos[saturated]
            where = np.searchsorted(big_pos, at)
            # A damaged file may hold no exact count for a saturated one:
            # it stays at the cap (a lower bound) rather than fail a search.
            found = where < len(big_pos)
            found[found] = big_pos[where[found]] == at[found]
            counts[saturated[found]] = big_count[where[found]]
        return counts

    def identified(self, h: np.uint64) -> np.ndarray:
        lo = np.searchsorted(self.ident_hash, h, side="left")
        hi = np.searchsorted(self.ident_hash, h, side="right")
        if self.file is not None:
            return self.file.read("ident_rec", int(lo), int(hi))
        return self.ident_rec[lo:hi]

    def id_list(self) -> list[str]:
        return msgspec.json.decode(self.ids.tobytes(), type=list[str])

    def checked_id_list(self) -> list[str]:
        """:meth:`id_list` of a segment read back: raises :class:`Damaged`
        unless it decodes to exactly ``count`` ids."""
        try:
            ids = self.id_list()
        except msgspec.DecodeError:
            raise Damaged(f"{self.path}: its ids do not decode") from None
        if len(ids) != self.count:
            raise Damaged(f"{self.path}: {len(ids)} ids for {self.count} records")
        return ids

    def copied(self) -> None:
        """Its ids and columns were copied out (an index adopting it): drop
        their pages from this process's mapping (see ``segfile``)."""
        if self.file is not None:
            self.file.drop("ids", "columns")

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in _ARRAYS}


# What is kept per record besides its postings: event and observed time as
# (seconds, nanoseconds), schema, kind code, file number, byte offset and
# length of its line, and its length in tokens.
COLUMNS = np.dtype([
    ("sec", "<i8"), ("nsec", "<i4"), ("obs_sec", "<i8"), ("obs_nsec", "<i4"),
    ("schema", "<i4"), ("kind", "<i4"), ("file", "<i4"), ("offset", "<i8"),
    ("line_len", "<i4"), ("length", "<i4"),
])

# Each array's element type, as every builder (plain, compiled, merged)
# makes it and ``encode`` writes it.
_DTYPES: dict[str, np.dtype] = {
    "term_hash": np.dtype("<u8"), "term_local": np.dtype("<i4"), "starts": np.dtype("<i8"),
    "recs": np.dtype("<u4"), "meta": np.dtype("|u1"), "big_pos": np.dtype("<i8"),
    "big_count": np.dtype("<i8"), "ident_hash": np.dtype("<u8"), "ident_rec": np.dtype("<i8"),
    "columns": COLUMNS, "ids": np.dtype("|u1"),
}
_ARRAYS = tuple(_DTYPES)  # in the order a file holds them


class SegmentBuilder:
    """Accumulates records for one segment. Not thread-safe; not Trio-aware."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.count = 0
        self._vocab: dict[str, int] = {}
        self._tokens: list[str] = []
        self._lens: list[int] = []
        self._idents: list[str] = []
        self._ident_recs: list[int] = []
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._rows: list[tuple] = []
        self._ids: list[str] = []

    def add(
        self, record_id: str, row: tuple, text: list[str], fields: list[str], title: list[str],
        idents: set[str],
    ) -> None:
        """Add one record: its id, its column row (COLUMNS order, ``length``
        last and left out), and its tokens by field."""
        rec = self.base + self.count
        self.count += 1
        self._ids.append(record_id)
        self._rows.append((*row, len(text) + len(fields) + len(title)))
        tokens = self._tokens
        tokens += text
        tokens += fields
        tokens += title
        self._lens += (len(text), len(fields), len(title))
        for key in idents:
            if key:
                self._idents.append(key)
                self._ident_recs.append(rec)
        if len(tokens) >= 1 << 18:
            self._flush()

    def _flush(self) -> None:
        """Turn the pending token lists into (term, rec, meta) arrays."""
        if not self._tokens:
            # Records whose fields hold no token (only lone surrogates, say)
            # add rows but no postings; an empty key array has no first start.
            self._tokens, self._lens = [], []
            return
        vocab = self._vocab
        tokens = self._tokens
        for t in dict.fromkeys(tokens):
            if t not in vocab:
                vocab[t] = len(vocab)
        ids = np.fromiter(map(vocab.__getitem__, tokens), dtype=np.int64, count=len(tokens))
        lens = np.array(self._lens, dtype=np.int64)
        n_recs = len(lens) // 3
        first = self.base + self.count - n_recs
        codes = np.repeat(np.tile(_FIELD_CODES, n_recs), lens)
        recs = np.repeat(np.arange(first, first + n_recs, dtype=np.int64),
                         lens.reshape(-1, 3).sum(axis=1))
        key = (recs << 32) | ids
        order = np.argsort(key, kind="stable")
        key, codes = key[order], codes[order]
        edges = np.flatnonzero(np.diff(key)) + 1
        starts = np.concatenate(([0], edges))
        counts = np.diff(np.concatenate((starts, [len(key)])))
        best = np.maximum.reduceat(codes, starts)
        uniq = key[starts]
        self._parts.append(((uniq & 0xFFFFFFFF), (uniq >> 32), counts * 4 + best))
        self._tokens, self._lens = [], []

    def seal(self) -> Segment:
        self._flush()
        terms = list(self._vocab)
        if self._parts:
            tid = np.concatenate([p[0] for p in self._parts])
            rec = np.concatenate([p[1] for p in self._parts])
            packed = np.concatenate([p[2] for p in self._parts])
        else:
            tid = rec = packed = np.zeros(0, dtype=np.int64)
        order = np.argsort(tid, kind="stable")
        tid, rec, packed = tid[order], rec[order], packed[order]
        starts = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(np.bincount(tid, minlength=len(terms)), out=starts[1:])
        count = packed >> 2
        big = np.flatnonzero(count >= COUNT_CAP)
        meta = (np.minimum(count, COUNT_CAP) << 2 | (packed & 3)).astype(np.uint8)
        th = hashes(terms)
        horder = np.argsort(th)
        ih = hashes(self._idents)
        iorder = np.argsort(ih, kind="stable")
        return Segment(
            base=self.base,
            count=self.count,
            term_hash=th[horder],
            term_local=horder.astype(np.int32),
            starts=starts,
            recs=rec.astype(np.uint32),
            meta=meta,
            big_pos=big.astype(np.int64),
            big_count=count[big].astype(np.int64),
            ident_hash=ih[iorder],
            ident_rec=np.array(self._ident_recs, dtype=np.int64)[iorder],
            columns=np.array(self._rows, dtype=COLUMNS),
            ids=np.frombuffer(msgspec.json.encode(self._ids), dtype=np.uint8),
        )


def with_identifiers(s: Segment, recs: list[int], keys: list[str]) -> Segment:
    """``s`` with more exact identifiers (each ``keys[i]``, folded, naming
    record ``recs[i]``), kept sorted by hash then record, each pair once."""
    h = np.concatenate([s.ident_hash, hashes(keys)])
    r = np.concatenate([s.ident_rec, np.array(recs, dtype=np.int64)])
    order = np.lexsort((r, h))
    h, r = h[order], r[order]
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = (h[1:] != h[:-1]) | (r[1:] != r[:-1])
    return replace(s, ident_hash=h[keep], ident_rec=r[keep], file=None)


def merge(segments: list[Segment]) -> Segment:
    """One segment equal to ``segments`` (adjacent, in order) built together."""
    hash_lists = [s.hashes_by_local() for s in segments]
    all_hashes = np.concatenate(hash_lists)
    uniq, inverse = np.unique(all_hashes, return_inverse=True)
    tids, recs, metas, counts = [], [], [], []
    offset = 0
    for seg, hl in zip(segments, hash_lists, strict=True):
        local_to_global = inverse[offset:offset + len(hl)]
        offset += len(hl)
        per_term = np.diff(seg.starts)
        tids.append(np.repeat(local_to_global, per_term))
        recs.append(seg.recs)
        metas.append(seg.meta)
        counts.append(seg.exact_count(np.arange(len(seg.recs)), seg.meta))
    tid = np.concatenate(tids)
    order = np.argsort(tid, kind="stable")
    tid = tid[order]
    rec = np.concatenate(recs)[order]
    meta = np.concatenate(metas)[order]
    count = np.concatenate(counts)[order]
    starts = np.zeros(len(uniq) + 1, dtype=np.int64)
    np.cumsum(np.bincount(tid, minlength=len(uniq)), out=starts[1:])
    big = np.flatnonzero(count >= COUNT_CAP)
    ids = msgspec.json.encode([i for s in segments for i in s.id_list()])
    ih = np.concatenate([s.ident_hash for s in segments])
    ir = np.concatenate([s.ident_rec for s in segments])
    iorder = np.argsort(ih, kind="stable")
    return Segment(
        base=segments[0].base,
        count=sum(s.count for s in segments),
        term_hash=uniq.astype(np.uint64),
        term_local=np.arange(len(uniq), dtype=np.int32),
        starts=starts,
        recs=rec.astype(np.uint32),
        meta=meta.astype(np.uint8),
        big_pos=big.astype(np.int64),
        big_count=count[big].astype(np.int64),
        ident_hash=ih[iorder],
        ident_rec=ir[iorder],
        columns=np.concatenate([s.columns for s in segments]),
        ids=np.frombuffer(ids, dtype=np.uint8),
    )


def rebased(s: Segment, base: int, kind_map: np.ndarray) -> Segment:
    """``s`` renumbered to start at ``base``, its kind codes mapped through ``kind_map``."""
    columns = s.columns.copy()
    if len(kind_map):
        columns["kind"] = kind_map[columns["kind"]]
    shift = base - s.base
    return replace(
        s,
        base=base,
        # Record numbers are uint32 and wrap as the builders' do: adding
        # the shift modulo 2**32 in uint32 is the sum taken in int64 and
        # cast back, in one pass instead of three over the largest array.
        recs=np.add(s.recs, np.uint32(shift % (1 << 32)), dtype=np.uint32),
        ident_rec=s.ident_rec + shift,
        columns=columns,
        path="",
        file=None,
    )


# --- files ------------------------------------------------------------------


def encode(seg: Segment) -> Iterator[bytes | memoryview]:
    """One file per segment: a header (``segheader``), then the arrays,
    8-byte aligned. The header gives each array's CRC-32, taken over the
    bytes written (in memory: the file is never read back for it). The
    bytes come in pieces (one array at a time, each a view of the array's
    own memory) so a segment is never copied on its way to the file;
    ``durable`` writes them atomically."""
    arrays = {name: np.ascontiguousarray(arr) for name, arr in seg.arrays().items()}
    pieces = {name: arr.view(np.uint8).data for name, arr in arrays.items()}
    layout = []
    offset = 0
    for name, arr in arrays.items():
        layout.append(segheader.Array(name, arr.dtype.str, len(arr), offset,
                                      checksum.crc32(pieces[name])))
        offset += (arr.nbytes + 7) // 8 * 8
    yield segheader.encode(segheader.Header(seg.base, seg.count, layout))
    for piece in pieces.values():
        yield piece
        yield b"\0" * (-len(piece) % 8)


def check(s: Segment) -> None:
    """Raise :class:`Damaged` unless a segment read back is one that was
    written: every array's bytes, the postings too, have the checksums its
    header gives; and it has the shape of one: its arrays' lengths, and the
    values of those a lookup trusts (the sorted hashes, distinct for terms,
    the local ids, the posting starts, the exact counts' places, the
    identifiers' records). A file written before checksums passes on its
    shape alone, so damage to its postings, or damage that leaves a table
    plausible, stays for a search to meet."""
    # The checksums first, before this check's temporaries grow the thread's
    # heap: checked after them, the daemon kept 5 MB more of that heap
    # resident after a 1M restart (free memory under the small blocks the
    # check left higher up; its buffer is mapped apart for the same reason).
    try:
        unmatched = s.file.unmatched() if s.file is not None else None
    except OSError as exc:  # cut short since it was opened, or unreadable
        raise Damaged(f"{s.path} cannot be read to check it ({exc})") from None
    if unmatched:
        raise Damaged(f"{s.path}: its {', '.join(unmatched)} do not match their checksums")
    terms, postings = len(s.term_hash), len(s.recs)

    def sorted_(a: np.ndarray, strict: bool = False) -> bool:
        return len(a) < 2 or bool(np.all(a[1:] > a[:-1] if strict else a[1:] >= a[:-1]))

    def within(a: np.ndarray, lo: int, hi: int) -> bool:
        return not len(a) or (int(a.min()) >= lo and int(a.max()) < hi)

    shaped = (
        s.base >= 0 and s.count >= 0 and len(s.columns) == s.count
        and len(s.term_local) == terms and len(s.starts) == terms + 1
        and len(s.meta) == postings and len(s.big_pos) == len(s.big_count)
        and len(s.ident_hash) == len(s.ident_rec)
    )
    sound = shaped and (
        int(s.starts[0]) == 0 and int(s.starts[-1]) == postings and sorted_(s.starts)
        and within(s.term_local, 0, terms) and sorted_(s.term_hash, strict=True)
        and sorted_(s.ident_hash) and within(s.ident_rec, s.base, s.base + s.count)
        and within(s.big_pos, 0, postings) and sorted_(s.big_pos, strict=True)
    )
    if s.file is not None:
        # What was read here stays in the page cache, not in this process:
        # a restart maps none of a segment until a search asks (about a
        # fifth of an index, 55 MB at 1M, otherwise).
        s.file.drop(*_ARRAYS)
    if not sound:
        raise Damaged(f"{s.path} is damaged")


def read(path: str) -> Segment:
    """Map a segment file, and open it for searches' reads of postings
    (``segfile``). The header is read from the file, not the mapping, which
    would map the first of the term table's pages with it. Raises
    :class:`Damaged` for a header that is not as it was written."""
    with streamfile.open_regular(path) as f:  # a FIFO named there must not block
        header, head_len = segheader.read(path, f)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    specs = {spec.name: spec for spec in header.arrays}
    if len(specs) != len(header.arrays) or specs.keys() != set(_ARRAYS):
        raise Damaged(f"{path}: its header does not name each array once")
    arrays = {}
    layout = {}
    for spec in header.arrays:
        if spec.dtype != _DTYPES[spec.name].str:
            # Checked in a header without a checksum of its own: a '<'
            # flipped to '>' there read every element byte-swapped, from
            # bytes that match their checksum.
            raise Damaged(f"{path}: its {spec.name} are not of type {_DTYPES[spec.name].str}")
        dtype = _DTYPES[spec.name]
        try:
            arrays[spec.name] = np.frombuffer(
                mapped, dtype=dtype, count=spec.len, offset=head_len + spec.offset)
        except ValueError:
            raise Damaged(f"{path}: its {spec.name} run past the end of the file") from None
        layout[spec.name] = (dtype, spec.len, head_len + spec.offset)
    return Segment(base=header.base, count=header.count, path=path,
                   file=SegmentFile(path, layout, mapped, _sums(path, header.arrays)),
                   **arrays)


def _sums(path: str, specs: list[segheader.Array]) -> dict[str, int] | None:
    """Each array's checksum from a header's array specs; None for a file
    written before checksums (no spec has one). A header with some but not
    all is damaged: a file is written whole."""
    found = {spec.name: spec.crc32 for spec in specs}
    if all(v is None for v in found.values()):
        return None
    sums = {name: v for name, v in found.items() if v is not None}
    if len(sums) != len(found):
        raise Damaged(f"{path}: its header's checksums are damaged")
    return sums


__all__ = ["Segment", "SegmentBuilder", "encode", "hashes", "merge", "read", "term_hash"]
