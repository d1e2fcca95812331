"""Whether the SQLite file at the log's path is still the file the log has open.

SQLite holds its database, ``-wal`` and ``-shm`` files open by descriptor. If
someone deletes them (``rm events.db*``) or renames another file over the path
(a restore from backup done under a running daemon), the open connection goes
on writing into the old, now nameless, files: commits succeed, reads serve
them, and all of it is gone when the process exits. Worse, the old ``-wal``
stays at the path beside the new database, and the next opener of the path
applies it to that new file, destroying it.

:class:`DatabaseFile` is the guard of one log's path, shared by its
connections. It records the identity (``st_dev``, ``st_ino``) of the three
files when the first connection opens (and asks SQLite, which compared the path
with its own descriptor's ``fstat`` then, whether it had moved already), and
every store call compares the path with that record before its work (so that
nothing is written through a ``-shm`` that another process no longer shares)
and again after it, before its caller hears the result; an open compares
before it opens. On a mismatch the guard *trips*, for good:

* the call fails with ``source_unavailable`` naming the cause, and so does
  every later call on any of the log's connections (reads included);
* it is logged once, at error level, and :attr:`DatabaseFile.fault` says it
  (``streamd status`` shows it);
* nothing is created or opened at the path again;
* if the database file itself is gone from the path, the old ``-wal`` is
  checkpointed into the old file through the connection's own descriptors and
  truncated (``wal_checkpoint(TRUNCATE)``): a ``-wal`` left beside a restored
  file would otherwise be applied to it by the next opener. Every write of
  that checkpoint goes to a descriptor the connection already holds, never to
  a path. When the ``-wal`` is gone (deleted; or replaced by an empty file,
  which is what another process opening the path meanwhile creates) and the
  ``-shm`` at the path is still ours or gone too, the database at the path is
  still the log's and nobody else indexes its ``-wal``, and what the old
  ``-wal`` holds would be lost at the exit: it is checkpointed into the
  database the same way, so every acknowledged append stays in the log. When
  another process made a ``-shm`` of its own (ours deleted), or the ``-wal``
  was replaced by one that holds frames, it may be writing the file with an
  index of its own, and nothing is checkpointed (with the ``-wal`` still at
  the path, every append made before is read again by the next opener; with
  it gone too, what it held since the last checkpoint is lost, and the error
  says so). The check of the path and the checkpoint are not one step: a
  process that opens the path and restarts the ``-wal`` in between (within
  microseconds) is not caught;
* each connection closes without SQLite's checkpoint-on-close
  (``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE``), which would otherwise try to lock,
  checkpoint and then delete ``-wal`` and ``-shm`` *by path*: files that may
  now belong to the new database.

The window: a commit that lands between the replacement and the check after
it is in the old file (or, when a side file alone changed, may be in the log).
Its callers are never told it was written (the check runs before they are
answered); they get the error, which says which of the two it may be.
Detection is at the next call; a watch open on the log notices sooner,
through inotify on the directory.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import apsw

from streamd import forks
from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.sqlite import inode

__all__ = ["FAULT_REASON", "DatabaseFile", "FileId", "guard_for", "is_file_fault"]

logger = logging.getLogger(__name__)

FAULT_REASON = "database_file_replaced"
"""``data.reason`` of the error a tripped guard answers with."""

_SUFFIXES = ("", "-wal", "-shm")
_ROLE = {"": "database file", "-wal": "write-ahead log", "-shm": "shared-memory index"}


@dataclass(frozen=True, slots=True)
class FileId:
    dev: int
    ino: int

    def __str__(self) -> str:
        return f"device {self.dev} inode {self.ino}"


def is_file_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the error of a tripped :class:`DatabaseFile`."""
    return (
        isinstance(exc, RpcError)
        and isinstance(exc.data, dict)
        and exc.data.get("reason") == FAULT_REASON
    )


def guard_for(path: str) -> DatabaseFile | None:
    """A guard for a file path; none for an in-memory or temporary database
    (``:memory:``, the empty name) or a ``file:`` URI."""
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return DatabaseFile(path)


def _has_moved(db: apsw.Connection) -> bool:
    """SQLite's own comparison of the path with the ``fstat`` of the
    descriptor it opened (``SQLITE_FCNTL_HAS_MOVED``)."""
    moved = ctypes.c_int(0)
    try:
        db.file_control("main", apsw.SQLITE_FCNTL_HAS_MOVED, ctypes.addressof(moved))
    except apsw.Error:
        return False
    return bool(moved.value)


class DatabaseFile:
    """The guard of one SQLite path, shared by the connections of one log.

    Thread-safe: the connections run on their own worker threads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._recorded: dict[str, tuple[int, int] | None] | None = None
        self._fault: RpcError | None = None
        self._lock = forks.Lock()  # free in a forked child (its stale guards are asked)
        # Connections that opened the recorded files: only those may empty
        # the old -wal (a later one may have the new file open).
        self._ours: set[int] = set()
        self._main_gone = False
        self._wal_gone = False  # the -wal alone left the path (see _empty_old_wal)
        self._wal_emptied = False
        self._wal_stuck_said = False  # the failure to empty it is logged once
        self._real = path
        self._paths: list[bytes] = []  # the three files' paths, encoded once

    @property
    def fault(self) -> str | None:
        """Why the log stopped serving, once the guard has tripped."""
        return None if self._fault is None else self._fault.message

    @property
    def error(self) -> RpcError | None:
        return self._fault

    # -- the store's calls --

    def before_open(self) -> None:
        """Refuse to open a connection once the path is not the log's file:
        the new connection would open the new file with the old ``-wal``."""
        if self._fault is not None:
            raise self._fault
        if self._recorded is not None:
            self._compare()

    def opened(self, db: apsw.Connection) -> None:
        """A connection has just opened (and read, so its ``-wal`` is open):
        the first records the files' identity, later ones must match it."""
        if _has_moved(db):
            self._trip(f"the {_ROLE['']} {self.path} was replaced or deleted while it was"
                       " being opened", main_gone=False)
        with self._lock:
            if self._recorded is None:
                # The side files are where SQLite put them: beside the file
                # the path resolves to (a symlinked path's are not beside it).
                self._real = db.db_filename("main") or self.path
                self._paths = [inode.encoded(self._file(s)) for s in _SUFFIXES]
                found = inode.identities(self._paths)
                self._recorded = dict(zip(_SUFFIXES, found, strict=True))
                self._ours.add(id(db))
                return
        self._compare()
        with self._lock:
            self._ours.add(id(db))

    def check(self, db: apsw.Connection) -> None:
        """Before a store call's work, and after it before its caller hears of it."""
        try:
            if self._fault is not None:
                raise self._fault
            if self._recorded is not None:
                self._compare()
        except RpcError:
            self._empty_old_wal(db)
            raise

    def unchanged(self) -> bool:
        """Whether the path still names the files the log opened, asked
        without tripping (a new client deciding whether to share the log's
        connection or open the path anew); raises the ``OSError`` of a path
        that cannot be looked up."""
        if self._fault is not None:
            return False
        if self._recorded is None:
            return True
        return self._first_change() is None

    def old_wal_at_path(self) -> bool:
        """Tripped because the database file left the path, with the old
        ``-wal`` not emptied (its checkpoint found another connection
        reading) and still at the path: opening the path now would apply it
        to the file there. True when the path cannot be looked up."""
        with self._lock:
            if self._fault is None or not self._main_gone or self._wal_emptied:
                return False
            recorded = self._recorded
        if recorded is None or recorded["-wal"] is None:
            return False
        try:
            (now,) = inode.identities(self._paths[1:2])
        except OSError:
            return True
        return now == recorded["-wal"]

    def old_wal_pin(self) -> int | None:
        """A descriptor on the old ``-wal`` while :meth:`old_wal_at_path`
        says it is at the path, else None. Held by whoever goes on asking
        after every connection has closed: its inode cannot be given to
        another file meanwhile (a new ``-wal`` made by another process would
        otherwise take the number, and pass for the old one)."""
        if not self.old_wal_at_path():
            return None
        recorded = self._recorded
        assert recorded is not None  # tripped on a comparison: recorded
        try:
            fd = os.open(self._file("-wal"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        found = os.fstat(fd)
        if (found.st_dev, found.st_ino) != recorded["-wal"]:
            os.close(fd)  # replaced since the look-up
            return None
        return fd

    def closing(self, db: apsw.Connection) -> None:
        """Before a connection closes: a path that is no longer ours must not
        be locked, checkpointed into or unlinked by SQLite's close; nor
        must one that cannot be looked up (a close never fails for it)."""
        unknown = False
        if self._fault is None and self._recorded is not None:
            try:
                self._compare()
            except RpcError:
                pass  # tripped: handled below
            except OSError:
                unknown = True
        if self._fault is not None or unknown:
            if self._fault is not None:
                self._empty_old_wal(db)
            try:
                db.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
            except apsw.Error:
                pass  # already closed
        with self._lock:
            self._ours.discard(id(db))

    def _wal_alone_gone(self) -> bool:
        """Whether our -wal may be emptied into the database at the path: the
        -shm there is still ours (every process on the file shares our index,
        and its locks) or gone, and nothing at the -wal's path holds frames (no file,
        or an empty one: what a process opening the path after the deletion
        makes, and cannot write while the shared index describes our frames)."""
        recorded = self._recorded
        assert recorded is not None  # tripped on a comparison: recorded
        try:
            (shm,) = inode.identities(self._paths[2:3])
            # Absent (deleted with the -wal, say): nobody opened the path
            # since, or there would be a new one.
            if shm is not None and shm != recorded["-shm"]:
                return False
            return os.stat(self._file("-wal")).st_size == 0
        except FileNotFoundError:
            return True
        except OSError:
            return False

    # -- comparing and tripping --

    def _file(self, suffix: str) -> str:
        # The database as the path names it (what a new opener gets), its
        # side files as SQLite named them.
        return self.path if not suffix else self._real + suffix

    def _first_change(
        self,
    ) -> tuple[str, tuple[int, int], tuple[int, int] | None] | None:
        """The first of the three files whose identity at the path is not the
        recorded one: (suffix, recorded, now), or None."""
        recorded = self._recorded
        assert recorded is not None
        # statx for the inode alone, not os.stat (see streamd.eventlog.sqlite.inode);
        # plain tuples compared, a FileId made only to be named in an error.
        for suffix, now in zip(_SUFFIXES, inode.identities(self._paths), strict=True):
            was = recorded[suffix]
            if was is not None and now != was:  # None: absent at the open (never expected)
                return suffix, was, now
        return None

    def _compare(self) -> None:
        change = self._first_change()
        if change is not None:
            suffix, was, now = change
            what = f"the {_ROLE[suffix]} {self._file(suffix)}"
            cause = (
                f"{what} was deleted while streamd had it open"
                if now is None
                else f"{what} was replaced by another file while streamd had it open"
                f" ({FileId(*was)} is now {FileId(*now)})"
            )
            self._trip(cause, main_gone=suffix == "", wal_gone=suffix == "-wal")

    def _trip(self, cause: str, *, main_gone: bool, wal_gone: bool = False) -> None:
        if main_gone:
            kept = (f"What was committed after that is not in the log at {self.path} (an"
                    " append answered with this error was not added to it)")
        elif wal_gone and not self._wal_alone_gone():
            # Another process made a -shm (or a -wal with frames) of its own:
            # ours cannot be emptied into the file without mixing the two.
            kept = ("streamd stopped writing to it. What was acknowledged since the"
                    " database was last checkpointed was in that write-ahead log and is"
                    " lost when streamd exits")
        else:
            # The database at the path is still the log's: what was written is
            # there, or (the -wal gone) emptied into it; only the call that
            # noticed may have written first.
            kept = ("streamd stopped writing to it; what was acknowledged before is kept"
                    " in the log. An append answered with this error may have been added:"
                    " appending it again with the same event id is safe (it is answered"
                    " as a duplicate)")
        with self._lock:
            first = self._fault is None
            if first:
                self._main_gone = main_gone
                self._wal_gone = wal_gone
                self._fault = RpcError(
                    SOURCE_UNAVAILABLE,
                    f"event log unavailable: {cause}. {kept}; streamd neither recreates"
                    " nor touches that path any more: restart streamd (or, in process,"
                    " close the log's clients and open the log again) to serve what is"
                    " there now",
                    {"reason": FAULT_REASON, "path": self.path},
                )
        fault = self._fault
        assert fault is not None
        if first:
            logger.error("EVENT LOG STOPPED: %s", fault.message)
        raise fault

    def _empty_old_wal(self, db: apsw.Connection) -> None:
        """Once the database file has left the path, or the -wal alone has,
        empty our -wal into our database.

        Database gone: our -wal may still sit at the path, beside a restored
        file that the next opener would apply it to. -wal gone: the database
        at the path is ours, and the acknowledged appends our -wal holds would
        go with it at the exit. Checkpointing writes its pages into our
        database through our descriptor and truncates it through our
        descriptor; no path is used. Done by the first of our connections
        that gets here after the trip (a trip found before an open has none
        at hand), again at close if it could not be done then.
        """
        with self._lock:
            if (not (self._main_gone or self._wal_gone) or self._wal_emptied
                    or id(db) not in self._ours):
                return
        if self._wal_gone and not self._wal_alone_gone():
            return  # another process may write the file with an index of its own
        try:
            row = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            assert row is not None  # the pragma always answers one row
            busy = row[0]
        except apsw.Error as exc:
            busy, reason = 1, str(exc)
        else:
            reason = "another process was reading it"
        if not busy:
            self._wal_emptied = True
            return
        # A later call, or the close, tries again; said once, not at every call.
        with self._lock:
            said, self._wal_stuck_said = self._wal_stuck_said, True
        if said:
            logger.debug("the old write-ahead log still could not be emptied (%s)", reason)
        elif self._wal_gone:
            logger.error(
                "the deleted write-ahead log could not be emptied into %s yet (%s): stop"
                " the other processes using it, then stop streamd", self.path, reason)
        else:
            logger.error(
                "the old write-ahead log could not be emptied (%s): before starting"
                " streamd again, remove %s-wal and %s-shm if they are still the old ones",
                reason, self.path, self.path,
            )
