"""The one way a file of the workdir is written: whole, or not at all."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import BinaryIO

from streamd import regular_files


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
    regular file only (:mod:`streamd.regular_files`): a FIFO left at that name
    would block a plain open for good (the save, the build behind it, every
    request waiting on the build). It is refused, and left where it is."""
    try:
        fd = regular_files.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    except regular_files.NotRegularFile:
        raise OSError(errno.EEXIST, "exists and is not a regular file", tmp) from None
    return os.fdopen(fd, "wb")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
