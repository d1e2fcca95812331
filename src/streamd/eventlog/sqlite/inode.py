"""A file's device and inode number, asked of the kernel without its times.

The database guard (:mod:`~streamd.eventlog.sqlite.file_identity`) compares
the path of the database, its ``-wal`` and its ``-shm`` with the files it
opened after every store call: three lookups per append. ``os.stat`` asks for
everything, times included, and since Linux 6.13 a file whose change time was
asked for gets a fine-grained time at its next write (multigrain timestamps).
So every commit then changed the ``-wal``'s times, and on ext4 without a
journal every ``fdatasync`` of the WAL also wrote its inode block: a second
write request per durable append, about 60 us of a 330 us commit on the
development VM. ``statx`` asking only for the inode number leaves the times
coarse, and the WAL's inode is written only when the coarse clock ticks.

Python has no ``os.statx`` before 3.15, so glibc's ``statx`` (2.28 and later)
is called through ctypes; where it is missing or the kernel refuses it
(``ENOSYS``, or ``EPERM`` from a seccomp filter) ``os.stat`` answers, as
before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable

__all__ = ["device_and_inode"]

_AT_FDCWD = -100
_STATX_INO = 0x100
# struct statx (linux/stat.h): stx_ino at byte 32, stx_dev_major and
# stx_dev_minor at 136 and 140; 256 bytes in all. The device is filled
# whatever the mask asks for.
_STATX_SIZE = 256
_INO = struct.Struct("=Q")
_DEV = struct.Struct("=II")
_UNSUPPORTED = {errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP}


def _os_stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _libc_statx() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_statx = _libc_statx()


def device_and_inode(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path`` (symlinks followed), or
    None if nothing is there; other errors raise ``OSError``, as ``os.stat``."""
    global _statx
    fn = _statx
    if fn is None:
        return _os_stat(path)
    encoded = os.fsencode(path)
    if b"\0" in encoded:  # C would read a shorter path: refuse it as os.stat does
        raise ValueError("embedded null byte")
    buf = ctypes.create_string_buffer(_STATX_SIZE)  # one per call: threads share this
    if fn(_AT_FDCWD, encoded, 0, _STATX_INO, buf) == 0:
        (ino,) = _INO.unpack_from(buf, 32)
        major, minor = _DEV.unpack_from(buf, 136)
        return os.makedev(major, minor), ino
    code = ctypes.get_errno()
    if code == errno.ENOENT:
        return None
    if code in _UNSUPPORTED:
        _statx = None  # this kernel or sandbox has no statx: stat from now on
        return _os_stat(path)
    raise OSError(code, os.strerror(code), path)
