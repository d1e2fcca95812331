"""What a SQLite failure is called when it leaves the store.

SQLite words some failures of the file system as faults of the database: an
EIO while it reads a page of an open database (a disk going bad, a network
or FUSE mount gone dead) is reported as ``database disk image is malformed``
(SQLite turns the read's ``SQLITE_IOERR_CORRUPTFS`` into ``SQLITE_CORRUPT``),
and people then try to repair a file that may be intact. The operating
system's own error is still known (``sqlite3_system_errno``), so it is named
first; SQLite's words follow. An OSError raised under SQLite (a VFS written
in Python re-raises its own) is named the same way.
"""

from __future__ import annotations

import errno
import os

import apsw

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.store.backend import closed_error

# The SQLite errors a failing file system can be behind.
_FILE_SYSTEM_KINDS = (apsw.IOError, apsw.CorruptError, apsw.NotADBError, apsw.CantOpenError,
                      apsw.FullError)


# The errnos of a read that SQLite reports as corruption (SQLITE_IOERR_CORRUPTFS).
_CORRUPTING = frozenset({errno.EIO, errno.ENXIO, errno.ERANGE})


def system_errno(db: apsw.Connection | None, exc: apsw.Error) -> int:
    """The errno behind ``exc`` on ``db`` (0: none known, or not askable from
    this thread). An I/O error's is the connection's last (sqlite3_system_errno);
    SQLite does not record it for the corruption it reports instead of a
    failed read, so that one is asked of the database file itself."""
    if db is None:
        return 0
    try:
        if isinstance(exc, apsw.CorruptError):
            code = _last_file_errno(db)
            return code if code in _CORRUPTING else 0
        value = db.system_errno
    except Exception:  # closed, or an async connection asked off its worker
        return 0
    return value if isinstance(value, int) else 0


def first_failure(exc: apsw.Error) -> apsw.Error:
    """The error a transaction failed with, where the rollback on the way out
    failed after it. On some errors SQLite ends the transaction itself (a full
    disk, or an I/O error, while a large write spills pages before its
    commit); the ``with db:`` rollback then finds none and raises "cannot
    rollback - no transaction is active", which was the error reported, the
    disk's hidden behind it."""
    inner = exc.__context__
    if (isinstance(exc, apsw.SQLError) and isinstance(inner, apsw.Error)
            and "no transaction is active" in str(exc)):
        return inner
    return exc


def probe_errno(path: str | None) -> int:
    """What the operating system says when the database file's header is read
    (0: it reads, or there is no file to read). For a failure to open, where
    SQLite keeps no connection to ask."""
    if not path or path == ":memory:":
        return 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        return exc.errno or 0
    try:
        os.pread(fd, 100, 0)
    except OSError as exc:
        return exc.errno or 0
    finally:
        os.close(fd)
    return 0


def _last_file_errno(db: apsw.Connection) -> int:
    import ctypes

    out = ctypes.c_int(0)
    if not db.file_control("main", apsw.SQLITE_FCNTL_LAST_ERRNO, ctypes.addressof(out)):
        return 0
    return out.value


def _named(code: int) -> str:
    return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"


def _why_errno(path: str) -> int:
    """Why the directory of ``path`` cannot take a new file: EROFS for a
    read-only file system, else EACCES."""
    try:
        rdonly = os.statvfs(os.path.dirname(path) or ".").f_flag & os.ST_RDONLY
    except OSError:
        rdonly = 0
    return errno.EROFS if rdonly else errno.EACCES


def _side_files_refused(path: str) -> str | None:
    """The reason an existing log cannot be opened because SQLite cannot make
    its ``-shm`` beside it (a log in WAL mode is read through that file, even
    by a reader). SQLite's last errno is then the ENOENT of its read-only
    retry, so the message said "No such file or directory" of a file that is
    there; None when that is not the case."""
    directory = os.path.dirname(path) or "."
    if not os.path.isfile(path) or os.path.exists(f"{path}-shm") \
            or os.access(directory, os.W_OK):
        return None
    code = _why_errno(path)
    where = ("is on a read-only file system (EROFS)" if code == errno.EROFS
             else "is not writable by this user (EACCES)")
    # What still works from there: see streamd.eventlog.sqlite.frozen.
    copy = "; `streamd log backup` can copy it from there" if code == errno.EROFS else ""
    return (f"its directory {directory} {where}, and SQLite must create"
            f" {os.path.basename(path)}-shm there to read or write the log{copy}")


def translate(exc: apsw.Error, os_errno: int = 0, path: str | None = None) -> RpcError:
    """The RpcError for ``exc``; ``os_errno`` the connection's
    :func:`system_errno` when it failed; ``path``, the file to name (an open's
    failure reaches a caller who may not know which file that is)."""
    if isinstance(exc, apsw.ConnectionClosedError | apsw.CursorClosedError):
        return closed_error()
    kind = type(exc).__name__
    subject = "event log database error" if path is None else f"event log database {path}"
    if (isinstance(exc, apsw.CantOpenError) and os_errno == errno.ENOENT and path is not None
            and (why := _side_files_refused(path)) is not None):
        return RpcError(SOURCE_UNAVAILABLE, f"{subject}: {why} (SQLite said: {exc})",
                        {"sqlite_error": kind, "errno": errno.errorcode[_why_errno(path)]})
    if os_errno and isinstance(exc, _FILE_SYSTEM_KINDS):
        return RpcError(
            SOURCE_UNAVAILABLE,
            f"{subject}: the file system failed: {_named(os_errno)} (SQLite said: {exc})",
            {"sqlite_error": kind, "errno": errno.errorcode.get(os_errno, str(os_errno))},
        )
    return RpcError(SOURCE_UNAVAILABLE, f"{subject}: {exc}", {"sqlite_error": kind})


def translate_os(exc: OSError) -> RpcError:
    """An OSError that came up through SQLite."""
    code = exc.errno
    if code:
        why = _named(code)
        data = {"errno": errno.errorcode.get(code, str(code))}
    else:
        why, data = str(exc), {}
    return RpcError(SOURCE_UNAVAILABLE, f"event log database error: the file system failed: {why}",
                    data)
