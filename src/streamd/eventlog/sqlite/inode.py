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

Python has no ``os.statx`` before 3.15. The compiled core asks for the
guard's three paths in one call (:func:`identities`; glibc's ``statx``
through ctypes costs 1.9 us a path, most of it interpreted glue: the guard's
check after a store call takes 3.1 us so against 9.9); without it, ctypes
calls glibc's ``statx`` (2.28 and later). Where either is missing or the kernel refuses
it (``ENOSYS``, or ``EPERM`` from a seccomp filter) ``os.stat`` answers, as
before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Sequence

from streamd import plain

__all__ = ["device_and_inode", "encoded", "identities"]

# The compiled lookup's interface (its INODE_INTERFACE).
INODE_INTERFACE = 1

try:
    from streamd import _native as _core
except ImportError:  # built without a Rust toolchain: ctypes it is
    _core = None  # type: ignore[assignment]
_compiled: Callable[[list[bytes]], list[tuple[int, int] | int | None]] | None = (
    _core.devices_and_inodes
    if getattr(_core, "INODE_INTERFACE", None) == INODE_INTERFACE
    else None  # an extension older than these sources
)

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


def encoded(path: str) -> bytes:
    """``path`` as :func:`identities` takes it; ``ValueError`` for a path
    holding a NUL byte (C would read a shorter one), as ``os.stat`` raises."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise ValueError("embedded null byte")
    return raw


def identities(paths: Sequence[bytes]) -> list[tuple[int, int] | None]:
    """:func:`device_and_inode` of each path (from :func:`encoded`), by the
    compiled core in one call where it runs."""
    global _compiled
    fn = _compiled
    if fn is not None and not plain.asked():
        out: list[tuple[int, int] | None] = []
        for path, got in zip(paths, fn(list(paths)), strict=True):
            if isinstance(got, int):
                if got in _UNSUPPORTED:
                    _compiled = None  # refused by the kernel or a sandbox: ctypes or stat
                    break
                raise OSError(got, os.strerror(got), os.fsdecode(path))
            out.append(got)
        else:
            return out
    return [device_and_inode(os.fsdecode(p)) for p in paths]
