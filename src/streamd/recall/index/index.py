"""The searchable projection of a stream: segments plus per-record columns.

Rules:

* Records are numbered in stream order (0, 1, 2, ...) and never renumbered:
  an incremental pass appends, a rewrite builds a fresh Index. A published
  generation is a :class:`View`: the record count ``n`` and the tuple of
  sealed segments at publication. It stays immutable while later passes
  append past it.
* Postings live in immutable segments (see ``segment``), each covering a
  contiguous run of records. A pass adds records to an open builder and
  seals it when the pass publishes or the builder is full; small tail
  segments from many small passes are merged so a search never walks more
  than a handful of segments per term.
* Per record, the index keeps typed columns (times, offsets, kinds, lengths),
  the id and its rank by id (``idorder``), nothing else: display fields are
  re-read from the file by offset for the few candidates a search renders.

One build runs at a time (the refresh scanner's, in a worker thread) while
searches run on the event loop, and there are no locks, because a reader
only ever touches what a published View covers: a build appends records past
it, truncates only what lies past it, and replaces (never edits) the arrays,
lists' tails and segment tuples it grows, so a View's records, columns and
segments stay exactly as they were when it was published.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streamd.golang import gotime
from streamd.recall.index import segfile
from streamd.recall.index import segment as seg
from streamd.recall.index.idlist import IdList
from streamd.recall.index.idorder import IdOrder
from streamd.recall.index.native import NativeBuilder
from streamd.recall.index.segment import COLUMNS, Segment, SegmentBuilder
from streamd.recall.records import FIELD_WEIGHT, TEXT_WEIGHT, TITLE_WEIGHT
from streamd.recall.tokenize import fold

# A builder seals at this many records.
SEGMENT_RECORDS = 65_536
# Segments fall in size tiers (powers of MERGE_FANOUT records); more than
# MERGE_FANOUT adjacent segments of one tier at the tail are merged into one of
# the next tier. Segments of MERGE_CEILING records or more are never merged,
# so a merge costs at most about MERGE_FANOUT * MERGE_CEILING records.
MERGE_FANOUT = 8
MERGE_CEILING = 32_768
# Records per block of Columns.sec_max.
TIME_BLOCK = 128
# Indexed by weight code; the exact constants the reference multiplies by.
WEIGHTS = np.array([0.0, TEXT_WEIGHT, FIELD_WEIGHT, TITLE_WEIGHT])

# A query term naming a locator's local part, the way Go prints it.
_LOCAL = re.compile(r"v(0|[1-9][0-9]*)/(.+)", re.S)


@dataclass(frozen=True, slots=True)
class Postings:
    """One term's postings visible to a generation, unpacked."""

    recs: np.ndarray  # int64, ascending
    weights: np.ndarray  # float64
    counts: np.ndarray  # int64


def _raw(rows: np.ndarray) -> np.ndarray:
    """Contiguous COLUMNS rows as bytes, a row of them each. Rows are copied
    this way: numpy copies a packed structured array field by field, about
    11 times slower (most of a 1M build's main thread went there)."""
    return rows.view(np.uint8).reshape(len(rows), COLUMNS.itemsize)


class Columns:
    """Growable structured array of COLUMNS rows; ``view(n)`` is the first n.

    Beside the rows it keeps the greatest event second of every
    ``TIME_BLOCK`` records: a search whose best so far are all newer than a
    block skips reading that block's times (the rows are the largest memory
    a search over a common term would otherwise stream through)."""

    def __init__(self) -> None:
        self._data = np.zeros(1024, dtype=COLUMNS)
        self.n = 0
        # (maxima, m): maxima[b] >= sec of every record r < m of block b.
        # Replaced whole, never edited, like the rows' array.
        self._sec_max: tuple[np.ndarray, int] = (np.zeros(0, dtype=np.int64), 0)

    def extend(self, rows: np.ndarray) -> None:
        need = self.n + len(rows)
        if need > len(self._data):
            grown = np.zeros(max(need, 2 * len(self._data)), dtype=COLUMNS)
            _raw(grown)[: self.n] = _raw(self._data)[: self.n]
            # Published views keep the old array; their rows are unchanged.
            self._data = grown
        if rows.dtype == COLUMNS:
            _raw(self._data)[self.n : need] = _raw(np.ascontiguousarray(rows))
        else:
            self._data[self.n : need] = rows
        first = self.n // TIME_BLOCK
        self.n = need
        sec = self._data["sec"][first * TIME_BLOCK : need]
        if len(sec):
            tail = np.maximum.reduceat(sec, np.arange(0, len(sec), TIME_BLOCK))
            maxima = np.concatenate([self._sec_max[0][:first], tail])
            self._sec_max = (maxima, need)

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)
        maxima, m = self._sec_max
        self._sec_max = (maxima, min(m, n))

    def sec_max(self) -> tuple[np.ndarray, int]:
        """``(maxima, m)``: ``maxima[b]`` is at least the event second of
        every record ``r < m`` in block ``b`` of ``TIME_BLOCK`` records."""
        return self._sec_max

    def view(self, n: int) -> np.ndarray:
        return self._data[:n]


Sink = Callable[[Segment], Segment]


class _Sealing:
    """A compiled builder being sealed on a thread of its own (``seal_behind``)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.built: Segment | None = None  # the segment as sealed, in memory
        self.kept: Segment | None = None  # what ``_keep`` handed back
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class Index:
    """``sink``, when given, persists each sealed segment and returns the
    copy to keep (mapped from disk).

    A sink that fails (a full disk) never fails a pass: the segment is kept
    in memory, and the sink is not tried again until the pass publishes,
    so a pass pays for at most one failed write while sealing. Publishing
    (``view``) and ``flush`` write every segment still only in memory, in
    order, so once the disk has room again the whole index becomes durable
    and no segment is ever given up on."""

    def __init__(self, sink: Sink | None = None) -> None:
        self.sink = sink
        # Set by a failed write; cleared when a flush tries again.
        self._sink_paused = False
        # Why the last write failed (a full disk, say), for a person told
        # that the index was not saved.
        self.sink_error: OSError | None = None
        self.ids = IdList()  # compact: 18 MB for a million ids, not 65
        self.id_order = IdOrder()  # ranks by id, brought up to date at each view
        self.columns = Columns()
        self.kinds: list[str] = []
        self._kind_codes: dict[str, int] = {}
        self.segments: tuple[Segment, ...] = ()
        # The open segment: plain records go in one by one (``add``); the
        # compiled path feeds whole blocks of lines (``native_builder``). A
        # NativeBuilder's ids reach ``ids`` when it is sealed.
        self._builder: SegmentBuilder | NativeBuilder | None = None
        # Exact identifiers a source adds beyond a record's own id, ref and
        # correlation (the event log's app, user, branch and invocation), for
        # records of the open builder: merged into the segment it seals.
        self._more_recs: list[int] = []
        self._more_keys: list[str] = []
        # A full compiled builder whose seal runs beside the next records
        # (``seal_behind``): its records come right after ``ids``.
        self._sealing: _Sealing | None = None

    def _held(self) -> int:
        """Records in ``ids`` and in a builder being sealed behind."""
        return len(self.ids) + (self._sealing.count if self._sealing is not None else 0)

    def __len__(self) -> int:
        b = self._builder
        return self._held() + (b.count if isinstance(b, NativeBuilder) else 0)

    def kind_code(self, kind: str) -> int:
        code = self._kind_codes.get(kind)
        if code is None:
            code = self._kind_codes[kind] = len(self.kinds)
            self.kinds.append(kind)
        return code

    def add(self, record_id: str, row: tuple, text: list[str], fields: list[str],
            title: list[str], idents: set[str]) -> None:
        # A full segment is sealed when the next record comes (or at the next
        # view), not as its last record goes in: until then that record can
        # still be given identifiers (``add_identifiers``).
        if not isinstance(self._builder, SegmentBuilder) or \
                self._builder.count >= SEGMENT_RECORDS:
            self.seal()  # a compiled builder's records, or a full segment
            self._builder = SegmentBuilder(len(self.ids))
        self.ids.append(record_id)
        self._builder.add(record_id, row, text, fields, title, idents)

    def add_identifiers(self, rec: int, keys: tuple[str, ...]) -> None:
        """More exact identifiers of record ``rec``, which the open builder
        holds (empty keys are skipped)."""
        for key in keys:
            folded = fold(key)
            if folded:
                self._more_recs.append(rec)
                self._more_keys.append(folded)

    def native_builder(self) -> NativeBuilder:
        """The open builder for the compiled path (see ``native``); the caller
        seals the index once it holds ``SEGMENT_RECORDS``."""
        if not isinstance(self._builder, NativeBuilder):
            if self._builder is not None:
                self.seal()  # a plain builder's records
            self._builder = NativeBuilder(self._held())
        return self._builder

    def seal(self) -> None:
        """Make every added record searchable (by the next published View)."""
        self._settle()
        builder, self._builder = self._builder, None
        if builder is None or builder.count == 0:
            return
        if isinstance(builder, NativeBuilder):
            built = builder.seal(self.kind_code)
            self._extend_ids(built.id_list())
        else:
            built = builder.seal()
        if self._more_keys:
            built = seg.with_identifiers(built, self._more_recs, self._more_keys)
            self._more_recs, self._more_keys = [], []
        # Columns from the copy in memory: reading the mapped one would pull
        # its pages into this process's resident set for nothing.
        self.columns.extend(built.columns)
        self.segments = (*self.segments, self._keep(built))

    def seal_behind(self) -> None:
        """``seal`` a full compiled builder on a thread of its own, while the
        caller goes on adding records to the next one: sealing (the arrays
        laid out, the segment written) is a third of a compiled build's
        time, and it needs nothing of the records after it. The segment
        joins ``ids``, ``columns`` and ``segments`` at the next call of this
        thread that needs them (``_settle``), in order, so nothing about it
        differs from ``seal``'s; readers of published views never see it
        before. At most one seal runs behind."""
        self._settle()
        builder = self._builder
        if not isinstance(builder, NativeBuilder) or builder.count == 0:
            self.seal()
            return
        self._builder = None
        recs, keys = self._more_recs, self._more_keys
        self._more_recs, self._more_keys = [], []
        sealing = _Sealing(builder.count)

        def work() -> None:
            try:
                built = builder.seal(self.kind_code)
                if keys:
                    built = seg.with_identifiers(built, recs, keys)
                sealing.built, sealing.kept = built, self._keep(built)
            except BaseException as exc:  # raised again by ``_settle``
                sealing.error = exc

        sealing.thread = threading.Thread(target=work, name="streamd-seal", daemon=True)
        self._sealing = sealing
        sealing.thread.start()

    def _settle(self) -> None:
        """Wait for a seal running behind and take its segment in."""
        sealing, self._sealing = self._sealing, None
        if sealing is None:
            return
        assert sealing.thread is not None
        sealing.thread.join()
        if sealing.error is not None:
            raise sealing.error
        assert sealing.built is not None and sealing.kept is not None
        self._extend_ids(sealing.built.id_list())
        self.columns.extend(sealing.built.columns)
        self.segments = (*self.segments, sealing.kept)

    def _merge_tail(self) -> None:
        while self.segments and self.segments[-1].count < MERGE_CEILING:
            tier = _tier(self.segments[-1].count)
            run = 0
            for s in reversed(self.segments):
                if s.count >= MERGE_CEILING or _tier(s.count) != tier:
                    break
                run += 1
            if run <= MERGE_FANOUT:
                return
            merged = self._keep(seg.merge(list(self.segments[-run:])))
            self.segments = (*self.segments[:-run], merged)

    def absorb(self, segments: list[Segment], kinds: list[str]) -> None:
        """Append segments built elsewhere (numbered from 0, with their own
        kind table) after the records already here."""
        self.seal()
        kind_map = np.array([self.kind_code(k) for k in kinds], dtype=np.int32)
        for s in segments:
            moved = seg.rebased(s, len(self.ids), kind_map)
            # Ids and columns from the copy in memory, before it is written
            # and mapped back (see ``seal``).
            self._extend_ids(moved.id_list())
            self.columns.extend(moved.columns)
            self.segments = (*self.segments, self._keep(moved))

    def _extend_ids(self, new: list[str]) -> None:
        """Append a segment's ids, and rank them while they are at hand as
        strings (``IdOrder.extend_new``)."""
        self.ids.extend(new)
        self.id_order.extend_new(self.ids, new)

    def _keep(self, segment: Segment) -> Segment:
        if self.sink is None or self._sink_paused:
            return segment
        try:
            return self.sink(segment)
        except OSError as exc:
            self._sink_paused = True
            self.sink_error = exc
            return segment

    def flush(self) -> bool:
        """Write every segment still held only in memory, swapping each for
        its copy on disk as it goes; stop at the first failure (the ones
        written stay written). True when every segment is on disk."""
        self._settle()
        if self.sink is None:
            return False
        self._sink_paused = False
        for i, s in enumerate(self.segments):
            if s.path:
                continue
            kept = self._keep(s)
            if self._sink_paused:
                return False
            self.segments = (*self.segments[:i], kept, *self.segments[i + 1 :])
        return True

    def adopt(self, segments: list[Segment], kinds: list[str]) -> None:
        """Start from segments loaded from disk (already durable). Raises
        :class:`~streamd.recall.index.segment.Damaged` for one whose ids or
        kinds cannot be its own; the index is then not to be used."""
        for s in segments:
            kind = s.columns["kind"]
            if len(kind) and (int(kind.min()) < 0 or int(kind.max()) >= len(kinds)):
                raise seg.Damaged(f"{s.path}: a record of an unknown kind")
            self._extend_ids(s.checked_id_list())
            self.columns.extend(s.columns)
            s.copied()
        self.segments = tuple(segments)
        self.kinds = list(kinds)
        self._kind_codes = {k: i for i, k in enumerate(kinds)}

    def truncate(self, n: int) -> None:
        """Forget records ``>= n`` that a failed pass added but never sealed
        into a published View."""
        self._builder = None
        self._more_recs, self._more_keys = [], []
        sealing, self._sealing = self._sealing, None
        if sealing is not None and sealing.thread is not None:
            # Its records all come after the published ones: dropped, and
            # its file (if it was written) is never listed in a manifest.
            sealing.thread.join()
        if len(self.ids) <= n:
            return
        self.ids.truncate(n)
        self.id_order.truncate(self.ids)
        self.columns.truncate(n)
        self.segments = tuple(s for s in self.segments if s.base + s.count <= n)

    def view(self, *, merge: bool = True) -> View:
        """Publish: seal what was added, merge small tail segments and retry
        writing any segment a failed write left in memory. Merging only here
        means a pass that fails never retired anything. ``merge=False`` is for
        a prefix published while its build goes on, which must be quick (a
        merge of the tail can take a second); the build's last view merges."""
        self.seal()
        if merge:
            self._merge_tail()
        self.flush()
        self.id_order.extend(self.ids)
        return View(self, len(self.ids), self.segments)

    def observed_at(self, rec: int) -> int:
        row = self.columns.view(rec + 1)[rec]
        return int(row["obs_sec"]) * gotime.NS + int(row["obs_nsec"])

    def column(self, name: str, rec: int) -> int:
        return int(self.columns.view(rec + 1)[rec][name])


def _covering(segments: tuple[Segment, ...], recs: np.ndarray,
              n: int) -> list[tuple[Segment, tuple[int, int]]]:
    """The segments holding some of ``recs`` (ascending, below ``n`` where
    they count), each with the slice of ``recs`` it covers."""
    out = []
    for s in segments:
        if s.base >= n:
            break
        lo, hi = np.searchsorted(recs, [s.base, min(s.base + s.count, n)]).tolist()
        if lo < hi:
            out.append((s, (lo, hi)))
    return out


def _tier(count: int) -> int:
    tier = 0
    while count >= MERGE_FANOUT:
        count //= MERGE_FANOUT
        tier += 1
    return tier


@dataclass(frozen=True, slots=True)
class View:
    """The index as one generation sees it: records ``< n`` in ``segments``."""

    index: Index
    n: int
    segments: tuple[Segment, ...]

    def keep_mapped_within_budget(self) -> None:
        """Before a search: bound the segments' pages it finds mapped in
        this process (``segfile.keep_within``)."""
        segfile.keep_within(s.file for s in self.segments if s.file is not None)

    @property
    def on_disk(self) -> bool:
        """Whether every segment was written (and is mapped back from disk)."""
        return all(s.path for s in self.segments)

    def _hits(self, term: str) -> list[tuple[Segment, int]]:
        h = np.uint64(seg.term_hash(term))
        out = []
        for s in self.segments:
            if s.base >= self.n:
                break
            local = s.find(h)
            if local >= 0:
                out.append((s, local))
        return out

    def holds(self, term: str) -> bool:
        """Store-wide membership: does any visible record use ``term``?"""
        for s, local in self._hits(term):
            # Only the segment that the view cuts needs its first record read.
            first = s.first(local) if s.base + s.count > self.n else s.base
            if s.holds(local) and first is not None and first < self.n:
                return True
        return False

    def postings(self, term: str) -> Postings | None:
        recs_parts, w_parts, c_parts = [], [], []
        for s, local in self._hits(term):
            recs, meta, lo = s.postings(local)
            if s.base + s.count > self.n:
                keep = int(np.searchsorted(recs, self.n))
                recs, meta = recs[:keep], meta[:keep]
            if not len(recs):
                continue
            recs_parts.append(recs.astype(np.int64))
            w_parts.append(WEIGHTS[meta & 3])
            c_parts.append(s.exact_count(lo + np.arange(len(recs)), meta))
        if not recs_parts:
            return None
        if len(recs_parts) == 1:
            return Postings(recs_parts[0], w_parts[0], c_parts[0])
        return Postings(np.concatenate(recs_parts), np.concatenate(w_parts),
                        np.concatenate(c_parts))

    def lists(self, term: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """``term``'s raw postings, ``(recs, meta)`` per segment in segment
        order, borrowed from the segments (for the compiled ranking, which
        cuts them at ``n`` itself)."""
        out = []
        for s, local in self._hits(term):
            recs, meta, _ = s.postings(local)
            if len(recs):
                out.append((recs, meta))
        return out

    def counts(self, term: str, recs: list[int]) -> list[int]:
        """How often each record of ``recs`` (ascending) holds ``term``: one
        term lookup per segment that covers some of them."""
        out = [0] * len(recs)
        if not recs:
            return out
        h = np.uint64(seg.term_hash(term))
        at = np.asarray(recs, dtype=np.int64)
        for s, (lo, hi) in _covering(self.segments, at, self.n):
            local = s.find(h)
            if local < 0:
                continue
            srecs, meta, first = s.postings(local)
            want = at[lo:hi]
            pos = np.minimum(np.searchsorted(srecs, want), max(len(srecs) - 1, 0))
            held = (srecs[pos] == want) if len(srecs) else np.zeros(len(want), dtype=bool)
            if held.any():
                where = pos[held]
                found = s.exact_count(first + where, meta[where])
                for i, c in zip(np.flatnonzero(held).tolist(), found.tolist(), strict=True):
                    out[lo + i] = c
        return out

    def with_identifier(self, key: str) -> list[int]:
        return self.identified(key).tolist()

    def identified(self, key: str) -> np.ndarray:
        """The records ``key`` (folded) identifies, sorted, as an int64 array:
        a session's may be hundreds of thousands, and a Python int each cost
        a context expand of one of them 0.1 s of the event loop at 300,000."""
        h = np.uint64(seg.term_hash(key))
        parts = []
        for s in self.segments:
            if s.base >= self.n:
                break
            recs = np.asarray(s.identified(h), dtype=np.int64)
            parts.append(recs[recs < self.n])
        out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        out.sort()
        return out

    def exact_hits(self, term: str) -> set[int]:
        """Records whose id, ref, correlation or ``v<schema>/<id>`` equals
        ``term`` under simple case folding."""
        key = fold(term)
        hits = set(self.with_identifier(key))
        m = _LOCAL.fullmatch(key)
        if m is not None:
            schema = int(m.group(1))
            ids = self.index.ids
            for rec in self.with_identifier(m.group(2)):
                if self.index.column("schema", rec) == schema and fold(ids[rec]) == m.group(2):
                    hits.add(rec)
        return hits

    def by_local(self, schema: int, record_id: str) -> int | None:
        """The last record with this exact identity (a later line replaces an
        earlier one)."""
        ids = self.index.ids
        found = None
        for rec in self.with_identifier(fold(record_id)):
            if ids[rec] == record_id and self.index.column("schema", rec) == schema:
                found = rec
        return found

    def first_with_id(self, record_id: str) -> int | None:
        ids = self.index.ids
        for rec in self.with_identifier(fold(record_id)):
            if ids[rec] == record_id:
                return rec
        return None

    def rows(self) -> np.ndarray:
        """Per-record columns of the records < n."""
        return self.index.columns.view(self.n)

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        rows = self.rows()
        return rows["sec"], rows["nsec"]
