"""The one way a file of the workdir is written: whole, or not at all."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from typing import BinaryIO


def write_atomic(path: str, chunks: Iterable[bytes | memoryview], *,
                 sync_dir: bool = False) -> None:
    """The one way a file of the workdir is written: to ``<path>.tmp``,
    fsynced, then renamed over ``path``, so a file that exists is whole.
    ``sync_dir`` also fsyncs the directory, which makes this rename (and every
    earlier one in that directory) survive a power loss.

    If anything fails (a full disk, a file-size limit, a crash of the
    encoder) the temporary is removed before the error propagates: a disk
    that filled up must not stay full of our half-written files, and the
    file at ``path`` (the last good version) is never touched.
    """
    tmp = path + ".tmp"
    f = _create(tmp)
    try:
        with f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync_dir:
            _fsync_dir(os.path.dirname(path) or ".")
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _create(tmp: str) -> BinaryIO:
    """``tmp`` opened for writing, new or emptied. Without waiting, and a
    regular file only: a FIFO left at that name would block a plain open for
    good (the save, the build behind it, every request waiting on the build).
    It is refused, and left where it is."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC,
                 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EEXIST, "exists and is not a regular file", tmp)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
