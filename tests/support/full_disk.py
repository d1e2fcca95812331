"""A disk that fills on demand, under SQLite: a VFS over the default one, made
the default while a test runs, whose writes fail as SQLite's own VFS fails
them when ``write()`` answers ENOSPC (``SQLITE_FULL``). A real full file
system takes a mount, which a test may not be allowed to make."""

from __future__ import annotations

from collections.abc import Iterator

import apsw
import pytest

__all__ = ["FullVFS", "full_disk"]


class _FullFile(apsw.VFSFile):
    def __init__(self, vfs: FullVFS, name: apsw.URIFilename | str | None, flags: list[int]):
        super().__init__("unix", name, flags)
        self.vfs = vfs

    def xWrite(self, data: bytes, offset: int) -> None:
        if self.vfs.full:
            # What SQLite's own VFS answers when write() fails with ENOSPC.
            raise apsw.FullError("database or disk is full")
        super().xWrite(data, offset)


class FullVFS(apsw.VFS):
    """The default VFS, whose writes fail as on a full disk while ``full``."""

    def __init__(self) -> None:
        self.full = False
        super().__init__("streamd-test-full", "unix", makedefault=True)

    def xOpen(self, name: apsw.URIFilename | str | None, flags: list[int]) -> apsw.VFSFile:
        return _FullFile(self, name, flags)


@pytest.fixture
def full_disk() -> Iterator[FullVFS]:
    vfs = FullVFS()
    try:
        yield vfs
    finally:
        vfs.unregister()
