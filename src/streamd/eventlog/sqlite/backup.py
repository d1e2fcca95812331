"""A consistent copy of a live SQLite event log (``streamd log backup DEST``).

Copying ``events.db`` with ``cp`` while a daemon writes gives a file that may
be torn, and misses what is still in ``-wal``. The copy here is made through
SQLite, inside one read transaction of the source: it is the log exactly as of
one commit (a prefix of the log: every event up to some seq, nothing after),
whatever commits meanwhile. In WAL mode a reader never blocks the writer, so
appends go on at full rate while it runs; the WAL only grows until the copy
ends (it cannot be checkpointed past an open reader).

Two ways to copy in one transaction (``method``):

* ``"backup"``: SQLite's online backup API in one step (``step(-1)``), a copy
  of the pages. Stepwise backup (a few pages per step, the transaction let go
  between steps) is what the API is usually shown with, and it is not used: a
  write to the source by another connection restarts it from the first page,
  so under a steady writer it never finishes.
* ``"vacuum"``: ``VACUUM INTO``, which rebuilds every table and index into the
  new file: smaller (no free pages) and slower.

``bench/backup_bench.py`` measures both; the default is the one that measured
faster for a log under appends (see docs/operations.md).

The copy is written to a temporary name beside ``DEST``, fsynced, checked
(``PRAGMA quick_check``), and only then linked to ``DEST``: a backup that
fails half way leaves no file that looks like a backup. ``DEST`` must not
exist.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import apsw

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.sqlite.errors import system_errno

__all__ = ["DEFAULT_METHOD", "BackupResult", "Method", "snapshot"]

Method = Literal["backup", "vacuum"]
DEFAULT_METHOD: Method = "backup"


@dataclass(frozen=True, slots=True)
class BackupResult:
    dest: str
    events: int
    newest_seq: int
    bytes: int
    seconds: float


def snapshot(
    source: apsw.Connection,
    dest: str | os.PathLike[str],
    method: Method = DEFAULT_METHOD,
    *,
    before_publish: Callable[[], None] | None = None,
) -> BackupResult:
    """Copy the database of ``source`` (a connection to the live log) to
    ``dest`` as of one commit; raises :class:`RpcError` (never an apsw error).
    ``before_publish`` runs once the copy is complete and checked, before it
    is given the name ``dest``; what it raises leaves nothing there (a log
    read as a snapshot checks that it did not change meanwhile)."""
    try:
        final = Path(dest).expanduser()  # as --db is: '~/b.db' quoted reaches us unexpanded
    except RuntimeError as exc:  # ~name of no user
        raise RpcError(SOURCE_UNAVAILABLE, f"backup to {dest}: {exc}") from None
    try:
        _check_dest(final, source.db_filename("main"))
    except OSError as exc:  # a name too long, a directory we may not search
        raise RpcError(
            SOURCE_UNAVAILABLE, f"backup to {final} failed: {exc.strerror or exc}"
        ) from None
    partial = _partial_name(final)
    started = time.monotonic()
    try:
        _copy(source, partial, method)
        events, newest = _check(partial)
        _fsync(partial)
        if before_publish is not None:
            before_publish()
        _publish(partial, final)
        _fsync(final.parent)
    except apsw.Error as exc:
        raise RpcError(SOURCE_UNAVAILABLE, f"backup to {final} failed: {_reason(exc)}") from None
    except OSError as exc:
        raise RpcError(
            SOURCE_UNAVAILABLE, f"backup to {final} failed: {exc.strerror or exc}"
        ) from None
    finally:
        for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
            _remove(leftover)
    return BackupResult(
        dest=str(final),
        events=events,
        newest_seq=newest,
        bytes=final.stat().st_size,
        seconds=time.monotonic() - started,
    )


def _check_dest(final: Path, live: str) -> None:
    """Refuse a DEST that cannot be a new backup file (``live``: the log's own
    file, as SQLite names it); OSError where even asking fails."""
    if live and (where := final.parent.resolve() / final.name) in _side_files(Path(live)):
        # SQLite owns these names: the next open of the log takes a file at
        # -journal for a rollback journal and deletes it (a backup made there
        # was reported complete, then was gone at the next command).
        raise RpcError(SOURCE_UNAVAILABLE, f"{final} is a name SQLite uses beside the log"
                       f" ({where.name.removeprefix(Path(live).name)}); name the backup"
                       " another way")
    if len(os.fsencode(final.name)) + len("-wal") > _NAME_MAX:
        # SQLite opens a log with its "-wal" beside it: a copy under a longer
        # name could be made, but never opened (verify failed on it).
        raise RpcError(SOURCE_UNAVAILABLE, f"backup to {final}: the name is too long for a log"
                       f" (at most {_NAME_MAX - len('-wal')} bytes, to leave room for SQLite's"
                       " -wal beside it)")
    if final.is_dir():
        raise RpcError(SOURCE_UNAVAILABLE,
                       f"{final} is a directory; name the backup file to create in it")
    if final.exists() or final.is_symlink():
        raise RpcError(SOURCE_UNAVAILABLE, f"{final} exists; a backup never overwrites a file")
    if not final.parent.is_dir():
        what = "is not a directory" if final.parent.exists() else "does not exist"
        raise RpcError(SOURCE_UNAVAILABLE, f"{final.parent} {what}")


def _side_files(live: Path) -> set[Path]:
    real = live.parent.resolve() / live.name
    return {real.with_name(real.name + suffix) for suffix in ("-journal", "-wal", "-shm")}


# A file name's limit in bytes on Linux file systems (NAME_MAX).
_NAME_MAX = 255


def _partial_name(final: Path) -> Path:
    """The temporary name beside ``final``. ``final``'s own name with a dot and
    a suffix, when that fits in a name together with SQLite's ``-wal``: a
    DEST of 240 bytes is a good name, and its partial one was refused with
    "File name too long"."""
    pid = os.getpid()
    mine = f".{final.name}.partial-{pid}"
    if len(os.fsencode(f"{mine}-wal")) <= _NAME_MAX:
        return final.with_name(mine)
    return final.with_name(f".streamd-backup.partial-{pid}")


def _remove(leftover: Path) -> None:
    """Remove what the backup made. One it never made (its directory is on a
    read-only file system, so even the first create failed) raises EROFS,
    not ENOENT, and replaced the backup's own error with a traceback."""
    try:
        leftover.unlink()
    except OSError:
        if os.path.lexists(leftover):
            raise


def _copy(source: apsw.Connection, partial: Path, method: Method) -> None:
    # Private from the first byte, as the log itself is (connection.prepare_file).
    os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    if method == "vacuum":
        source.execute("VACUUM INTO ?", (str(partial),))
        return
    target = apsw.Connection(str(partial))
    try:
        # A scratch file until the rename: no journal and no fsync per page
        # (a failed copy is deleted; the finished one is fsynced whole).
        target.pragma("journal_mode", "off")
        target.pragma("synchronous", "off")
        try:
            with target.backup("main", source, "main") as job:
                job.step(-1)  # one step: one read transaction, never restarted
        except apsw.Error as exc:
            # The kernel's reason (EFBIG, EIO), where SQLite kept it: the
            # step's own message is no help (see _reason).
            if code := system_errno(target, exc):
                raise OSError(code, os.strerror(code)) from None
            raise
    finally:
        target.close()


# SQLite's own words (sqlite3_errstr) for what a copy can run into.
_RESULT_WORDS = {
    apsw.SQLITE_FULL: "database or disk is full",
    apsw.SQLITE_IOERR: "disk I/O error",
    apsw.SQLITE_CANTOPEN: "unable to open database file",
    apsw.SQLITE_READONLY: "attempt to write a readonly database",
    apsw.SQLITE_NOMEM: "out of memory",
    apsw.SQLITE_CORRUPT: "database disk image is malformed",
    apsw.SQLITE_INTERRUPT: "interrupted",
}


def _reason(exc: apsw.Error) -> str:
    """SQLite's words for ``exc``. A failed backup step is worded from the
    copy's connection, whose last message is not the step's: a full disk
    came out as "not an error". Its result code still says what happened."""
    text = str(exc)
    if text != "not an error":
        return text
    code = getattr(exc, "result", None)
    if not isinstance(code, int):
        return type(exc).__name__
    name = apsw.mapping_result_codes.get(code)
    return _RESULT_WORDS.get(code) or (name if isinstance(name, str) else type(exc).__name__)


def _publish(partial: Path, final: Path) -> None:
    """Give the finished copy its name, unless something has it by now. The
    check that ``final`` is free ran before the copy, which takes seconds; a
    rename would replace whatever came meanwhile (a second backup to the same
    name, each then reporting its copy complete). A hard link fails instead;
    the partial name is removed by the caller."""
    try:
        os.link(partial, final)
    except FileExistsError:
        raise RpcError(SOURCE_UNAVAILABLE, f"{final} exists (made while the copy was"
                       " written); a backup never overwrites a file") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        # No hard links on this file system: rename, which can only lose the
        # race above, never anything the first check saw.
        os.rename(partial, final)


def _check(partial: Path) -> tuple[int, int]:
    """The copy reads back whole: (events, newest seq ever given)."""
    db = apsw.Connection(str(partial))
    try:
        problems = [row[0] for row in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise RpcError(
                SOURCE_UNAVAILABLE, f"the copy failed its check: {'; '.join(problems[:5])}"
            )
        events = db.execute("SELECT count(*) FROM events").fetchone()
        newest = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    finally:
        db.close()
    return (events[0] if events else 0), (newest[0] if newest else 0)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
