"""The synchronous SQLite store: the storage rules of the event log, on APSW.

One :class:`SqliteStore` wraps one connection. Every public method is one unit of
work: a write opens exactly one transaction (``with self._db:``, which begins
``IMMEDIATE`` on these connections), private helpers take the connection so steps
compose inside it, and reads that need more than one statement take one snapshot.
No ``apsw`` exception leaves the store: :func:`_translated` turns every driver
error into an :class:`~streamd.errors.RpcError` (``source_unavailable`` for a
database fault, ``closed`` once the connection is closed), so callers and the wire
never see driver types.

Rules kept here, for every caller (the Trio layer, the CLI, tests)
------------------------------------------------------------------
* seq is ``INTEGER PRIMARY KEY AUTOINCREMENT``. AUTOINCREMENT is load-bearing:
  without it SQLite reuses the largest rowid after the newest events are deleted
  (``sessions.delete``), and a watcher whose cursor is past the reused seq would
  skip the new event forever. Because SQLite has one writer at a time and the seq
  is assigned inside the writing transaction, commit order is seq order: a reader
  can never see seq N+k committed before seq N.
* An append writes the event row, its seq and its session row in one transaction
  (the Go original wrote two tables without one).
* Idempotent retry: each event row stores a digest of the request as the client
  sent it (session triple, event fields, the timestamp only if the client gave
  one, content, metadata). The same event id with the same digest returns the
  original seq with ``duplicate: true``; a different digest is ``event_conflict``
  and nothing is written. Metadata is part of the digest: silently keeping the old
  ``caller`` while acknowledging a retry that names another would falsify the
  audit trail.
* Writes use ``BEGIN IMMEDIATE``: an append reads (the duplicate check) before it
  writes, and a deferred transaction that has read cannot wait for the write lock
  (SQLite answers SQLITE_BUSY at once instead of honouring the busy timeout).
* Group commit: :meth:`SqliteStore.append_batch` writes many appends in one
  transaction with a savepoint per event, so one event's conflict or bad content
  fails that event alone.
* Reads are total: a stored value that cannot be rendered reads as null and its
  row is flagged (``Entry.damaged``), never dropped and never an error; content
  that is not JSON cannot be stored at all (a trigger, so not by hand either).
* A read that a client will receive in one frame (``max_bytes``) stops before
  its entries pass that many bytes on the wire, reading no row beyond the cut.
* No call answers from a file that is no longer at the path: after its work
  and before it returns, every call compares the path's files with the ones
  the connection opened (:mod:`~streamd.eventlog.sqlite.file_identity`), so an
  append committed into a deleted or replaced file is never acknowledged.
* Leases are rows keyed by session, each with the stale window its holder
  declared: a lease is stale only when its heartbeat is older than *that* window,
  whatever window the requester asks for for itself. Taking a stale lease is a
  conditional update on the old holder *and* its heartbeat, so a holder that beat
  in the meantime keeps its lease. A heartbeat is a conditional update on our
  holder; zero rows means the lease was stolen.

The rules both backends state alike (sessions, state, leases, boots,
retention, reads by filter) are written once in :mod:`streamd.eventlog.store`
(:class:`~streamd.eventlog.store.operations.SqlOperations`), over this
connection as :class:`~streamd.eventlog.sqlite.sql.SqliteSql`; what stays here
is SQLite's own: the seq, the batch write, the connection's lifecycle, error
translation, and vacuum, checkpoints and query plans. The schema and its
forward-only migrations (and the refusal of a database that is newer, or not
ours) are in :mod:`~streamd.eventlog.sqlite.schema`, connection setup in
:mod:`~streamd.eventlog.sqlite.connection`, and the mapping between rows and
Structs in :mod:`~streamd.eventlog.store.rows`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Concatenate, Literal, ParamSpec, TypeVar

import apsw

from streamd.errors import (
    INTERNAL_ERROR,
    SOURCE_UNAVAILABLE,
    RpcError,
)
from streamd.eventlog.model import AppendParams, Filter, SessionKey
from streamd.eventlog.sqlite import errors as sqlite_errors
from streamd.eventlog.sqlite import pages
from streamd.eventlog.sqlite.batch import append_items
from streamd.eventlog.sqlite.connection import BusyWait, SqliteOptions, configure
from streamd.eventlog.sqlite.file_identity import DatabaseFile, guard_for
from streamd.eventlog.sqlite.schema import SCHEMA_VERSION, schema_is_current
from streamd.eventlog.sqlite.sql import SqliteSql, newest_seq
from streamd.eventlog.store import reads, rows, rules, sessions
from streamd.eventlog.store.backend import (
    AppendGroup,
    Backend,
    CommitOutcome,
    EventRows,
    closed_error,
)
from streamd.eventlog.store.operations import SqlOperations
from streamd.eventlog.store.sessions import EventBounds
from streamd.eventlog.store.sql import Sql

__all__ = ["SqliteStore"]

logger = logging.getLogger(__name__)

# The files whose text that is not UTF-8 the log has warned of (``_tolerating_bad_text``).
_SAID_NOT_UTF8: set[str] = set()

_P = ParamSpec("_P")
_T = TypeVar("_T")


# --- error translation -----------------------------------------------------


def _tolerating_bad_text(
    store: SqliteStore, fn: Callable[Concatenate[SqliteStore, _P], _T],
    /, *args: _P.args, **kwargs: _P.kwargs,
) -> _T:
    """``fn``, run again reading text that is not UTF-8 with U+FFFD
    (:mod:`.lossy_text`) if it met some; only a call that only read is run
    again, since a write run twice would write twice. "Only read" is judged
    by the connection's change count, which a rolled-back write still moved:
    a call that wrote and was rolled back is not run again either (its
    caller gets the -32603), the safe side of what the count cannot tell.
    Either way no UnicodeDecodeError leaves the store: the log said only
    "index round failed", the command line a traceback."""
    db = store._db
    before = db.total_changes()
    try:
        return fn(store, *args, **kwargs)
    except UnicodeDecodeError as exc:
        if db.total_changes() != before or not db.get_autocommit():
            raise _not_utf8(exc) from None
        # Said once a file: every answer that shows the row meets it again.
        level = logging.DEBUG if db.filename in _SAID_NOT_UTF8 else logging.WARNING
        _SAID_NOT_UTF8.add(db.filename)
        logger.log(level, "the log at %s holds text that is not UTF-8 (another program wrote "
                   "it, or the disk damaged it): read with U+FFFD for each such byte (%s)",
                   db.filename, exc)
    with store._sql.lossy():
        try:
            return fn(store, *args, **kwargs)
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc) from None


def _not_utf8(exc: UnicodeDecodeError) -> RpcError:
    return RpcError(INTERNAL_ERROR, "the event log holds text that is not UTF-8 (another "
                    "program wrote it, or the disk damaged it), which this call cannot read: "
                    f"{exc}")



def _translate(
    exc: apsw.Error, db: apsw.Connection | None = None, path: str | None = None
) -> RpcError:
    """``path``: the file of an open that failed, probed for the errno and
    named in the error."""
    code = sqlite_errors.system_errno(db, exc) or sqlite_errors.probe_errno(path)
    return sqlite_errors.translate(exc, code, path)


def _translated(
    fn: Callable[Concatenate[SqliteStore, _P], _T],
) -> Callable[Concatenate[SqliteStore, _P], _T]:
    """The storage boundary: no apsw exception escapes a decorated method.

    Once the store is interrupted for close, calls fail with ``closed``: an
    interrupted statement's transaction was rolled back, so "closed, not written"
    is the truth, where "database error" would send the caller looking for one.
    """

    @functools.wraps(fn)
    def wrapper(store: SqliteStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if store._busy.aborted or store._closed:
            raise closed_error()
        # Before the work too: a -shm deleted and made anew by another process
        # since the last call must not be written through (our index of the
        # -wal is no longer the one it shares; see file_identity).
        _check_file(store)
        try:
            result = _tolerating_bad_text(store, fn, *args, **kwargs)
        except apsw.Error as exc:
            if store._busy.aborted:
                raise closed_error() from exc
            raise _translate(sqlite_errors.first_failure(exc), store._db) from exc
        except OSError as exc:
            raise sqlite_errors.translate_os(exc) from exc
        # Before the caller hears of it: a commit into a file that is no
        # longer at the path must not be acknowledged (see file_identity).
        _check_file(store)
        return result

    return wrapper


# How long the guard's emptying of an old -wal waits for a reader (see below).
GUARD_WAIT_S = 0.05


def _check_file(store: SqliteStore) -> None:
    """The store's guard's comparison of the path with its files; raises the
    guard's fault, or the error of a path that cannot be looked up."""
    guard = store._guard
    if guard is None:
        return
    # A tripped guard empties the old -wal unless a reader is in the way, and
    # then leaves it to a later call or the close. It waits a moment (a read
    # of our own reader connection ends in that), never the busy timeout:
    # that held each call's error back (10 s for the first) and every call
    # queued behind it while another process kept reading.
    busy = store._busy
    timeout = busy.timeout
    busy.timeout = min(timeout, GUARD_WAIT_S)
    try:
        guard.check(store._db)
    except OSError as exc:  # the path could not be looked up
        raise sqlite_errors.translate_os(exc) from exc
    finally:
        busy.timeout = timeout


# --- the store -------------------------------------------------------------------


class SqliteStore(SqlOperations):
    """The event log on one APSW connection; see the module docstring for the rules.

    Opened with :meth:`open`. It is a
    :class:`~streamd.eventlog.store.backend.Backend`, and its own inline
    :class:`~streamd.eventlog.store.backend.Runner` (tests under a mock clock,
    the CLI, tools); the Trio layer drives it through
    :class:`~streamd.eventlog.sqlite.runner.ConnectionRunner`, a worker thread
    of its own.
    """

    def __init__(
        self,
        db: apsw.Connection,
        busy: BusyWait,
        *,
        guard: DatabaseFile | None = None,
    ) -> None:
        self._db = db
        self._busy = busy
        self._guard = guard
        self._closed = False
        self._sql = SqliteSql(self._db)
        self.wal_pages = 0
        """Pages in the WAL after this connection's last commit (counted
        only after :meth:`leave_checkpoints_to_others`)."""

    # -- lifecycle --

    @classmethod
    def open(
        cls,
        path: str,
        options: SqliteOptions | None = None,
        *,
        migrate: bool = True,
        guard: DatabaseFile | None = None,
    ) -> SqliteStore:
        """``guard``: the path's :class:`DatabaseFile`, shared by the
        connections of one log (default: one of this store's own)."""
        store = cls._open(path, options, migrate, guard, wait=True)
        assert store is not None  # only an open that may not wait gives up
        return store

    @classmethod
    def try_open_without_waiting(
        cls,
        path: str,
        options: SqliteOptions | None = None,
        *,
        migrate: bool = True,
        guard: DatabaseFile | None = None,
    ) -> SqliteStore | None:
        """:meth:`open`, or None at once where it would wait for another
        connection's lock (a WAL being recovered) or, with ``migrate``, where
        the schema is not current (a migration can take as long as the log
        is big): what an event loop may call, falling back to :meth:`open`
        on a thread."""
        return cls._open(path, options, migrate, guard, wait=False)

    @classmethod
    def _open(
        cls,
        path: str,
        options: SqliteOptions | None,
        migrate: bool,
        guard: DatabaseFile | None,
        *,
        wait: bool,
    ) -> SqliteStore | None:
        opts = options or SqliteOptions()
        busy = BusyWait(opts.busy_timeout_ms)
        busy.waits = wait
        guard = guard or guard_for(path)
        if guard is not None:
            guard.before_open()
        try:
            db = apsw.Connection(path)
            try:
                configure(db, opts, busy, migrate and wait)
                if migrate and not wait and not schema_is_current(db):
                    busy.refused = True  # a migration may be long: as if it had to wait
                    raise _NotNow
                if guard is not None:
                    guard.opened(db)
            except BaseException as exc:
                err = _translate(exc, db, path) if isinstance(exc, apsw.Error) else None
                if guard is not None:
                    guard.closing(db)
                db.close()
                if busy.refused and isinstance(exc, Exception):
                    return None  # it would have waited: the caller opens where it may
                if err is not None:
                    raise err from exc
                raise
        except apsw.Error as exc:
            raise _translate(exc, path=path) from exc
        busy.waits = True
        return cls(db, busy, guard=guard)

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        """``op(self)`` inline, which blocks the event loop: for tests under a
        mock clock, where a real thread would let the clock jump while SQLite
        works, and for tools."""
        return op(self)

    def expect_close(self) -> float | None:
        return None  # as a runner, inline: its close gives nothing a grace

    def interrupt(self) -> None:
        """Abort whatever this connection is doing, for close; callable from any
        thread. A running statement fails (its transaction rolls back), a busy
        wait gives up, and every later call fails with ``closed``."""
        self._busy.aborted = True
        try:
            self._db.interrupt()
        except apsw.Error:
            pass  # already closed: nothing left to interrupt

    def try_without_waiting(
        self, op: Callable[[SqliteStore], _T]
    ) -> tuple[Literal[True], _T] | tuple[Literal[False], None]:
        """``(True, op(self))``, unless a lock held by another connection
        stood in the way: then ``(False, None)``, nothing written (the lock is
        taken by ``BEGIN IMMEDIATE``, before any write), and the caller may
        run ``op`` again where waiting for the lock is allowed. For the event
        loop thread, which must never sleep in the busy handler."""
        busy = self._busy
        busy.waits, busy.refused = False, False
        try:
            return True, op(self)
        except RpcError:
            if busy.refused:
                return False, None
            raise
        finally:
            busy.waits = True

    def leave_checkpoints_to_others(self) -> None:
        """Stop this connection's automatic checkpoints (SQLite runs one
        inside the commit that takes the WAL past 1,000 pages, so that
        commit's caller waits for the copy and its fsyncs) and count the
        WAL's pages after each commit instead (:attr:`wal_pages`), so the
        owner can checkpoint from another connection, beside the writes."""
        self.wal_pages = 0
        self._db.wal_autocheckpoint(0)

        def committed(db: apsw.Connection, name: str, pages: int) -> int:
            self.wal_pages = pages
            return apsw.SQLITE_OK

        self._db.set_wal_hook(committed)

    @_translated
    def checkpoint_passive(self) -> tuple[int, int]:
        """Copy what it can of the WAL into the database file without
        waiting for anyone (``wal_checkpoint(PASSIVE)``): (frames in the WAL,
        frames copied). Writers go on meanwhile; once all is copied, the next
        commit starts the WAL again from its beginning."""
        row = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if row is None:  # the pragma always answers one row; this is for the checker
            return 0, 0
        _, frames, copied = row
        return int(frames), int(copied)

    def set_progress_check(self, check: Callable[[], bool], steps: int) -> None:
        """Call ``check`` every ``steps`` SQLite steps; when it returns True
        the running statement is interrupted (its transaction rolls back): how
        a worker thread abandons a call whose caller was cancelled."""
        self._db.set_progress_handler(check, steps)

    def file_unchanged(self) -> bool:
        """Whether the path still names the file this store has open (always,
        for a store without a guard). Asks only the file system: any thread.
        A path that cannot be looked up raises ``source_unavailable``."""
        try:
            return self._guard is None or self._guard.unchanged()
        except OSError as exc:
            raise sqlite_errors.translate_os(exc) from exc

    def check_file(self) -> None:
        """Fail as a call would if the path no longer names this store's
        file. Once the database file has left the path, the check also tries
        to empty the old ``-wal`` into the old file (see
        :mod:`~streamd.eventlog.sqlite.file_identity`), so that a new opener
        of the path does not apply it to the file now there. On the
        connection's thread, as a call."""
        _check_file(self)

    def close(self) -> None:
        self._closed = True  # before the guard's pre-check could see the -wal SQLite deletes
        try:
            self._before_close()
            self._db.close()
        except apsw.Error as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        self.close()

    def _before_close(self) -> None:
        self._clear_interrupt()
        if self._guard is not None:
            self._guard.closing(self._db)

    def _clear_interrupt(self) -> None:
        """Closing the last connection checkpoints the WAL into the database and
        deletes the ``-wal`` file, but that checkpoint gives up with
        SQLITE_INTERRUPT while an interrupt is pending, and SQLite clears a
        pending interrupt only when a statement starts with none running. Close
        interrupts every connection (to abandon abandoned work), so without one
        statement here every close would leave the WAL for the next opener to
        recover. On the connection's own thread, after anything still queued."""
        try:
            if self._db.is_interrupted:
                self._db.execute("SELECT 1").fetchall()
        except apsw.Error:
            pass  # already closed, or still interrupted: the WAL stays, as after a crash

    @property
    def connection(self) -> apsw.Connection:
        """The raw connection, for tests that inspect query plans or pragmas."""
        return self._db

    @_translated
    def event_page(self, from_seq: int, limit: int) -> EventRows:
        """:meth:`event_rows`, read by the compiled core into one buffer where
        it can be (``pages``)."""
        rules.check_limit(limit)
        page = pages.read_page(self._db, reads.EVENT_ROWS_AFTER, from_seq, limit)
        return page if page is not None else reads.event_rows(self._sql, from_seq, limit)

    @_translated
    def _call(self, op: Callable[[Sql], _T]) -> _T:
        """The shared rules' way in (:class:`SqlOperations`): ``op`` on this
        connection, inside the storage boundary (:func:`_translated`)."""
        return op(self._sql)

    # -- appends --

    @_translated
    def append_commit(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int, capture: bool
    ) -> CommitOutcome:
        """:meth:`append_batch`, and what the commit did to the log: the newest
        seq before and after it (read inside the transaction, so no other
        process's commit can fall between them) and, with ``capture``, each new
        event as the entry a reader would get, for the watchers."""
        prepared: list[rows.Prepared | list[rows.Prepared] | RpcError] = []
        for p in batch:
            try:
                if isinstance(p, AppendGroup):
                    prepared.append(rules.prepare_group(p, now_us))
                else:
                    prepared.append(rows.prepare(p, now_us))
            except RpcError as exc:
                prepared.append(exc)
        db = self._db
        try:
            # Optimistic: no savepoint per append (a SAVEPOINT and a RELEASE
            # were two statements of the five of a usual append). The first
            # refusal rolls the transaction back and the batch runs again,
            # each append in its own savepoint: the same results, paid for
            # only by batches that hold a refusal.
            with db:
                before = newest_seq(db)
                out, added = append_items(self._sql, prepared, now_us, capture, careful=False)
                after = newest_seq(db)
        except (RpcError, apsw.ConstraintError):
            with db:
                before = newest_seq(db)
                out, added = append_items(self._sql, prepared, now_us, capture, careful=True)
                after = newest_seq(db)
        return CommitOutcome(
            results=out,
            before_seq=before,
            after_seq=after,
            entries=None if added is None else rows.just_written(added),
        )

    # -- query plans --

    @_translated
    def explain_since(self, from_seq: int, flt: Filter | None, limit: int) -> list[str]:
        """EXPLAIN QUERY PLAN details of the exact statement :meth:`since` would run."""
        sql, args = reads.since_query(self._sql, from_seq, flt, limit)
        return [row[3] for row in self._db.execute("EXPLAIN QUERY PLAN " + sql, args)]

    @_translated
    def explain_session_events(
        self,
        app: str,
        user: str,
        session: str,
        after_seq: int,
        recent: int | None,
        after_time_us: int | None,
    ) -> list[str]:
        """EXPLAIN QUERY PLAN details of the statements :meth:`get_session`
        runs for these bounds (the window's first seq, then the read)."""
        bounds = EventBounds(after_seq, recent, after_time_us)
        plans: list[str] = []
        for sql, args in bounds.queries(self._sql.dialect, (app, user, session), after_seq):
            plans += [row[3] for row in self._db.execute("EXPLAIN QUERY PLAN " + sql, args)]
        return plans

    @_translated
    def explain_list_sessions(
        self, app: str, user: str | None, limit: int, after: SessionKey | None
    ) -> list[str]:
        sql, args = sessions.page_query(self._sql.dialect, app, user, limit, after)
        return [row[3] for row in self._db.execute("EXPLAIN QUERY PLAN " + sql, args)]

    # -- retention --

    @_translated
    def incremental_vacuum(self, pages: int) -> int:
        """Give up to ``pages`` free pages back to the file system (the file
        shrinks once the WAL is checkpointed); the pages freed."""
        with self._db:
            before = self._db.pragma("freelist_count")
            self._db.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
            freed: int = before - self._db.pragma("freelist_count")
        return freed

    @_translated
    def full_vacuum(self) -> None:
        """Rewrite the file (VACUUM), in incremental auto-vacuum mode from then on.
        The one retention operation not bounded by rows: it holds the write
        lock for as long as rewriting the whole file takes, so it runs only
        when asked for (``compact`` with ``vacuum: "full"``)."""
        self._db.pragma("auto_vacuum", "INCREMENTAL")
        self._db.execute("VACUUM")

    @_translated
    def checkpoint(self) -> bool:
        """Write the WAL back into the database file and truncate it; False
        when a reader (another process) still needed part of it."""
        row = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert row is not None  # the pragma always answers one row
        return row[0] == 0

    @_translated
    def pages(self) -> tuple[int, int, int]:
        """(page_count, freelist_count, page_size) of the database file."""
        db = self._db
        return db.pragma("page_count"), db.pragma("freelist_count"), db.pragma("page_size")

    # -- health --

    @_translated
    def ping(self) -> None:
        """A real, bounded read: the schema version and the newest seq (one index
        probe each). Fails with source_unavailable when the file is unreadable."""
        db = self._db
        with self._sql.snapshot():
            version = db.pragma("user_version")
            if version != SCHEMA_VERSION:
                raise RpcError(
                    SOURCE_UNAVAILABLE,
                    f"event log schema version is {version}, expected {SCHEMA_VERSION}",
                )
            db.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1").fetchall()

    @_translated
    def change_counter(self) -> int:
        """``PRAGMA data_version``: changes whenever another connection (another
        process, or this process's writer seen from the reader) commits. One
        in-memory read, no table access: cheap enough to poll."""
        return self._db.pragma("data_version")

    @_translated
    def synchronous(self) -> int:
        """The connection's ``PRAGMA synchronous`` (2 = FULL, 1 = NORMAL)."""
        return self._db.pragma("synchronous")


class _NotNow(Exception):
    """An open that may not wait has found work it would wait for."""
