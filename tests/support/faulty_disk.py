"""A disk that fails on demand, under SQLite: a VFS over the default one, made
the default while a test runs. ``full``: writes fail as SQLite's own VFS
fails them when ``write()`` answers ENOSPC (``SQLITE_FULL``); ``reads_fail``:
reads past a file's first page raise EIO, from the call site SQLite uses. A
real full or failing disk takes a mount or root-only device tricks, which a
test may not be allowed."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import apsw
import pytest

__all__ = ["FaultyVFS", "faulty_disk"]


class _FaultyFile(apsw.VFSFile):
    def __init__(self, vfs: FaultyVFS, name: apsw.URIFilename | str | None, flags: list[int]):
        super().__init__("unix", name, flags)
        self.vfs = vfs

    def xRead(self, amount: int, offset: int) -> bytes:
        if self.vfs.reads_fail and offset > 0:
            raise OSError(errno.EIO, "Input/output error")
        return super().xRead(amount, offset)

    def xWrite(self, data: bytes, offset: int) -> None:
        if self.vfs.full:
            raise apsw.FullError("database or disk is full")
        super().xWrite(data, offset)


class FaultyVFS(apsw.VFS):
    """The default VFS, failing as its switches say (both off at first)."""

    def __init__(self) -> None:
        self.full = False
        self.reads_fail = False
        super().__init__("streamd-test-faulty", "unix", makedefault=True)

    def xOpen(self, name: apsw.URIFilename | str | None, flags: list[int]) -> apsw.VFSFile:
        return _FaultyFile(self, name, flags)


@pytest.fixture
def faulty_disk() -> Iterator[FaultyVFS]:
    vfs = FaultyVFS()
    try:
        yield vfs
    finally:
        vfs.full = vfs.reads_fail = False
        vfs.unregister()
