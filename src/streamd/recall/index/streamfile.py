"""Stream files: what one gained since its cursor, and lines read back by offset.

Only complete lines are consumed: a last line without ``\\n`` is a write in
progress, so the cursor stops before it and the next pass reads it whole.
The cursor therefore always lands just after a newline (or at 0).

These are plain blocking functions over small reads; the scanner calls them
between checkpoints of the event loop. So no open or read here may wait on
another process: only regular files are read (see ``open_regular``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from streamd import regular_files
from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.regular_files import NotRegularFile

CHUNK = 1 << 20
# A line longer than this is consumed without being held: it fails anyway
# (records are capped at 1 MiB after trimming), and a runaway producer must
# not cost us its whole line in memory.
HOLD_LIMIT = 2 << 20


Identity = tuple[int, int]
"""A file's (device, inode): which file a path named when it was read."""


@dataclass(slots=True)
class Cursor:
    path: str
    offset: int = 0
    records: int = 0
    failed: int = 0
    missing: bool = False
    # The file the pass now reading it started on (see ``Replaced``); never saved.
    identity: Identity | None = None


class Replaced(Exception):
    """The path names another file than the one a pass started reading (it
    was renamed over, say, while the pass read it): what the pass read would
    be of two files, so the pass is abandoned and the build starts over."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


@dataclass(frozen=True, slots=True)
class Line:
    offset: int
    data: bytes | None  # None: too long to hold; counts as a failed record
    size: int


def open_regular(path: str, identity: Identity | None = None) -> BinaryIO:
    """Open a stream file for reading, refusing anything but a regular file.

    A FIFO without a writer blocks ``open`` until one appears, and a device
    such as ``/dev/zero`` never ends: either would freeze the event loop
    that calls us, deadlines, cancellation and signals included. So the
    file is opened with ``O_NONBLOCK`` (an open that cannot wait), checked
    with ``fstat`` on that descriptor (no window in which the path could be
    swapped between the check and the read), and only then read normally.
    Symlinks are followed: what counts is what they point to.

    Raises FileNotFoundError if absent, NotRegularFile for anything that is
    not a regular file, another OSError if it cannot be opened, and
    :class:`Replaced` if ``identity`` is given and the file opened is not it.
    """
    return os.fdopen(_regular_fd(path, identity), "rb")


def identity_of(f: BinaryIO) -> Identity:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino


def _regular_fd(path: str, identity: Identity | None = None) -> int:
    def same_file(st: os.stat_result) -> None:
        if identity is not None and (st.st_dev, st.st_ino) != identity:
            raise Replaced(path)

    return regular_files.open_fd(path, os.O_RDONLY, check=same_file)


# Refusals about the file itself: it exists, and we may not (or cannot) read
# it. Anything else (descriptors or memory run out, an I/O error, a stale
# network mount) is the system failing, and is named, or people go looking
# at the file's permissions while the machine is out of descriptors.
_FILE_REFUSALS = frozenset({
    errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENXIO, errno.ELOOP, errno.ENOTDIR,
    errno.ENAMETOOLONG, errno.EROFS,
})


def cannot_open(name: str, exc: OSError) -> RpcError:
    """Why stream file ``name`` cannot be opened, for a -32000 answer."""
    if exc.errno == errno.EISDIR:
        # The reference opens a directory and fails its first read: its words.
        return RpcError(SOURCE_UNAVAILABLE, f"{name} became unreadable")
    if isinstance(exc, NotRegularFile) or exc.errno is None or exc.errno in _FILE_REFUSALS:
        return RpcError(SOURCE_UNAVAILABLE, f"{name} is not readable")
    code = errno.errorcode.get(exc.errno, str(exc.errno))
    return RpcError(SOURCE_UNAVAILABLE,
                    f"{name} cannot be opened: {os.strerror(exc.errno)} ({code})")


def read_failed(name: str, exc: OSError) -> RpcError:
    """Why a read of stream file ``name`` failed after it was opened."""
    why = f": {os.strerror(exc.errno)} ({errno.errorcode.get(exc.errno, exc.errno)})" \
        if exc.errno else ""
    return RpcError(SOURCE_UNAVAILABLE, f"{name} became unreadable{why}")


def lines_after(path: str, offset: int, end: int | None = None,
                identity: Identity | None = None) -> Iterator[Line]:
    """Complete lines from ``offset`` on (up to ``end``, which must fall just
    after a newline). Raises FileNotFoundError if absent, RpcError(-32000) if
    unreadable.

    Anything that is not a regular file (a directory, a FIFO, a device, a
    socket, or a symlink to one) is unreadable, with the same wording as a
    file we may not open, ``<name> is not readable``: it exists, so calling
    it missing would hide a misconfiguration behind partial coverage, and
    like an unreadable file it fails the pass (health: ``unavailable``,
    reason ``unreachable``). Only the base name is ever reported.
    """
    name = os.path.basename(path)
    try:
        f = open_regular(path, identity)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise cannot_open(name, exc) from None
    try:
        try:
            f.seek(offset)
        except OSError:
            raise RpcError(SOURCE_UNAVAILABLE, f"{name} cannot be positioned") from None
        yield from _split(f, offset, name, end)
    finally:
        f.close()


def _split(f, offset: int, name: str, end: int | None) -> Iterator[Line]:
    pending = bytearray()
    pending_size = 0
    holding = True
    start = offset
    while True:
        want = CHUNK if end is None else min(CHUNK, end - (start + pending_size))
        if want <= 0:
            return
        try:
            chunk = f.read(want)
        except OSError as exc:
            raise read_failed(name, exc) from None
        if not chunk:
            return
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                rest = len(chunk) - pos
                pending_size += rest
                if holding and pending_size <= HOLD_LIMIT:
                    pending += chunk[pos:]
                else:
                    holding = False
                    pending.clear()
                break
            size = pending_size + nl + 1 - pos
            if holding and size <= HOLD_LIMIT:
                data = bytes(pending) + chunk[pos : nl + 1] if pending else chunk[pos : nl + 1]
                yield Line(start, data, size)
            else:
                yield Line(start, None, size)
            start += size
            pending.clear()
            pending_size = 0
            holding = True
            pos = nl + 1


def last_newline_before(path: str, size: int) -> int:
    """Offset just past the last newline in the first ``size`` bytes (0 if none)."""
    with open_regular(path) as f:
        pos = size
        while pos > 0:
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                return pos - step + nl + 1
            pos -= step
    return 0


def file_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def start_pass(cur: Cursor) -> None:
    """Note which file ``cur``'s path names as a pass over it starts: every
    read of the pass must be of that file (``Replaced``)."""
    try:
        st = os.stat(cur.path)
    except OSError:
        cur.identity = None  # missing or unreadable: the reads say so
        return
    cur.identity = st.st_dev, st.st_ino


@dataclass(frozen=True, slots=True)
class Span:
    """Where one indexed line lies: a file and a byte range of it."""

    path: str
    offset: int
    size: int


# What an open for a read-back says of a file that is no longer the one
# indexed: it is gone, or the path names something else now.
_GONE = frozenset({errno.ENOENT, errno.ENOTDIR})


def read_spans(spans: list[Span]) -> list[bytes | None]:
    """Re-read indexed lines for rendering, in one batch: each file is opened
    once. A line is None if it is no longer there (the file is gone, shorter,
    or the path no longer names a regular file): the file changed under the
    index. A file that is there but cannot be read (its permissions taken
    away, descriptors run out, an I/O error) raises RpcError(-32000) saying
    so, as a build's read would: that is no sign the file changed, and
    taking it for one answered "changed under the index" and had the next
    build start over from nothing and report the stream rewritten."""
    fds: dict[str, int | None] = {}
    try:
        out: list[bytes | None] = []
        for span in spans:
            if span.path not in fds:
                try:
                    fds[span.path] = _regular_fd(span.path)
                except NotRegularFile:
                    fds[span.path] = None
                except OSError as exc:
                    if exc.errno not in _GONE:
                        raise cannot_open(os.path.basename(span.path), exc) from None
                    fds[span.path] = None
            fd = fds[span.path]
            data = None
            if fd is not None:
                try:
                    data = os.pread(fd, span.size, span.offset)
                except OSError as exc:
                    raise read_failed(os.path.basename(span.path), exc) from None
            out.append(data if data is not None and len(data) == span.size else None)
        return out
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
