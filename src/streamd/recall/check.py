"""Why a line of a stream is not a record, and where it is.

The index only counts the lines it cannot read (the wire carries a count, as
the reference's does), and never says why: that would cost the build a
reason for every bad line of a hostile file. A person preparing a stream, or
wondering about ``N lines could not be read as records``, needs each line's
place and reason, so this reads the file again, by the build's own rules
(:mod:`~streamd.recall.index.streamfile` for what a line is,
:mod:`~streamd.recall.records` for what a record is):

* a line over 1 MiB after trimming fails, whatever it holds;
* a blank line is skipped, neither a record nor a failure;
* the last line of a file without a newline is a write in progress to the
  index, which reads it once it ends; said here as a failure, since a file
  handed over that way loses its last record.

``streamd check`` reports every failure; ``index`` and ``search`` ask for the
first few, bounded in bytes read, so a stream whose only bad line is far down
a large file does not cost every search a second full read.

The compiled core's parser is the first look where it is installed (it agrees
with the plain path, its oracle, line for line; ``tests/native/``); the
plain path says why for the lines it refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from streamd.errors import RpcError
from streamd.recall.index import native, streamfile
from streamd.recall.records import MAX_LINE_BYTES, LineError, parse_line, trim_space

# How much of the files ``first_failures`` reads at most, by default.
FIRST_FAILURES_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Failure:
    path: str  # as the person gave it
    line: int  # 1-based
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass(slots=True)
class Tally:
    """What one file's scan has seen so far."""

    path: str
    lines: int = 0  # lines read (blank ones included)
    records: int = 0
    blank: int = 0
    failed: int = 0
    bytes_read: int = 0
    complete: bool = True  # False: stopped before the end (a byte bound)


def reason(data: bytes | None, size: int) -> str | None:
    """Why one line (``data`` as read, its newline included; None when it was
    too long to hold) is not a record; None for a record or a blank line."""
    if data is None:
        return _too_long(size)
    trimmed = trim_space(data)
    if not trimmed:
        return None
    if len(trimmed) > MAX_LINE_BYTES:
        return _too_long(len(trimmed))
    if native.accepts(trimmed):
        return None
    try:
        parse_line(trimmed)
    except LineError as exc:
        return str(exc)
    if native.accepts(trimmed) is False:
        # The plain path reads it and the compiled core does not: a bug, and
        # the index (built by the core) does count the line as failed.
        return "the compiled indexing core refuses it, though the plain path reads it " \
               "(a bug in streamd: please report it with this line)"
    return None


def _too_long(size: int) -> str:
    return f"line is {size:,} bytes, over the {MAX_LINE_BYTES:,}-byte (1 MiB) limit of a record"


def scan(path: str, shown: str, tally: Tally, max_bytes: int | None = None) -> Iterator[Failure]:
    """The failed lines of the file at ``path``, named ``shown``, in order;
    counts go to ``tally`` as they are read. Stops (``tally.complete`` False)
    at the first line that starts past ``max_bytes``. Raises OSError
    (FileNotFoundError included) or RpcError for a file it cannot read."""
    for number, line in enumerate(streamfile.lines_after(path, 0), start=1):
        if max_bytes is not None and line.offset >= max_bytes:
            tally.complete = False
            return
        tally.lines = number
        tally.bytes_read = line.offset + line.size
        why = reason(line.data, line.size)
        if why is not None:
            tally.failed += 1
            yield Failure(shown, number, why)
        elif line.data is not None and not trim_space(line.data):
            tally.blank += 1
        else:
            tally.records += 1
    size = streamfile.file_size(path) or 0
    if size > tally.bytes_read:
        tally.failed += 1
        yield Failure(shown, tally.lines + 1, "the last line has no newline: the index reads a "
                      "line once it ends with one, so this one is not read yet")


def first_failures(
    files: list[tuple[str, str]], limit: int, max_bytes: int = FIRST_FAILURES_BYTES
) -> tuple[list[Failure], bool]:
    """Up to ``limit`` failures of ``files`` ((path, shown) pairs, in order),
    reading at most ``max_bytes`` of them in all; and whether every failure in
    the bytes read was found (False: the bound was reached first). A file
    that cannot be read is passed over: its error is said elsewhere."""
    found: list[Failure] = []
    budget = max_bytes
    for path, shown in files:
        if budget <= 0:
            return found, False
        tally = Tally(path)
        try:
            for failure in scan(path, shown, tally, budget):
                found.append(failure)
                if len(found) >= limit:
                    return found, True
        except (OSError, RpcError):
            continue
        budget -= tally.bytes_read
        if not tally.complete:
            return found, False
    return found, True


__all__ = ["FIRST_FAILURES_BYTES", "Failure", "Tally", "first_failures", "reason", "scan"]
