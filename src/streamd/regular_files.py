"""Opening a file that must be a regular one, without ever waiting.

A FIFO with no writer blocks a plain ``open`` until one appears, and a device
such as ``/dev/zero`` never ends: either, left where streamd reads a stream, a
checkpoint, a manifest, a segment, its lock file or its stop mark, froze the
event loop (deadlines, cancellation and signals with it) or a client for good.
So such files are opened with ``O_NONBLOCK`` (an open that cannot wait),
checked with ``fstat`` on that descriptor (no window in which the path could be
swapped between the check and the read), and only then set back to blocking.

Standard library only: ``streamd attach`` imports it (through the resident
daemon's paths) on every spawn.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

__all__ = ["NotRegularFile", "open_fd"]


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory (errno EISDIR)."""


def open_fd(
    path: str, flags: int, mode: int = 0o600, *,
    check: Callable[[os.stat_result], None] | None = None,
) -> int:
    """``os.open(path, flags, mode)`` of a regular file, refused with
    :class:`NotRegularFile` otherwise; ``check`` may refuse what ``fstat``
    says besides (by raising). The descriptor is blocking, as a plain open's."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            if stat.S_ISDIR(st.st_mode):
                # EISDIR, as a read of it would fail: callers may word it so.
                raise NotRegularFile(errno.EISDIR, f"{os.path.basename(path)} is a directory")
            raise NotRegularFile(f"{os.path.basename(path)} is not a regular file")
        if check is not None:
            check(st)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
