"""Consuming stream lines into an index: the per-line rules of a build.

Only complete lines are consumed; blank lines are skipped; a line over
1 MiB (after trimming) or one that does not parse counts as failed and never
fails the pass. A record without ``observed_at`` is stamped with the build
time of the generation that first indexes it.
"""

from __future__ import annotations

from collections.abc import Generator

from streamd.golang import gotime
from streamd.recall.index import native, streamfile
from streamd.recall.index.index import Index
from streamd.recall.index.streamfile import Cursor
from streamd.recall.records import MAX_LINE_BYTES, LineError, field_tokens, parse_line, trim_space
from streamd.recall.tokenize import fold

# Lines handled between two yields of a build on the compiled path (about
# 10 ms of work), and on the plain one, whose lines cost 75-85 us each (about
# 20 ms). A build publishes a prefix it is asked for, or stops, only at a
# yield, so a slice is what a request waits on top of the publication itself.
BUILD_SLICE = 2000
PLAIN_SLICE = 250


class Consumer:
    def __init__(self, index: Index, built_at: int, latest: int) -> None:
        self.index = index
        self.built_at = built_at
        self.latest = latest
        # Progress, for people watching a long build.
        self.bytes_done = 0
        self.bytes_start = 0  # already indexed when the pass started (adopted, caught up)
        self.bytes_total = 0  # the stream files' size when the pass started, when known
        self.records_done = 0

    def read_into(
        self, cur: Cursor, file_no: int, end: int | None = None
    ) -> Generator[None, None, None]:
        """Consume ``cur``'s file from its offset (up to ``end``), yielding
        now and then; on the compiled path when it is installed (``native``,
        which builds the same segments), else line by line here."""
        if native.enabled():
            yield from native.read_into(self, cur, file_no, end)
            return
        try:
            lines = streamfile.lines_after(cur.path, cur.offset, end)
            for handled, line in enumerate(lines, start=1):
                cur.offset = line.offset + line.size
                self.bytes_done += line.size
                self.consume(cur, file_no, line)
                if handled % PLAIN_SLICE == 0:
                    yield
        except FileNotFoundError:
            cur.missing = True

    def consume(self, cur: Cursor, file_no: int, line: streamfile.Line) -> None:
        if line.data is None:
            cur.failed += 1
            return
        trimmed = trim_space(line.data)
        if not trimmed:
            return
        if len(trimmed) > MAX_LINE_BYTES:
            cur.failed += 1
            return
        try:
            rec = parse_line(trimmed)
        except LineError:
            # One bad line degrades coverage; it never fails the scan.
            cur.failed += 1
            return
        observed = rec.observed_at if rec.observed_at is not None else self.built_at
        index = self.index
        sec, nsec = divmod(rec.event_time, gotime.NS)
        osec, onsec = divmod(observed, gotime.NS)
        row = (sec, nsec, osec, onsec, rec.schema, index.kind_code(rec.kind), file_no,
               line.offset, line.size)
        text, fields, title = field_tokens(rec)
        idents = {fold(rec.id), fold(rec.ref), fold(rec.correlation)}
        index.add(rec.id, row, text, fields, title, idents)
        if rec.event_time > self.latest:
            self.latest = rec.event_time
        cur.records += 1
        self.records_done += 1
