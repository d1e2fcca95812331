"""The index of one event log: events in by seq, deletions out, generations published.

Sans-I/O: rows come in (read by the Trio layer, ``source``), generations go
out. Each admitted event becomes one record (``project``) in the same
:class:`~streamd.recall.index.index.Index` a JSONL stream builds, through the
compiled core when it is installed. A record's ``offset`` column holds its
event's seq, so records are in seq order and a seq finds its record by a
binary search.

Rules:

* ``seq`` is how far the log has been read: every event at or below it is
  indexed or was not admitted by the settings. Seqs never move, so an
  incremental pass reads only what comes after.
* Deletes do not move seq. The log records each removed event's seq in
  removal order (``mark``); a catch-up reads the marks after its own and
  marks the records they name as removed, in a mask every search applies.
  An event removed before it was ever read names no record and is skipped.
* One thread mutates at a time (the source serializes its catch-ups), while
  searches read published generations: as in the stream index, a
  generation's view and mask never change after it is published (a new mask
  is a new array).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np

from streamd.eventlog.store import EventRow, EventRows
from streamd.golang import gotime
from streamd.recall.eventlog.project import Projected, identifiers, project
from streamd.recall.eventlog.settings import LogSettings
from streamd.recall.index import index as index_module
from streamd.recall.index import native
from streamd.recall.index.build import Consumer
from streamd.recall.index.index import Index, Sink, View
from streamd.recall.index.segment import Segment
from streamd.recall.index.streamfile import Cursor, Line

__all__ = ["LogGeneration", "LogIndex", "SavedPosition"]


def _seq_of(row: EventRow) -> int:
    return row[0]


# An event row's types as streamd writes them (``state_delta`` may be NULL).
# A SQLite column holds any type, so another program or a damaged page can
# leave text in ``event_time`` or a blob in ``content``: both projections
# raised on such a row (a TypeError), which failed the whole round.
_ROW_TYPES = frozenset({
    (int, str, str, str, str, str, str, str, int, str, str),
    (int, str, str, str, str, str, str, str, int, str, type(None)),
})


class SavedPosition(msgspec.Struct, kw_only=True):
    """What a saved index says of where it stood (in the workdir's manifest)."""

    seq: int
    mark: int
    last_id: str
    latest: int
    failed: int
    gen: int
    removed: bytes  # the removed mask, packed a bit per record


@dataclass(slots=True)
class LogGeneration:
    """One published state of the index; never changed once published."""

    gen: int
    view: View
    seq: int
    mark: int
    removed: np.ndarray  # bool per record: taken back by a delete
    removed_count: int
    failed: int
    built_at: int
    latest: int
    behind: int = 0  # events known to be past ``seq`` when published (a prefix)

    @property
    def name(self) -> str:
        return f"gen-{self.gen}"

    @property
    def indexed(self) -> int:
        return self.view.n - self.removed_count

    @property
    def complete(self) -> bool:
        return not self.failed and not self.behind

    @property
    def coverage(self) -> str:
        return "complete" if self.complete else "partial"

    @property
    def watermark(self) -> str:
        shown = "-" if self.latest == gotime.ZERO_TIME else gotime.format_seconds(self.latest)
        return f"seq={self.seq} events={self.indexed} latest={shown}"

    def record_of(self, seq: int) -> int | None:
        """The record of the event at ``seq``, if it was indexed."""
        seqs = self.view.rows()["offset"]
        i = int(np.searchsorted(seqs, seq))
        return i if i < len(seqs) and int(seqs[i]) == seq else None

    def seq_of(self, rec: int) -> int:
        return self.view.index.column("offset", rec)


class LogIndex:
    """What one source has built of its log (see the module docstring)."""

    def __init__(self, settings: LogSettings, clock: Callable[[], int],
                 sink: Sink | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.index = Index(sink)
        self.seq = 0
        self.mark = 0
        self.failed = 0
        self.latest = gotime.ZERO_TIME
        self.gen = 0
        self.removed = np.zeros(0, dtype=bool)
        self.removed_count = 0
        self.last_id = ""  # the event id at ``seq``: what a restart checks the log still holds
        # Something changed since the last publication (seq moved, a removal
        # or a record found gone): the next catch-up publishes.
        self.dirty = False
        self._pending_removals: list[int] = []
        self.generation: LogGeneration | None = None
        # The plain path's per-line rules, for builds without the compiled core.
        self._consumer = Consumer(self.index, 0, gotime.ZERO_TIME)
        self._cursor = Cursor("")

    def adopt(self, segments: list[Segment], kinds: list[str], at: SavedPosition) -> None:
        """Start from an index a previous process saved."""
        self.index.adopt(segments, kinds)
        self.seq, self.mark, self.last_id = at.seq, at.mark, at.last_id
        self.latest, self.failed, self.gen = at.latest, at.failed, at.gen
        n = len(self.index.ids)
        mask = np.unpackbits(np.frombuffer(at.removed, dtype=np.uint8), count=n).astype(bool)
        if len(mask) < n:
            mask = np.concatenate([mask, np.zeros(n - len(mask), dtype=bool)])
        self.removed, self.removed_count = mask, int(mask.sum())
        self.dirty = True

    def position(self) -> SavedPosition:
        """Where the published generation stands, for a restart to adopt."""
        g = self.generation
        assert g is not None
        return SavedPosition(seq=g.seq, mark=g.mark, last_id=self.last_id, latest=g.latest,
                             failed=g.failed, gen=g.gen, removed=np.packbits(g.removed).tobytes())

    def consume(self, rows: EventRows) -> None:
        """Index the admitted events of ``rows`` (in seq order); ``seq`` moves
        to the last row's. Rows at or below ``seq`` were read already."""
        start = bisect.bisect_right(rows, self.seq, key=_seq_of)
        if start == len(rows):
            return
        last = rows[len(rows) - 1]
        self.seq, self.last_id, self.dirty = last[0], last[4], True
        if isinstance(rows, list):
            # Read through the driver, which gives what the column holds (a
            # page the compiled core read holds the written types only).
            rows, start = self._well_typed(rows, start)
        compiled = native.enabled()
        if compiled and self.settings.admits_all:
            # A page the compiled core read stays in its buffer.
            self._consume_compiled(rows, start)
            return
        fresh = [rows[i] for i in range(start, len(rows))]
        admits = self.settings.admits
        admitted = fresh if self.settings.admits_all else [r for r in fresh if admits(r)]
        if compiled:
            self._consume_compiled(admitted, 0)
        else:
            for row in admitted:
                self._consume_plain(project(row))

    def _well_typed(self, rows: list[EventRow], start: int) -> tuple[list[EventRow], int]:
        """``rows`` from ``start`` without those of types streamd never
        writes, each counted as a failed record (as a stream's line that is
        not a record is), so that the rest of the page is indexed."""
        odd = {i for i in range(start, len(rows)) if tuple(map(type, rows[i])) not in _ROW_TYPES}
        if not odd:
            return rows, start
        self.failed += len(odd)
        return [rows[i] for i in range(start, len(rows)) if i not in odd], 0

    def _consume_compiled(self, rows: EventRows, start: int) -> None:
        # The compiled core projects and indexes whole runs of rows; a row it
        # leaves to the plain projection is fed to it as a line.
        built_at = self.clock()
        index = self.index
        i = start
        while i < len(rows):
            builder = index.native_builder()
            room = index_module.SEGMENT_RECORDS - builder.count
            i, _, failed, latest, declined = builder.feed_events(rows, i, room, built_at)
            self.failed += failed
            if latest is not None and latest > self.latest:
                self.latest = latest
            if declined:
                p = project(rows[i])
                _, _, records, failed, latest = builder.feed(p.line, 0, p.seq, 1, 1, 0, built_at)
                if records:
                    index.add_identifiers(len(index) - 1, identifiers(p))
                    if latest is not None and latest > self.latest:
                        self.latest = latest
                self.failed += failed
                i += 1
            if builder.count >= index_module.SEGMENT_RECORDS:
                # Sealed beside the next pages (``Index.seal_behind``).
                index.seal_behind()

    def _consume_plain(self, p: Projected) -> None:
        before = self._cursor.records
        self._cursor.failed = 0
        self._consumer.consume(self._cursor, 0, Line(p.seq, p.line, len(p.line)))
        self.failed += self._cursor.failed
        if self._cursor.records > before:
            # The plain builder's ids reach the index as they are added.
            self.index.add_identifiers(len(self.index.ids) - 1, identifiers(p))
            self.latest = max(self.latest, self._consumer.latest)

    def remove(self, removals: list[tuple[int, int]]) -> None:
        """The log's deletion signal since ``mark``: (mark, seq) pairs."""
        if removals:
            self._pending_removals.extend(seq for _, seq in removals)
            self.mark = max(self.mark, removals[-1][0])
            self.dirty = True

    def publish(self, behind: int = 0) -> LogGeneration:
        """Seal what was consumed, apply the removals read, and publish."""
        view = self.index.view(merge=not behind)
        mask = self.removed
        if len(mask) < view.n or self._pending_removals:
            grown = np.zeros(view.n, dtype=bool)
            grown[: len(mask)] = mask
            mask = grown
        if self._pending_removals:
            seqs = view.rows()["offset"]
            wanted = np.array(self._pending_removals, dtype=np.int64)
            at = np.searchsorted(seqs, wanted)
            inside = at < len(seqs)
            hit = at[inside][seqs[at[inside]] == wanted[inside]]
            mask[hit] = True
            self._pending_removals = []
        self.removed, self.removed_count = mask, int(mask.sum())
        self.gen += 1
        self.dirty = False
        self.generation = LogGeneration(
            gen=self.gen, view=view, seq=self.seq, mark=self.mark, removed=mask,
            removed_count=self.removed_count, failed=self.failed, built_at=self.clock(),
            latest=self.latest, behind=behind,
        )
        return self.generation

    def forget(self, rec: int) -> None:
        """A record whose event is gone though no mark said so (read back
        missing): masked from the next generation on."""
        if self.generation is not None and rec < self.generation.view.n:
            self._pending_removals.append(self.generation.seq_of(rec))
            self.dirty = True
