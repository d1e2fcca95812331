"""The searchable projection of a stream: columns and posting lists, append-only.

Rules:

* Records are numbered in stream order (0, 1, 2, ...) and never renumbered:
  an incremental pass appends, a rewrite builds a fresh Index. A published
  generation is therefore just ``(index, n)``: it sees records ``< n`` and
  stays immutable while later passes append past it.
* Nothing per record is a Python object except its id. Event times, offsets,
  kinds and lengths are typed columns (``array``), and each term's postings
  are one packed ``array('Q')`` of ``rec << 24 | count << 2 | weight code``,
  in record order, so a generation's view of a posting list is a prefix
  found by binary search.
* Display fields (title, text, ...) are not kept: the line is re-read from
  its file by offset when a candidate is rendered. A search touches at most
  its limit of lines; holding every text would cost the whole stream again
  in memory.
* Exact identifiers (id, ref, correlation) are keyed by their simple case
  fold, so the exact-hit partition is a dictionary lookup per query term.

Builds run cooperatively on the event loop, never in a thread, and searches
are synchronous: no numpy view of these arrays outlives the call that made
it, so an append never meets an exported buffer.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass

import numpy as np

from .records import FIELD_WEIGHT, TEXT_WEIGHT, TITLE_WEIGHT, Record, Terms
from .tokenize import fold

NS = 1_000_000_000
REC_SHIFT = 24
COUNT_MASK = (1 << 22) - 1
# Indexed by weight code; the exact constants the reference multiplies by.
WEIGHTS = np.array([0.0, TEXT_WEIGHT, FIELD_WEIGHT, TITLE_WEIGHT])

# A query term naming a locator's local part, the way Go prints it (no
# leading zeros, no sign).
_LOCAL = re.compile(r"v(0|[1-9][0-9]*)/(.+)", re.S)


@dataclass(frozen=True, slots=True)
class Postings:
    """One term's postings visible to a generation, unpacked."""

    recs: np.ndarray  # int64, ascending
    weights: np.ndarray  # float64
    counts: np.ndarray  # int64


class Index:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.sec = array("q")
        self.nsec = array("i")
        self.obs_sec = array("q")
        self.obs_nsec = array("i")
        self.schema = array("b")
        self.kind = array("i")
        self.file = array("i")
        self.offset = array("q")
        self.line_len = array("i")
        self.length = array("i")
        self.kinds: list[str] = []
        self._kind_codes: dict[str, int] = {}
        self.postings: dict[str, array] = {}
        # folded identifier -> record numbers (ascending)
        self.ident: dict[str, array] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def kind_code(self, kind: str) -> int:
        code = self._kind_codes.get(kind)
        if code is None:
            code = self._kind_codes[kind] = len(self.kinds)
            self.kinds.append(kind)
        return code

    def add(
        self, rec: Record, terms: Terms, observed_at: int, file: int, offset: int, line_len: int
    ) -> int:
        n = len(self.ids)
        self.ids.append(rec.id)
        sec, nsec = divmod(rec.event_time, NS)
        self.sec.append(sec)
        self.nsec.append(nsec)
        osec, onsec = divmod(observed_at, NS)
        self.obs_sec.append(osec)
        self.obs_nsec.append(onsec)
        self.schema.append(rec.schema)
        self.kind.append(self.kind_code(rec.kind))
        self.file.append(file)
        self.offset.append(offset)
        self.line_len.append(line_len)
        self.length.append(terms.length)
        base = n << REC_SHIFT
        postings = self.postings
        title, fields = terms.title, terms.fields
        for token, count in terms.counts.items():
            code = 3 if token in title else 2 if token in fields else 1
            packed = base | (count << 2) | code
            plist = postings.get(token)
            if plist is None:
                postings[token] = array("Q", (packed,))
            else:
                plist.append(packed)
        for key in {fold(rec.id), fold(rec.ref), fold(rec.correlation)}:
            if key:
                recs = self.ident.get(key)
                if recs is None:
                    self.ident[key] = array("q", (n,))
                else:
                    recs.append(n)
        return n

    def truncate(self, n: int) -> None:
        """Forget records ``>= n`` (left behind by a build that failed)."""
        if len(self.ids) <= n:
            return
        del self.ids[n:]
        for col in (self.sec, self.nsec, self.obs_sec, self.obs_nsec, self.schema, self.kind,
                    self.file, self.offset, self.line_len, self.length):
            del col[n:]
        cut = n << REC_SHIFT
        for table, limit in ((self.postings, cut), (self.ident, n)):
            for key in [k for k, v in table.items() if v[-1] >= limit]:
                values = table[key]
                keep = next((i for i, v in enumerate(values) if v >= limit), len(values))
                if keep == 0:
                    del table[key]
                else:
                    del values[keep:]

    def event_time(self, rec: int) -> int:
        return self.sec[rec] * NS + self.nsec[rec]

    def observed_at(self, rec: int) -> int:
        return self.obs_sec[rec] * NS + self.obs_nsec[rec]


@dataclass(frozen=True, slots=True)
class View:
    """The index as one generation sees it: records ``< n``."""

    index: Index
    n: int

    def holds(self, term: str) -> bool:
        """Store-wide membership, O(1): does any visible record use ``term``?"""
        plist = self.index.postings.get(term)
        return plist is not None and (plist[0] >> REC_SHIFT) < self.n

    def postings(self, term: str) -> Postings | None:
        plist = self.index.postings.get(term)
        if plist is None or (plist[0] >> REC_SHIFT) >= self.n:
            return None
        packed = np.frombuffer(plist, dtype=np.uint64)
        if (plist[-1] >> REC_SHIFT) >= self.n:
            packed = packed[: np.searchsorted(packed, np.uint64(self.n << REC_SHIFT))]
        packed = packed.astype(np.int64)
        return Postings(
            recs=packed >> REC_SHIFT,
            weights=WEIGHTS[packed & 3],
            counts=(packed >> 2) & COUNT_MASK,
        )

    def count(self, term: str, rec: int) -> int:
        plist = self.index.postings.get(term)
        if plist is None:
            return 0
        packed = np.frombuffer(plist, dtype=np.uint64)
        i = int(np.searchsorted(packed, np.uint64(rec << REC_SHIFT)))
        if i < len(plist) and (plist[i] >> REC_SHIFT) == rec:
            return (plist[i] >> 2) & COUNT_MASK
        return 0

    def with_identifier(self, key: str) -> list[int]:
        recs = self.index.ident.get(key)
        if recs is None:
            return []
        return [r for r in recs if r < self.n]

    def exact_hits(self, term: str) -> set[int]:
        """Records whose id, ref, correlation or ``v<schema>/<id>`` equals
        ``term`` under simple case folding."""
        key = fold(term)
        hits = set(self.with_identifier(key))
        m = _LOCAL.fullmatch(key)
        if m is not None:
            schema = int(m.group(1))
            ids, schemas = self.index.ids, self.index.schema
            for rec in self.with_identifier(m.group(2)):
                if schemas[rec] == schema and fold(ids[rec]) == m.group(2):
                    hits.add(rec)
        return hits

    def by_local(self, schema: int, record_id: str) -> int | None:
        """The last record with this exact identity (a later line replaces an
        earlier one)."""
        ids, schemas = self.index.ids, self.index.schema
        found = None
        for rec in self.with_identifier(fold(record_id)):
            if ids[rec] == record_id and schemas[rec] == schema:
                found = rec
        return found

    def first_with_id(self, record_id: str) -> int | None:
        ids = self.index.ids
        for rec in self.with_identifier(fold(record_id)):
            if ids[rec] == record_id:
                return rec
        return None

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Event time as (seconds, nanoseconds) columns for records < n."""
        sec = np.frombuffer(self.index.sec, dtype=np.int64)[: self.n]
        nsec = np.frombuffer(self.index.nsec, dtype=np.int32)[: self.n]
        return sec, nsec
