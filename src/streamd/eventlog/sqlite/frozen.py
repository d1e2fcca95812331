"""A log on a read-only file system, read as the snapshot it is.

SQLite reads a log in WAL mode through its ``-shm``, which it must be able to
create beside the file: on a read-only mount (a file system snapshot, a backup
disk mounted read-only, a container's read-only volume) a normal open fails,
so ``streamd log backup`` could not copy a log off the snapshot it was kept on.

When no ``-wal`` holds commits, the database file alone is the whole log, and
SQLite's ``immutable`` open reads it with no ``-shm`` and no locks. That open
trusts that nothing writes the file meanwhile, which a read-only mount promises
only for itself: the same file may still be written through another, writable
mount (a read-only bind mount of a live log). So the file is looked at again
after the read (the same inode, size and modification time, and still no
``-wal`` beside it): a change fails the command instead of giving a copy or a
verdict of pages read mid-write.

A ``-wal`` that holds commits cannot be read without its ``-shm`` (an
``immutable`` open ignores the WAL, and would silently leave out the newest
events): that case is refused, saying how to read the log (copy its files to a
writable directory). When the ``-shm`` is there too, the normal open already
reads the log (SQLite keeps the shared index in its own memory), and nothing
here is used.
"""

from __future__ import annotations

import errno
import os
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import apsw

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.sqlite.connection import BusyWait, SqliteOptions
from streamd.eventlog.sqlite.errors import translate
from streamd.eventlog.sqlite.schema import refuse_foreign
from streamd.eventlog.sqlite.store import SqliteStore

__all__ = ["FrozenRead", "on_read_only_file_system", "read_frozen"]


def on_read_only_file_system(exc: RpcError) -> bool:
    """Whether a normal open failed because the log's directory is on a
    read-only file system (SQLite could not create the ``-shm``)."""
    return isinstance(exc.data, dict) and exc.data.get("errno") == errno.errorcode[errno.EROFS]


@dataclass(frozen=True, slots=True)
class _Look:
    """What says the file did not change while it was read without locks."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    wal_bytes: int | None  # None: no -wal at all


def _look(path: str) -> _Look:
    st = os.stat(path)
    try:
        wal: int | None = os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        wal = None
    return _Look(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, wal)


@dataclass(frozen=True, slots=True)
class FrozenRead:
    """A log read as a snapshot: its store, and the look that says it did not
    change (see the module docstring)."""

    store: SqliteStore
    path: str
    before: _Look

    def check(self) -> None:
        """:class:`RpcError` if the file changed since it was opened: what was
        read from it must not be trusted (a backup checks this before it puts
        its copy at DEST)."""
        try:
            after: _Look | None = _look(self.path)
        except OSError:
            after = None
        if after != self.before:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"event log database {self.path} changed while it was read as a read-only"
                " snapshot (it is written through another mount): what was read is not"
                " used; copy it with a daemon or command that can open it for writing",
            )


@contextmanager
def read_frozen(path: str) -> Iterator[FrozenRead]:
    """The log at ``path`` (on a read-only file system, with no commits in a
    ``-wal``) opened read-only and lock-free; on leaving, :class:`RpcError`
    if the file changed meanwhile (then whatever was read from it must not be
    trusted)."""
    name = os.path.basename(path)
    try:
        before = _look(path)
    except OSError as exc:
        raise RpcError(SOURCE_UNAVAILABLE, f"event log database {path}: {exc.strerror}") from None
    if before.wal_bytes:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"event log database {path}: it is on a read-only file system, and its"
            f" {name}-wal holds commits that SQLite reads only through the {name}-shm it"
            f" would have to create there; copy {name} and {name}-wal to a writable directory"
            " and read the copy",
            {"errno": errno.errorcode[errno.EROFS]},
        )
    read = FrozenRead(_open(path), path, before)
    try:
        yield read
    finally:
        read.store.close()
    read.check()


def _open(path: str) -> SqliteStore:
    # The path is quoted into a URI: '?' and '#' in a file name are its own.
    uri = "file:" + urllib.parse.quote(os.fsencode(os.path.abspath(path))) + "?immutable=1"
    busy = BusyWait(SqliteOptions().busy_timeout_ms)
    try:
        db = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    except apsw.Error as exc:
        raise translate(exc, path=path) from None
    try:
        db.set_busy_handler(busy)
        refuse_foreign(db)
    except BaseException as exc:
        db.close()
        if isinstance(exc, apsw.Error):
            raise translate(exc, path=path) from None
        raise
    # No guard of the file's identity: it watches for a file replaced under
    # a connection that writes, and this one only reads, checked at the end.
    return SqliteStore(db, busy)
