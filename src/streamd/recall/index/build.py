"""Consuming stream lines into an index: the per-line rules of a build,
on the plain path (``Consumer.consume``, line by line) and the compiled one
(``read_blocks``, blocks of lines through ``native.NativeBuilder``).

Only complete lines are consumed; blank lines are skipped; a line over
1 MiB (after trimming) or one that does not parse counts as failed and never
fails the pass. A record without ``observed_at`` is stamped with the build
time of the generation that first indexes it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.golang import gotime
from streamd.recall.index import index as index_module
from streamd.recall.index import native, streamfile
from streamd.recall.index.index import Index
from streamd.recall.index.streamfile import HOLD_LIMIT, Cursor
from streamd.recall.records import MAX_LINE_BYTES, LineError, field_tokens, parse_line, trim_space
from streamd.recall.tokenize import fold

# Lines handled between two yields of a build on the compiled path (about
# 10 ms of work), and on the plain one, whose lines cost 75-85 us each (about
# 20 ms). A build publishes a prefix it is asked for, or stops, only at a
# yield, so a slice is what a request waits on top of the publication itself.
BUILD_SLICE = 2000
PLAIN_SLICE = 250

# Bytes the compiled path reads from the file at a time (about 10k records).
BLOCK_BYTES = 4 << 20


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
        now and then; on the compiled path when it is installed
        (``read_blocks``, which builds the same segments), else line by
        line here."""
        if native.enabled():
            yield from read_blocks(self, cur, file_no, end)
            return
        try:
            lines = streamfile.lines_after(cur.path, cur.offset, end, cur.identity)
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


def read_blocks(
    consumer: Consumer, cur: Cursor, file_no: int, end: int | None = None,
    stop: threading.Event | None = None,
) -> Generator[None, None, None]:
    """``Consumer.read_into`` on the compiled path (``native``): the complete lines of
    ``cur``'s file from its offset (up to ``end``, just after a newline),
    into ``consumer.index``, yielding after every ``BUILD_SLICE`` lines (the
    plain path, eight times slower a line, yields every ``PLAIN_SLICE``).
    Raises RpcError (-32000) for a file that is not readable, with the plain
    reader's words; a missing file sets ``cur.missing``. Returns early once
    ``stop`` is set."""
    name = os.path.basename(cur.path)
    try:
        f = streamfile.open_regular(cur.path, cur.identity)
    except FileNotFoundError:
        cur.missing = True
        return
    except OSError as exc:
        raise streamfile.cannot_open(name, exc) from None
    index = consumer.index
    with f:
        try:
            f.seek(cur.offset)
        except OSError:
            raise RpcError(SOURCE_UNAVAILABLE, f"{name} cannot be positioned") from None
        read_pos = cur.offset  # file offset of the next read
        base = cur.offset  # file offset of data[0]: the first unconsumed line
        data = b""
        skipped = -1  # >= 0 while inside a line too long to hold: its bytes so far
        handled = 0  # lines since the last yield
        while stop is None or not stop.is_set():
            want = BLOCK_BYTES if end is None else min(BLOCK_BYTES, end - read_pos)
            if want <= 0:
                return
            try:
                block = f.read(want)
            except OSError as exc:
                raise streamfile.read_failed(name, exc) from None
            if not block:
                return
            read_pos += len(block)
            if skipped >= 0:
                nl = block.find(b"\n")
                if nl < 0:
                    skipped += len(block)
                    continue
                # The long line ends here; it fails, as it would on the plain path.
                size = skipped + nl + 1
                cur.failed += 1
                consumer.bytes_done += size
                base = cur.offset = base + size
                skipped = -1
                block = block[nl + 1 :]
                handled += 1
                if handled == BUILD_SLICE:
                    handled = 0
                    yield
            data = data + block if data else block
            start = 0
            while True:
                builder = index.native_builder()
                room = index_module.SEGMENT_RECORDS - builder.count
                nxt, lines, records, failed, latest = builder.feed(
                    data, start, base, room, BUILD_SLICE - handled, file_no, consumer.built_at)
                cur.offset = base + nxt
                cur.records += records
                cur.failed += failed
                consumer.bytes_done += nxt - start
                consumer.records_done += records
                if latest is not None and latest > consumer.latest:
                    consumer.latest = latest
                start = nxt
                handled += lines
                if builder.count >= index_module.SEGMENT_RECORDS:
                    index.seal()
                if handled == BUILD_SLICE:
                    handled = 0
                    yield
                    if stop is not None and stop.is_set():
                        return
                elif records < room:
                    break  # no complete line left in data
            base += start
            data = data[start:]
            if len(data) > HOLD_LIMIT:
                skipped, data = len(data), b""
