"""Opening a SQLite connection for the event log: the file, the options, the setup.

Setup is a list of small named steps (:data:`CONNECTION_SETUP`), each one
pragma or setting with the reason beside it. :func:`configure` runs them in the
order that matters: the busy handler first, then the refusal of a foreign
database (reads only), then the steps, then (for the writer) the migrations.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import apsw

from streamd.errors import SOURCE_UNAVAILABLE, RpcError, invalid_params
from streamd.eventlog.sqlite.schema import migrate as apply_migrations
from streamd.eventlog.sqlite.schema import refuse_foreign
from streamd.eventlog.store.backend import Synchronous

__all__ = [
    "CONNECTION_SETUP",
    "BusyWait",
    "SqliteOptions",
    "Synchronous",
    "configure",
    "prepare_file",
]

@dataclass(frozen=True)
class SqliteOptions:
    synchronous: Synchronous = "FULL"
    """FULL fsyncs the WAL at every commit: an acknowledged append survives power
    loss, not only a killed process. NORMAL survives kill -9 but may lose the last
    commits on power loss, for several times the commit rate."""
    busy_timeout_ms: int = 5000
    """How long a writer waits for another process's write lock before the
    operation fails with source_unavailable."""


class BusyWait:
    """SQLite's busy handler: wait up to the timeout for another connection's lock.

    It does what ``busy_timeout`` does (sleep a growing 1-20 ms between tries)
    with one addition: close can abort the wait. A statement blocked on another
    process's write lock sits inside SQLite, where neither Trio cancellation nor
    the interrupt reaches it; without this, closing the log would wait out the
    whole busy timeout.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout = timeout_ms / 1000
        self.aborted = False  # set from the event loop thread; read by the worker
        self.waits = True
        """False while a caller that must not block (the event loop thread)
        uses the connection: a lock held elsewhere then fails at once."""
        self.refused = False
        """Whether a wait was refused since ``waits`` was last set False."""
        self._since = 0.0

    def __call__(self, prior_calls: int) -> bool:
        if not self.waits:
            self.refused = True
            return False
        now = time.monotonic()
        if prior_calls == 0:
            self._since = now
        if self.aborted or now - self._since >= self.timeout:
            return False
        time.sleep(min(0.001 * (1 << min(prior_calls, 5)), 0.02))
        return True


def _vacuum_incrementally_on_new_files(db: apsw.Connection, opts: SqliteOptions) -> None:
    # Retention gives disk back with PRAGMA incremental_vacuum, which needs
    # auto_vacuum=INCREMENTAL; that can be chosen only while the file is new:
    # before WAL mode is set (it writes the header) and before any table. An
    # older file is converted by `compact` with vacuum "full" (a VACUUM).
    if db.pragma("page_count") == 0:
        db.pragma("auto_vacuum", "INCREMENTAL")


def _use_wal(db: apsw.Connection, opts: SqliteOptions) -> None:
    # WAL lets readers run beside the writer and other processes share the file.
    mode = db.pragma("journal_mode", "wal")
    if mode != "wal" and db.db_filename("main"):
        raise RpcError(SOURCE_UNAVAILABLE, f"event log database refused WAL mode ({mode})")


def _set_synchronous(db: apsw.Connection, opts: SqliteOptions) -> None:
    if opts.synchronous not in ("FULL", "NORMAL"):
        raise invalid_params(f"synchronous must be FULL or NORMAL, not {opts.synchronous!r}")
    db.pragma("synchronous", opts.synchronous)


def _enable_foreign_keys(db: apsw.Connection, opts: SqliteOptions) -> None:
    # events -> sessions cascades: deleting a session must not leave orphan events.
    db.pragma("foreign_keys", True)


def _forbid_double_quoted_strings(db: apsw.Connection, opts: SqliteOptions) -> None:
    # A typo'd column name in double quotes would otherwise become a string literal.
    db.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    db.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)


def _begin_writes_immediate(db: apsw.Connection, opts: SqliteOptions) -> None:
    # ``with db:`` then begins IMMEDIATE. An append reads (the duplicate check)
    # before it writes, and a deferred transaction that has read cannot wait for
    # the write lock: SQLite answers SQLITE_BUSY at once, ignoring the busy handler.
    db.transaction_mode = "IMMEDIATE"


CONNECTION_SETUP: tuple[Callable[[apsw.Connection, SqliteOptions], None], ...] = (
    _vacuum_incrementally_on_new_files,
    _use_wal,
    _set_synchronous,
    _enable_foreign_keys,
    _forbid_double_quoted_strings,
    _begin_writes_immediate,
)


def configure(db: apsw.Connection, opts: SqliteOptions, busy: BusyWait, migrate: bool) -> None:
    # The busy handler first, so that switching to WAL below also waits for
    # other processes instead of failing at once.
    db.set_busy_handler(busy)
    refuse_foreign(db)
    for step in CONNECTION_SETUP:
        step(db, opts)
    if migrate:
        apply_migrations(db)


def prepare_file(path: Path, *, make_directory: bool = True) -> None:
    """Create an empty database file (0600), and with ``make_directory`` its
    directory (0700), so an audit log of agent sessions is private to its user
    from the first byte."""
    if make_directory:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        if not path.is_symlink() or path.exists():
            return
        # A symlink to a file not made yet: O_EXCL refuses any link, and
        # SQLite would then make the target with the umask's mode (0644).
        # The user named the link, so the log is made where it points.
        try:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        except OSError as exc:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"cannot create event log {path} (a symlink to {os.readlink(path)}):"
                f" {exc.strerror}",
            ) from exc
    except OSError as exc:
        raise RpcError(SOURCE_UNAVAILABLE, f"cannot create event log {path}: {exc}") from exc
    os.close(fd)
