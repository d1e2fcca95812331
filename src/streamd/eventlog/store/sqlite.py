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
  the connection opened (:mod:`~streamd.eventlog.store.file_identity`), so an
  append committed into a deleted or replaced file is never acknowledged.
* Leases are rows keyed by session, each with the stale window its holder
  declared: a lease is stale only when its heartbeat is older than *that* window,
  whatever window the requester asks for for itself. Taking a stale lease is a
  conditional update on the old holder *and* its heartbeat, so a holder that beat
  in the meantime keeps its lease. A heartbeat is a conditional update on our
  holder; zero rows means the lease was stolen.

The schema and its forward-only migrations (and the refusal of a database that
is newer, or not ours) are in :mod:`~streamd.eventlog.store.schema`, connection
setup in :mod:`~streamd.eventlog.store.connection`, and the mapping between rows
and Structs in :mod:`~streamd.eventlog.store.rows`.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, cast

import apsw

from streamd.errors import (
    EVENT_CONFLICT,
    INVALID_PARAMS,
    SOURCE_UNAVAILABLE,
    STALE_SESSION,
    RpcError,
    invalid_params,
)
from streamd.eventlog import filters
from streamd.eventlog.model import (
    AppendParams,
    AppendResult,
    Boot,
    Filter,
    LeaseInfo,
    RetentionPolicy,
    Session,
    SessionKey,
    SessionListResult,
    SessionsResult,
    SessionWithEvents,
    SinceResult,
    StateDelta,
    StateSnapshot,
    wire_size,
)
from streamd.eventlog.retention import Bounds, Step
from streamd.eventlog.store import rows, rules, sqlite_errors
from streamd.eventlog.store.backend import (
    AppendGroup,
    Backend,
    CommitOutcome,
    Committed,
    closed_error,
)
from streamd.eventlog.store.connection import BusyWait, SqliteOptions, configure
from streamd.eventlog.store.file_identity import DatabaseFile, guard_for
from streamd.eventlog.store.schema import SCHEMA_VERSION

__all__ = ["SqliteStore"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


# --- error translation -----------------------------------------------------


def _translate(
    exc: apsw.Error, db: apsw.Connection | None = None, path: str | None = None
) -> RpcError:
    code = sqlite_errors.system_errno(db, exc) or sqlite_errors.probe_errno(path)
    return sqlite_errors.translate(exc, code)


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
        if store._busy.aborted:
            raise closed_error()
        guard = store._guard
        if guard is not None and guard.error is not None:
            raise guard.error
        try:
            result = fn(store, *args, **kwargs)
        except apsw.Error as exc:
            if store._busy.aborted:
                raise closed_error() from exc
            raise _translate(exc, store._db) from exc
        except OSError as exc:
            raise sqlite_errors.translate_os(exc) from exc
        if guard is not None:
            # Before the caller hears of it: a commit into a file that is no
            # longer at the path must not be acknowledged (see file_identity).
            guard.check(store._db)
        return result

    return wrapper


MAX_SEQ = 2**63 - 1
# A session under a live lease: its holder drives it, so retention leaves it whole.
_LIVE_LEASE = "heartbeat_at + stale_after_ms * 1000 > ?"
_LEASED = (
    "SELECT 1 FROM leases l WHERE l.app_name = {t}.app_name AND l.user_id = {t}.user_id"
    " AND l.session_id = {t}.session_id AND l.heartbeat_at + l.stale_after_ms * 1000 > ?"
)

# A since whose cursor is this close to the newest seq reads the rows past the
# cursor by primary key instead of through the filter's index (see _since_query).
_TAIL_SCAN_ROWS = 2048


def _indexed_by(flt: Filter | None) -> str:
    """The FROM clause that pins a filtered read to the index that answers it."""
    if flt is None:
        return "events"
    if flt.session_tree is not None or (
        flt.app is not None and flt.user is not None and flt.session is not None
    ):
        return "events INDEXED BY events_by_session"
    if flt.branch_prefixes and filters.branch_prefixes(flt.branch_prefixes):
        return "events INDEXED BY events_by_branch"
    return "events"


# --- the store -------------------------------------------------------------------


class SqliteStore:
    """The event log on one APSW connection; see the module docstring for the rules.

    Open it synchronously with :meth:`open` (tests, the CLI, tools) or with
    :meth:`open_async` for the Trio layer, where the connection lives in APSW's
    async mode and :meth:`run` executes an operation on the connection's own
    worker thread. It is both a :class:`~streamd.eventlog.store.backend.Backend`
    and a :class:`~streamd.eventlog.store.backend.Runner`.
    """

    def __init__(
        self,
        db: apsw.Connection | apsw.AsyncConnection,
        busy: BusyWait,
        *,
        is_async: bool,
        guard: DatabaseFile | None = None,
    ) -> None:
        # APSW's stub gives a connection in async mode a class of its own,
        # AsyncConnection, that exists for type checkers only: at run time it
        # is the same apsw.Connection, and on its worker thread, where every
        # operation runs, its calls are synchronous. Two names, two faces.
        self._db = cast("apsw.Connection", db)
        self._aio = cast("apsw.AsyncConnection", db) if is_async else None
        self._busy = busy
        self._guard = guard
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
        opts = options or SqliteOptions()
        busy = BusyWait(opts.busy_timeout_ms)
        guard = guard or guard_for(path)
        if guard is not None:
            guard.before_open()
        try:
            db = apsw.Connection(path)
            try:
                configure(db, opts, busy, migrate)
                if guard is not None:
                    guard.opened(db)
            except apsw.Error as exc:
                err = _translate(exc, db, path)
                if guard is not None:
                    guard.closing(db)
                db.close()
                raise err from exc
            except BaseException:
                if guard is not None:
                    guard.closing(db)
                db.close()
                raise
        except apsw.Error as exc:
            raise _translate(exc, path=path) from exc
        return cls(db, busy, is_async=False, guard=guard)

    @classmethod
    async def open_async(
        cls,
        path: str,
        options: SqliteOptions | None = None,
        *,
        migrate: bool = True,
        guard: DatabaseFile | None = None,
    ) -> SqliteStore:
        """Open in APSW async mode (``apsw.aio``; the controller is picked from the
        running event loop, Trio here). The caller must ``await aclose()``: the
        connection's worker thread keeps the process alive until then."""
        opts = options or SqliteOptions()
        busy = BusyWait(opts.busy_timeout_ms)
        guard = guard or guard_for(path)
        if guard is not None:
            guard.before_open()
        try:
            db = await apsw.Connection.as_async(path)
        except apsw.Error as exc:
            raise _translate(exc, path=path) from exc
        try:
            await db.async_run(configure, db, opts, busy, migrate)
            if guard is not None:
                await db.async_run(guard.opened, db)
        except BaseException as exc:
            if guard is not None:
                await db.async_run(guard.closing, db)
            await db.aclose()
            if isinstance(exc, apsw.Error):
                raise _translate(exc, path=path) from exc
            raise
        return cls(db, busy, is_async=True, guard=guard)

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        """``op(self)`` where the connection may be used.

        In async mode that is the connection's worker thread; APSW honours Trio
        cancellation and deadlines there (a call not yet started is skipped, a
        running statement is interrupted). A synchronously opened store runs
        ``op`` inline, which blocks the event loop: that is for tests under a mock
        clock, where a real thread would let the clock jump while SQLite works.
        """
        if self._aio is None:
            return op(self)
        try:
            return await self._aio.async_run(op, self)
        except apsw.Error as exc:
            raise _translate(exc) from exc

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

    def close(self) -> None:
        try:
            self._before_close()
            self._db.close()
        except apsw.Error as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        if self._aio is None:
            self.close()
            return
        try:
            await self._aio.async_run(self._before_close)
            await self._aio.aclose()
        except apsw.Error as exc:
            raise _translate(exc) from exc

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

    @contextmanager
    def _snapshot(self) -> Iterator[apsw.Connection]:
        """A read transaction: several statements see one state of the log.

        Deferred on purpose (``with db:`` would begin IMMEDIATE and take the
        write lock for a read).
        """
        self._db.execute("BEGIN DEFERRED")
        try:
            yield self._db
        except BaseException:
            if not self._db.get_autocommit():
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- appends --

    @_translated
    def append(self, params: AppendParams, now_us: int) -> AppendResult:
        result = self.append_batch([params], now_us)[0]
        if isinstance(result, RpcError):
            raise result
        assert isinstance(result, AppendResult)
        return result

    @_translated
    def append_batch(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int
    ) -> list[AppendResult | list[AppendResult] | RpcError]:
        """Write every append in one transaction; per-item outcomes in order.

        Each event gets its own savepoint, so an event that conflicts (or fails a
        constraint) is rolled back alone and the others still commit; an
        :class:`AppendGroup` gets one savepoint for all its events, so its first
        refusal rolls the whole group back. A fault of the transaction itself
        (I/O error, busy) fails the whole batch, because then nothing was
        written.
        """
        return self.append_commit(batch, now_us, capture=False).results

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
                before = _newest_seq(db)
                out, added = _append_items(db, prepared, now_us, capture, careful=False)
                after = _newest_seq(db)
        except (RpcError, apsw.ConstraintError):
            with db:
                before = _newest_seq(db)
                out, added = _append_items(db, prepared, now_us, capture, careful=True)
                after = _newest_seq(db)
        return CommitOutcome(
            results=out,
            before_seq=before,
            after_seq=after,
            entries=None if added is None else [rows.committed(row) for row in added],
        )

    # -- reads --

    def _since_query(
        self, from_seq: int, flt: Filter | None, limit: int
    ) -> tuple[str, tuple[Any, ...]]:
        """The SELECT for :meth:`since`, with its access path chosen here.

        Without statistics SQLite guesses that a branch range matches a quarter
        of the table and, with ``ORDER BY seq LIMIT n``, prefers walking the
        primary key and filtering; for a subtree that is a few percent of the log
        that reads the whole table. So the path is stated, not guessed:

        * a caught-up cursor (few rows past it) walks the primary key from the
          cursor: at most ``tip - from_seq`` rows lie past it (seqs are unique),
          however large the filter's history is. ``NOT INDEXED`` still allows the
          INTEGER PRIMARY KEY.
        * a replay filtered by session or session tree uses ``events_by_session``
          (equality on the triple, then a seq range, already in seq order);
        * a replay filtered by branch alone uses ``events_by_branch``.
        """
        clauses = filters.where(flt)
        table = "events"
        if clauses:
            row = self._db.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            tip = row[0] if row else 0
            table = "events NOT INDEXED" if tip - from_seq <= _TAIL_SCAN_ROWS else _indexed_by(flt)
        where, args = filters.render(clauses, [("seq > ?", (from_seq,))])
        # One row past the limit tells whether more matched, without a count.
        sql = (
            f"SELECT {rows.ENTRY_COLUMNS} FROM {table} WHERE {where} ORDER BY seq LIMIT ?"
        )
        return sql, (*args, limit + 1)

    @_translated
    def explain_since(self, from_seq: int, flt: Filter | None, limit: int) -> list[str]:
        """EXPLAIN QUERY PLAN details of the exact statement :meth:`since` would run."""
        sql, args = self._since_query(from_seq, flt, limit)
        return [row[3] for row in self._db.execute("EXPLAIN QUERY PLAN " + sql, args)]

    @_translated
    def since(
        self,
        from_seq: int,
        flt: Filter | None,
        limit: int,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SinceResult:
        """Up to ``limit`` matching entries after ``from_seq``, and (given
        ``max_bytes``) no more than fit in that many bytes on the wire; a page
        cut short by either has ``caught_up`` false. ``raw_content`` and
        ``encoded``: see :data:`Shape`."""
        rules.check_limit(limit)
        sql, args = self._since_query(from_seq, flt, limit)
        entries, last, more = _read_entries(
            self._db, sql, args, limit, rows.shape(raw_content, encoded), max_bytes
        )
        return SinceResult(
            entries=entries,
            next_seq=from_seq if last is None else last,
            caught_up=not more,
        )

    @_translated
    def since_committed(
        self, from_seq: int, flt: Filter | None, limit: int, max_bytes: int
    ) -> tuple[list[Committed], bool]:
        """:meth:`since` as a watch reads it: the entries as :class:`Committed`
        (encoded once, with the fields the fan-out filters on), and whether the
        page reached the end of the log."""
        rules.check_limit(limit)
        sql, args = self._since_query(from_seq, flt, limit)
        entries, _, more = _read_entries(self._db, sql, args, limit, "committed", max_bytes)
        return entries, not more

    @_translated
    def latest_seq(self, flt: Filter | None) -> int:
        where, args = filters.render(filters.where(flt))
        row = self._db.execute(
            f"SELECT seq FROM {_indexed_by(flt)} WHERE {where} ORDER BY seq DESC LIMIT 1", args
        ).fetchone()
        return row[0] if row else 0

    @_translated
    def nth_newest_seq(self, flt: Filter | None, offset: int) -> int:
        """The seq ``offset`` places behind the newest matching entry (0 = the
        newest), or 0 when fewer match: where ``tail -n`` starts. It counts the
        filtered rows themselves, because seqs are global and a busy sibling
        session would make ``latest - n`` cut a quiet session's history short."""
        if offset < 0:
            raise invalid_params(f"offset must not be negative, not {offset}")
        where, args = filters.render(filters.where(flt))
        row = self._db.execute(
            f"SELECT seq FROM {_indexed_by(flt)} WHERE {where} ORDER BY seq DESC LIMIT 1 OFFSET ?",
            (*args, offset),
        ).fetchone()
        return row[0] if row else 0

    @_translated
    def branches(self, flt: Filter | None, limit: int | None) -> list[str]:
        if limit is not None:
            rules.check_limit(limit)
        where, args = filters.render(filters.where(flt), [("branch <> ''", ())])
        sql = f"SELECT DISTINCT branch FROM events WHERE {where} ORDER BY branch"
        if limit is not None:
            sql += " LIMIT ?"
            args = (*args, limit)
        return [r[0] for r in self._db.execute(sql, args)]

    # -- sessions --

    @_translated
    def create_session(
        self,
        app: str,
        user: str,
        session: str | None,
        state: dict[str, Any] | None,
        now_us: int,
        app_state: dict[str, Any] | None = None,
        user_state: dict[str, Any] | None = None,
    ) -> Session:
        """Create a session with its own state, merging ``app_state`` and
        ``user_state`` into the state its app and user share, in one
        transaction. The deltas are recorded at the newest seq, so a read as of
        that seq sees them."""
        session_id = session if session is not None else uuid.uuid4().hex
        try:
            state_json = rows.json_text(state or {})
            delta = StateDelta(app=app_state, user=user_state, session=state).normalized()
            if delta is not None:
                rows.json_text(delta)
        except (TypeError, ValueError) as exc:
            raise invalid_params(f"session state is not JSON: {exc}") from None
        try:
            with self._db:
                self._db.execute(
                    "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
                    " updated_at, last_event_time) VALUES (?, ?, ?, '{}', ?, ?, ?)",
                    (app, user, session_id, now_us, now_us, now_us),
                )
                if delta is not None:
                    _apply_delta(
                        self._db, app, user, session_id, delta, _newest_seq(self._db), now_us
                    )
        except apsw.ConstraintError:
            raise RpcError(
                INVALID_PARAMS,
                f"session {session_id!r} already exists",
                {"app": app, "user": user, "session": session_id, "reason": "session_exists"},
            ) from None
        # The session as it now reads back.
        return rows.to_session((app, user, session_id, state_json, now_us, now_us, 0, now_us))

    @_translated
    def get_session(
        self,
        app: str,
        user: str,
        session: str,
        after_seq: int,
        recent: int | None,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
        scoped_state: bool = False,
        after_time_us: int | None = None,
        content: bool = True,
    ) -> SessionWithEvents:
        """The session and its events after ``after_seq`` (and at or after
        ``after_time_us``; the newest ``recent`` of them), oldest first; given
        ``max_bytes``, only as many as fit in that many bytes on the wire with
        the session itself, then ``truncated``. ``scoped_state`` adds the
        app's and the user's state, from the same snapshot; ``content`` false
        gives every event's content as null (see
        :data:`~streamd.eventlog.store.rows.ENTRY_COLUMNS_WITHOUT_CONTENT`)."""
        rules.check_recent(recent)
        bounds = _EventBounds(after_seq, recent, after_time_us, content)
        with self._snapshot() as db:
            got = _session_with_events(
                db, app, user, session, bounds, rows.shape(raw_content, encoded),
                max_bytes, True, scoped_state,
            )
        if got is None:
            raise rules.not_found(app, user, session)
        return got

    @_translated
    def get_sessions(
        self,
        app: str,
        keys: Sequence[SessionKey],
        recent: int | None,
        after_time_us: int | None,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
        scoped_state: bool = False,
    ) -> SessionsResult:
        """Many sessions with their events, in one snapshot, in the order asked.

        ``max_bytes`` is shared: each session gets what the ones before it
        left. The first entry of the whole answer is always taken (a reader
        gets past any entry); after that a session whose next entry does not
        fit is ``truncated`` where it stands, with no events if need be, and
        ``next_seq`` says where to continue it."""
        rules.check_recent(recent)
        shape = rows.shape(raw_content, encoded)
        found: list[SessionWithEvents] = []
        missing: list[SessionKey] = []
        left = max_bytes
        taken_any = False
        with self._snapshot() as db:
            for key in keys:
                bounds = _EventBounds(key.after_seq, recent, after_time_us)
                got = _session_with_events(
                    db, app, key.user, key.session, bounds, shape,
                    left, not taken_any, scoped_state,
                )
                if got is None:
                    missing.append(key)
                    continue
                found.append(got)
                taken_any = taken_any or bool(got.events)
                if left is not None:
                    left -= wire_size(got) + 1
        return SessionsResult(sessions=found, missing=missing)

    @_translated
    def explain_session_events(
        self, app: str, user: str, session: str, after_seq: int, recent: int | None,
        after_time_us: int | None,
    ) -> list[str]:
        """EXPLAIN QUERY PLAN details of the statements :meth:`get_session`
        runs for these bounds (the window's first seq, then the read)."""
        bounds = _EventBounds(after_seq, recent, after_time_us)
        plans: list[str] = []
        for sql, args in bounds.queries((app, user, session), after_seq):
            plans += [row[3] for row in self._db.execute("EXPLAIN QUERY PLAN " + sql, args)]
        return plans

    @_translated
    def list_sessions(self, app: str, user: str | None) -> list[Session]:
        """Every session of the app (of one user), in ``(user, session)``
        order, without events; unbounded, for people and tools. Clients page
        with :meth:`list_sessions_page`."""
        sql = f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE app_name = ?"
        args: tuple[Any, ...] = (app,)
        if user is not None:
            sql += " AND user_id = ?"
            args += (user,)
        sql += " ORDER BY user_id, session_id"
        return [rows.to_session(r) for r in self._db.execute(sql, args)]

    def _page_query(
        self, app: str, user: str | None, limit: int, after: SessionKey | None
    ) -> tuple[str, tuple[Any, ...]]:
        clauses: list[filters.Clause] = [("app_name = ?", (app,))]
        if user is not None:
            clauses.append(("user_id = ?", (user,)))
            # Within one user the cursor is a range of session ids (SQLite does
            # not narrow an index range by a row value after an equality).
            if after is not None and after.user == user:
                clauses.append(("session_id > ?", (after.session,)))
            elif after is not None and after.user > user:
                clauses.append(("0", ()))
        elif after is not None:
            # A row value: the primary key's order, so the page is a range of it.
            clauses.append(("(user_id, session_id) > (?, ?)", (after.user, after.session)))
        where, args = filters.render(clauses)
        return (
            f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE {where}"
            " ORDER BY user_id, session_id LIMIT ?",
            (*args, limit + 1),
        )

    @_translated
    def explain_list_sessions(
        self, app: str, user: str | None, limit: int, after: SessionKey | None
    ) -> list[str]:
        sql, args = self._page_query(app, user, limit, after)
        return [row[3] for row in self._db.execute("EXPLAIN QUERY PLAN " + sql, args)]

    @_translated
    def list_sessions_page(
        self,
        app: str,
        user: str | None,
        limit: int,
        after: SessionKey | None,
        scoped_state: bool = False,
    ) -> SessionListResult:
        """One page of sessions after the cursor, read as one range of the
        sessions' primary key; ``next`` is null on the last page."""
        rules.check_limit(limit)
        sql, args = self._page_query(app, user, limit, after)
        with self._snapshot() as db:
            page = [rows.to_session(r) for r in db.execute(sql, args)]
            more = len(page) > limit
            page = page[:limit]
            app_state = user_states = None
            if scoped_state:
                app_state, _ = _shared_state(db, app, None)
                user_states = {}
                for u in dict.fromkeys(s.user for s in page):
                    user_states[u] = _shared_state(db, app, u)[1] or {}
        last = page[-1] if more else None
        return SessionListResult(
            sessions=page,
            next=SessionKey(user=last.user, session=last.session) if last else None,
            app_state=app_state,
            user_states=user_states,
        )

    @_translated
    def delete_session(self, app: str, user: str, session: str) -> None:
        # Idempotent; the foreign key cascades to the session's events so no
        # orphan row can later fail a replay.
        with self._db:
            self._db.execute(
                "DELETE FROM sessions WHERE app_name = ? AND user_id = ? AND session_id = ?",
                (app, user, session),
            )

    # -- state --

    @_translated
    def get_state(
        self, app: str, user: str | None, session: str | None, as_of_seq: int | None
    ) -> StateSnapshot:
        """The state of the app (and of the user, and the session, when named),
        current or as of a seq, in one snapshot. A session never written is
        ``session_not_found``; a session as of a seq before its creation has
        ``{}``."""
        if session is not None and user is None:
            raise invalid_params("state.get of a session needs its user")
        with self._snapshot() as db:
            if session is not None and not _session_exists(db, app, user or "", session):
                raise rules.not_found(app, user or "", session)
            newest = _newest_seq(db)
            if as_of_seq is None or as_of_seq >= newest:
                app_state, user_state = _shared_state(db, app, user)
                session_state = None
                if session is not None:
                    found = db.execute(
                        "SELECT state FROM sessions"
                        " WHERE app_name = ? AND user_id = ? AND session_id = ?",
                        (app, user, session),
                    ).fetchone()
                    assert found is not None  # the session exists: checked above
                    session_state = rows.state_or_empty(found[0], f"session {session!r}")
                return StateSnapshot(
                    seq=newest if as_of_seq is None else as_of_seq,
                    app=app_state,
                    user=user_state,
                    session=session_state,
                )
            return StateSnapshot(
                seq=as_of_seq,
                app=_fold(db, "app", app, "", "", as_of_seq),
                user=None if user is None else _fold(db, "user", app, user, "", as_of_seq),
                session=(
                    None
                    if session is None
                    else _fold(db, "session", app, user or "", session, as_of_seq)
                ),
            )

    # -- retention --

    @_translated
    def set_retention(self, policy: RetentionPolicy, now_us: int) -> None:
        """Store the app's policy; one without limits removes it."""
        with self._db:
            if policy.empty():
                self._db.execute("DELETE FROM retention WHERE app_name = ?", (policy.app,))
                return
            self._db.execute(
                "INSERT INTO retention (app_name, max_age_s, max_events, idle_s, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (app_name) DO UPDATE SET"
                " max_age_s = excluded.max_age_s, max_events = excluded.max_events,"
                " idle_s = excluded.idle_s, updated_at = excluded.updated_at",
                (policy.app, policy.max_age_s, policy.max_events, policy.idle_s, now_us),
            )

    @_translated
    def retention_policies(self, app: str | None = None) -> list[RetentionPolicy]:
        sql = "SELECT app_name, max_age_s, max_events, idle_s FROM retention"
        args: tuple[Any, ...] = ()
        if app is not None:
            sql += " WHERE app_name = ?"
            args = (app,)
        return [
            RetentionPolicy(app=a, max_age_s=age, max_events=n, idle_s=idle)
            for a, age, n, idle in self._db.execute(sql + " ORDER BY app_name", args)
        ]

    @_translated
    def leased_sessions(self, app: str, now_us: int) -> int:
        """Sessions of the app under a live lease (heartbeat within its window)."""
        row = self._db.execute(
            f"SELECT count(*) FROM leases l WHERE app_name = ? AND {_LIVE_LEASE}", (app, now_us)
        ).fetchone()
        return row[0] if row else 0

    @_translated
    def drop_idle_sessions(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: int | None,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        """One bounded step of dropping the app's sessions not updated since
        ``cutoff_us`` (skipping leased ones and any holding an event after
        ``keep_after_seq``): each loses its own state history, then its events
        from the oldest, and its row goes in the transaction that deletes its
        newest event (see :mod:`~streamd.eventlog.retention`)."""
        keep = MAX_SEQ if keep_after_seq is None else keep_after_seq
        budget = bounds.events
        events = deltas = sessions = 0
        cursor: tuple[str, str] | None = None
        after = 0
        db = self._db
        with db:
            idle = _keys(db.execute(
                "SELECT user_id, session_id FROM sessions s WHERE app_name = ?"
                f" AND updated_at < ? AND last_seq <= ? AND NOT EXISTS ({_LEASED.format(t='s')})"
                " ORDER BY user_id, session_id LIMIT ?",
                (app, cutoff_us, keep, now_us, bounds.sessions),
            ).fetchall())
            for user, session in idle:
                key = (app, user, session)
                done = previous.after_seq if previous and previous.cursor == (user, session) else 0
                db.execute(
                    "DELETE FROM state_deltas WHERE rev IN (SELECT rev FROM state_deltas"
                    " WHERE scope = 'session' AND app_name = ? AND user_id = ? AND session_id = ?"
                    " ORDER BY seq, rev LIMIT ?)",
                    (*key, budget),
                )
                n = db.changes()
                deltas, budget = deltas + n, budget - n
                if budget == 0:
                    cursor, after = (user, session), done
                    break
                gone = _seqs(db.execute(
                    "DELETE FROM events WHERE seq IN (SELECT seq FROM events"
                    " INDEXED BY events_by_session WHERE app_name = ? AND user_id = ?"
                    " AND session_id = ? AND seq > ? ORDER BY seq LIMIT ?) RETURNING seq",
                    (*key, done, budget),
                ).fetchall())
                events, budget = events + len(gone), budget - len(gone)
                if budget == 0 and db.execute(
                    "SELECT 1 FROM events WHERE app_name = ? AND user_id = ? AND session_id = ?"
                    " AND seq > ? LIMIT 1",
                    (*key, max(gone)),
                ).fetchone():
                    cursor, after = (user, session), max(gone)
                    break
                # Nothing left under it: the cascade and the trigger delete nothing.
                db.execute(
                    "DELETE FROM sessions WHERE app_name = ? AND user_id = ? AND session_id = ?",
                    key,
                )
                sessions += 1
                if budget == 0:
                    break
        more = budget == 0 or len(idle) == bounds.sessions
        return Step(events=events, rows=events + deltas, sessions=sessions, more=more,
                    cursor=cursor, after_seq=after)

    @_translated
    def drop_old_events(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: int | None,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        """One bounded step of deleting the app's events timestamped before
        ``cutoff_us`` (none of a leased session, none after ``keep_after_seq``),
        in seq order from where the step before stopped."""
        keep = MAX_SEQ if keep_after_seq is None else keep_after_seq
        done = previous.after_seq if previous else 0
        with self._db:
            gone = _seqs(self._db.execute(
                "DELETE FROM events WHERE seq IN (SELECT seq FROM events e WHERE app_name = ?"
                f" AND event_time < ? AND seq > ? AND seq <= ?"
                f" AND NOT EXISTS ({_LEASED.format(t='e')}) ORDER BY seq LIMIT ?) RETURNING seq",
                (app, cutoff_us, done, keep, now_us, bounds.events),
            ).fetchall())
        n = len(gone)
        return Step(events=n, rows=n, more=n == bounds.events, after_seq=max(gone, default=done))

    @_translated
    def trim_sessions(
        self,
        app: str,
        max_events: int,
        keep_after_seq: int | None,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        """One bounded step of cutting the app's sessions (in key order, from
        the previous step's cursor on) to their newest ``max_events`` events,
        oldest first; the step's cursor is the first session the next step
        looks at. Each session's cut point is found by walking
        ``events_by_session`` back ``max_events`` entries, not by counting the
        session."""
        keep = MAX_SEQ if keep_after_seq is None else keep_after_seq
        budget = bounds.events
        start = previous.cursor if previous else None
        cursor: tuple[str, str] | None = None
        after = 0
        db = self._db
        with db:
            # One more than looked at, to know where the next step starts.
            page = _keys(db.execute(
                "SELECT user_id, session_id FROM sessions s WHERE app_name = ?"
                " AND (user_id, session_id) >= (?, ?)"
                f" AND NOT EXISTS ({_LEASED.format(t='s')})"
                " ORDER BY user_id, session_id LIMIT ?",
                (app, *(start or ("", "")), now_us, bounds.sessions + 1),
            ).fetchall())
            if len(page) > bounds.sessions:
                cursor = page.pop()
            walked = 0
            for user, session in page:
                # Finding a cut point reads up to max_events + 1 index entries:
                # bounded per step too (one session always, to move on).
                if walked and walked + max_events + 1 > bounds.events:
                    cursor = (user, session)
                    break
                walked += max_events + 1
                key = (app, user, session)
                cut = db.execute(
                    "SELECT seq FROM events INDEXED BY events_by_session"
                    " WHERE app_name = ? AND user_id = ? AND session_id = ?"
                    " ORDER BY seq DESC LIMIT 1 OFFSET ?",
                    (*key, max_events),
                ).fetchone()
                if cut is None:
                    continue
                done = previous.after_seq if previous and start == (user, session) else 0
                gone = _seqs(db.execute(
                    "DELETE FROM events WHERE seq IN (SELECT seq FROM events"
                    " INDEXED BY events_by_session"
                    " WHERE app_name = ? AND user_id = ? AND session_id = ?"
                    " AND seq > ? AND seq <= ? AND seq <= ? ORDER BY seq LIMIT ?) RETURNING seq",
                    (*key, done, cut[0], keep, budget),
                ).fetchall())
                budget -= len(gone)
                if budget == 0:
                    # It may have more to cut: again next step, after these.
                    cursor, after = (user, session), max(gone)
                    break
        deleted = bounds.events - budget
        return Step(events=deleted, rows=deleted, more=cursor is not None, cursor=cursor,
                    after_seq=after)

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

    # -- leases --

    @_translated
    def acquire_lease(
        self, app: str, user: str, session: str, holder: str, stale_after_ms: int, now_us: int
    ) -> None:
        """Take the lease for ``holder``, who promises to beat more often than
        ``stale_after_ms``. An existing lease is judged by the window its own
        holder declared, never by ours."""
        key = (app, user, session)
        with self._db:
            row = self._db.execute(
                "SELECT holder, heartbeat_at, stale_after_ms FROM leases"
                " WHERE app_name = ? AND user_id = ? AND session_id = ?",
                key,
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at,"
                    " heartbeat_at, stale_after_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (*key, holder, now_us, now_us, stale_after_ms),
                )
                return
            old_holder, old_beat, old_window_ms = row
            age_ms = max(0, (now_us - old_beat) // 1000)
            if age_ms < old_window_ms:
                raise rules.locked(session, old_holder, age_ms, "is locked")
            if not _steal(self._db, key, old_holder, old_beat, holder, stale_after_ms, now_us):
                raise rules.locked(session, old_holder, age_ms, "was taken by another stealer")

    @_translated
    def heartbeat_lease(self, app: str, user: str, session: str, holder: str, now_us: int) -> bool:
        """True while we hold the lease; False means it was stolen (or released)."""
        with self._db:
            self._db.execute(
                "UPDATE leases SET heartbeat_at = ?"
                " WHERE app_name = ? AND user_id = ? AND session_id = ? AND holder = ?",
                (now_us, app, user, session, holder),
            )
            held = self._db.changes() == 1
        return held

    @_translated
    def release_lease(self, app: str, user: str, session: str, holder: str) -> bool:
        # Conditional on our holder: never delete a successor's lease.
        with self._db:
            self._db.execute(
                "DELETE FROM leases"
                " WHERE app_name = ? AND user_id = ? AND session_id = ? AND holder = ?",
                (app, user, session, holder),
            )
            released = self._db.changes() == 1
        return released

    @_translated
    def list_leases(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        clauses: list[filters.Clause] = []
        if app is not None:
            clauses.append(("app_name = ?", (app,)))
        if user is not None:
            clauses.append(("user_id = ?", (user,)))
        where, args = filters.render(clauses)
        found = self._db.execute(
            f"SELECT {rows.LEASE_COLUMNS} FROM leases WHERE {where}"
            " ORDER BY app_name, user_id, session_id",
            args,
        )
        return [rows.to_lease(row) for row in found]

    # -- boots --

    @_translated
    def record_boot(self, at_us: int, attempted: Sequence[str]) -> int:
        with self._db:
            row = self._db.execute(
                "INSERT INTO boots (boot_at, attempted) VALUES (?, ?) RETURNING id",
                (at_us, rows.json_text(list(attempted))),
            ).fetchone()
        assert row is not None
        return row[0]

    @_translated
    def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None:
        with self._db:
            self._db.execute(
                "UPDATE boots SET attempted = ? WHERE id = ?",
                (rows.json_text(list(attempted)), boot_id),
            )
            if self._db.changes() == 0:
                raise RpcError(INVALID_PARAMS, f"no boot with id {boot_id}", {"id": boot_id})

    @_translated
    def recent_boots(self, since_us: int) -> list[Boot]:
        found = self._db.execute(
            "SELECT id, boot_at, attempted FROM boots WHERE boot_at >= ? ORDER BY boot_at, id",
            (since_us,),
        )
        return [rows.to_boot(row) for row in found]

    # -- health --

    @_translated
    def ping(self) -> None:
        """A real, bounded read: the schema version and the newest seq (one index
        probe each). Fails with source_unavailable when the file is unreadable."""
        with self._snapshot() as db:
            version = db.pragma("user_version")
            if version != SCHEMA_VERSION:
                raise RpcError(
                    SOURCE_UNAVAILABLE,
                    f"event log schema version is {version}, expected {SCHEMA_VERSION}",
                )
            db.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1").fetchall()

    @_translated
    def newest_seq(self) -> int:
        """The newest seq ever given (deleted events still count), as committed."""
        return _newest_seq(self._db)

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


@dataclass(frozen=True, slots=True)
class _EventBounds:
    """Which of a session's events a read returns: after a seq, at or after a
    time, the newest ``recent`` of those. Each read is pinned to the index that
    answers it, so its cost follows what it returns: ``events_by_session``
    (equality on the session, a range of seq) normally, and
    ``events_by_session_time`` (a range of time) with a time bound. ``recent``
    finds the window's first seq by walking that index backwards ``recent``
    entries, then reads forward from it."""

    after_seq: int
    recent: int | None
    after_time_us: int | None
    content: bool = True

    def _where(self, key: tuple[str, str, str], after_seq: int) -> tuple[str, str, tuple[Any, ...]]:
        where = "app_name = ? AND user_id = ? AND session_id = ? AND seq > ?"
        args: tuple[Any, ...] = (*key, after_seq)
        if self.after_time_us is None:
            return "events INDEXED BY events_by_session", where, args
        return (
            "events INDEXED BY events_by_session_time",
            where + " AND event_time >= ?",
            (*args, self.after_time_us),
        )

    def window(self, key: tuple[str, str, str]) -> tuple[str, tuple[Any, ...]] | None:
        """The query for the first seq of the ``recent`` window, if any."""
        if self.recent is None:
            return None
        table, where, args = self._where(key, self.after_seq)
        return (
            f"SELECT seq FROM {table} WHERE {where} ORDER BY seq DESC LIMIT 1 OFFSET ?",
            (*args, self.recent - 1),
        )

    def read(self, key: tuple[str, str, str], after_seq: int) -> tuple[str, tuple[Any, ...]]:
        table, where, args = self._where(key, after_seq)
        columns = rows.ENTRY_COLUMNS if self.content else rows.ENTRY_COLUMNS_WITHOUT_CONTENT
        return f"SELECT {columns} FROM {table} WHERE {where} ORDER BY seq", args

    def queries(
        self, key: tuple[str, str, str], after_seq: int
    ) -> list[tuple[str, tuple[Any, ...]]]:
        window = self.window(key)
        return ([window] if window else []) + [self.read(key, after_seq)]


def _session_with_events(
    db: apsw.Connection,
    app: str,
    user: str,
    session: str,
    bounds: _EventBounds,
    shape: rows.Shape,
    max_bytes: int | None,
    min_one: bool,
    scoped_state: bool,
) -> SessionWithEvents | None:
    """One session and its events within ``bounds`` (None if never written),
    inside the caller's snapshot; at most ``max_bytes`` on the wire in all."""
    row = db.execute(
        f"SELECT {rows.SESSION_COLUMNS} FROM sessions"
        " WHERE app_name = ? AND user_id = ? AND session_id = ?",
        (app, user, session),
    ).fetchone()
    if row is None:
        return None
    base = rows.to_session(row)
    app_state = user_state = None
    if scoped_state:
        app_state, user_state = _shared_state(db, app, user)
    budget = None
    if max_bytes is not None:
        budget = max_bytes - wire_size(base)
        if scoped_state:
            budget -= wire_size([app_state, user_state])
    key = (app, user, session)
    start = bounds.after_seq
    events: list[Any] = []
    last, more = None, False
    if bounds.recent != 0:
        window = bounds.window(key)
        if window is not None:
            # The window is the newest `recent` events; read it oldest first
            # from its first seq, so a cut keeps seq order and the rest is
            # what follows the last event returned.
            first = db.execute(*window).fetchone()
            if first is not None:
                start = first[0] - 1
        if budget is not None and budget <= 0 and not min_one:
            more = db.execute(*bounds.read(key, start)).fetchone() is not None
        else:
            events, last, more = _read_entries(
                db, *bounds.read(key, start), bounds.recent, shape, budget, min_one
            )
    return SessionWithEvents(
        app=base.app,
        user=base.user,
        session=base.session,
        state=base.state,
        created_at=base.created_at,
        updated_at=base.updated_at,
        last_seq=base.last_seq,
        last_event_time=base.last_event_time,
        events=events,
        truncated=more,
        next_seq=(start if last is None else last) if more else None,
        app_state=app_state,
        user_state=user_state,
    )


def _read_entries(
    db: apsw.Connection,
    sql: str,
    args: tuple[Any, ...],
    limit: int | None,
    shape: rows.Shape,
    max_bytes: int | None,
    min_one: bool = True,
) -> tuple[list[Any], int | None, bool]:
    """:func:`~streamd.eventlog.store.rows.take` over a query's rows; the cursor
    is closed at once, so rows past the cut are never read."""
    cursor = db.execute(sql, args)
    try:
        return rows.take(cursor, limit, shape, max_bytes, min_one)
    finally:
        cursor.close()


def _append_items(
    db: apsw.Connection,
    prepared: list[rows.Prepared | list[rows.Prepared] | RpcError],
    now_us: int,
    capture: bool,
    careful: bool,
) -> tuple[list[AppendResult | list[AppendResult] | RpcError], list[tuple[Any, ...]] | None]:
    """Append ``prepared`` in the caller's transaction: each item (an append,
    or a group) in its own savepoint when ``careful``, so a refused one is
    rolled back alone and answered with its error; otherwise with no savepoint
    of its own, the first refusal raised (the caller rolls the lot back)."""
    out: list[AppendResult | list[AppendResult] | RpcError] = []
    added: list[tuple[Any, ...]] | None = [] if capture else None
    # Sessions an append of this transaction has already upserted (see
    # _append_one); like ``added``, a group's join only once it is in.
    upserted: set[tuple[str, str, str]] = set()
    for item in prepared:
        if isinstance(item, RpcError):
            out.append(item)
            continue
        if not careful:
            if isinstance(item, list):
                out.append([_in_group(db, one, i, now_us, added, upserted)
                            for i, one in enumerate(item)])
            else:
                out.append(_append_one(db, item, now_us, added, upserted))
            continue
        # Rows join ``added`` only once their savepoint has released: a
        # refused event (or group) was rolled back and nobody may see it.
        pending: list[tuple[Any, ...]] | None = [] if capture else None
        try:
            with db:
                if isinstance(item, list):
                    in_group = set(upserted)
                    out.append([_in_group(db, one, i, now_us, pending, in_group)
                                for i, one in enumerate(item)])
                    upserted = in_group
                else:
                    out.append(_append_one(db, item, now_us, pending, upserted))
        except RpcError as exc:
            out.append(exc)
            continue
        except apsw.ConstraintError as exc:
            out.append(invalid_params(f"event rejected by the database: {exc}"))
            continue
        if added is not None and pending:
            added.extend(pending)
    return out, added


def _append_one(
    db: apsw.Connection,
    item: rows.Prepared,
    now_us: int,
    added: list[tuple[Any, ...]] | None = None,
    upserted: set[tuple[str, str, str]] | None = None,
) -> AppendResult:
    """Append one event in the caller's savepoint; with ``added``, put the new
    row there in :data:`~streamd.eventlog.store.rows.ENTRY_COLUMNS` order.

    ``upserted`` holds the sessions already upserted in this transaction, at
    this ``now_us``, by appends that are in (their savepoint released, or
    earlier in this one's group): for those the upsert would change nothing
    (the row exists, its ``updated_at`` is already at least ``now_us``), so it
    is skipped; this append's session joins the set once it has succeeded.
    A batch of 200 appends to 8 sessions runs 8 upserts, not 200: one
    statement in three of the usual append."""
    p = item.params
    ev = p.event
    existing = db.execute("SELECT seq, digest FROM events WHERE event_id = ?", (ev.id,)).fetchone()
    if existing is not None:
        seq, digest = existing
        if digest == item.digest:
            return AppendResult(seq=seq, duplicate=True)
        raise RpcError(
            EVENT_CONFLICT,
            f"event {ev.id!r} was already appended with different content (seq {seq})",
            {"event_id": ev.id, "seq": seq},
        )
    if p.expected_seq is not None:
        _check_expected(db, p.app, p.user, p.session, p.expected_seq)
    # The session row exists from the first append on, so sessions.get can tell a
    # session that was written from one that never was.
    key = (p.app, p.user, p.session)
    if upserted is None or key not in upserted:
        db.execute(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at, updated_at)"
            " VALUES (?, ?, ?, '{}', ?, ?)"
            " ON CONFLICT (app_name, user_id, session_id)"
            " DO UPDATE SET updated_at = max(updated_at, excluded.updated_at)",
            (p.app, p.user, p.session, now_us, now_us),
        )
    row = db.execute(
        "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id, author,"
        " branch, event_time, content, metadata, digest, state_delta)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
        (
            p.app,
            p.user,
            p.session,
            ev.id,
            ev.invocation_id,
            ev.author,
            ev.branch,
            item.event_time,
            item.content,
            item.metadata,
            item.digest,
            item.state_delta_text,
        ),
    ).fetchone()
    assert row is not None
    seq = row[0]
    if item.state_delta is not None:
        _apply_delta(db, p.app, p.user, p.session, item.state_delta, seq, now_us)
    if added is not None:
        added.append(
            (seq, p.app, p.user, p.session, ev.id, ev.invocation_id, ev.author, ev.branch,
             item.event_time, item.content, item.metadata, item.state_delta_text)
        )
    if upserted is not None:
        upserted.add(key)
    return AppendResult(seq=seq, duplicate=False)


def _check_expected(db: apsw.Connection, app: str, user: str, session: str, expected: int) -> None:
    """Optimistic concurrency: the writer computed this append from the session
    as of ``expected``; if anything was appended since, the append must be
    recomputed, not merged. One primary-key read of ``sessions.last_seq``,
    inside the append's transaction, so no writer can slip in between."""
    found = db.execute(
        "SELECT last_seq FROM sessions WHERE app_name = ? AND user_id = ? AND session_id = ?",
        (app, user, session),
    ).fetchone()
    if found is None:
        raise rules.not_found(app, user, session)
    if found[0] != expected:
        raise RpcError(
            STALE_SESSION,
            f"session {session!r} has moved on: its last seq is {found[0]}, the append was"
            f" computed at seq {expected}; nothing was written, read the session again",
            {"expected_seq": expected, "last_seq": found[0]},
        )


# --- typed rows -------------------------------------------------------------


def _keys(found: list[apsw.SQLiteValues]) -> list[tuple[str, str]]:
    """(user_id, session_id) rows: TEXT NOT NULL columns."""
    keys = []
    for user, session in found:
        assert isinstance(user, str) and isinstance(session, str), (user, session)
        keys.append((user, session))
    return keys


def _seqs(found: list[apsw.SQLiteValues]) -> list[int]:
    """``RETURNING seq`` rows: an INTEGER PRIMARY KEY."""
    seqs = []
    for (seq,) in found:
        assert isinstance(seq, int), seq
        seqs.append(seq)
    return seqs


# --- state ------------------------------------------------------------------


def _newest_seq(db: apsw.Connection) -> int:
    """The newest seq ever given, even if its event was deleted since: where a
    write that is not an event (a session's creation) takes its place in the
    state's history, after every delta already written."""
    row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    return row[0] if row else 0


def _session_exists(db: apsw.Connection, app: str, user: str, session: str) -> bool:
    return (
        db.execute(
            "SELECT 1 FROM sessions WHERE app_name = ? AND user_id = ? AND session_id = ?",
            (app, user, session),
        ).fetchone()
        is not None
    )


def _shared_state(
    db: apsw.Connection, app: str, user: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The app's current state, and the user's when ``user`` is given."""
    found = db.execute("SELECT state FROM app_states WHERE app_name = ?", (app,)).fetchone()
    app_state = rows.state_or_empty(found[0] if found else None, f"app {app!r}")
    if user is None:
        return app_state, None
    found = db.execute(
        "SELECT state FROM user_states WHERE app_name = ? AND user_id = ?", (app, user)
    ).fetchone()
    return app_state, rows.state_or_empty(found[0] if found else None, f"user {user!r}")


def _fold(
    db: apsw.Connection, scope: str, app: str, user: str, session: str, as_of_seq: int
) -> dict[str, Any]:
    """One scope's state as of a seq: its deltas up to that seq, in the order
    they were written (``state_deltas_by_key`` holds them in that order)."""
    state: dict[str, Any] = {}
    found = db.execute(
        "SELECT delta FROM state_deltas"
        " WHERE scope = ? AND app_name = ? AND user_id = ? AND session_id = ? AND seq <= ?"
        " ORDER BY seq, rev",
        (scope, app, user, session, as_of_seq),
    )
    for (text,) in found:
        state.update(rows.state_or_empty(text, f"{scope} delta"))
    return state


def _apply_delta(
    db: apsw.Connection,
    app: str,
    user: str,
    session: str,
    delta: StateDelta,
    at_seq: int,
    now_us: int,
) -> None:
    """Record each scope's delta at ``at_seq`` and fold it into that scope's
    current state; the caller's transaction holds both, and the event."""
    if delta.app:
        _merge(db, "app_states", "app_name = ?", (app,), f"app {app!r}", delta.app, now_us)
        _record(db, "app", app, "", "", at_seq, delta.app)
    if delta.user:
        _merge(
            db,
            "user_states",
            "app_name = ? AND user_id = ?",
            (app, user),
            f"user {user!r}",
            delta.user,
            now_us,
        )
        _record(db, "user", app, user, "", at_seq, delta.user)
    if delta.session:
        found = db.execute(
            "SELECT state FROM sessions WHERE app_name = ? AND user_id = ? AND session_id = ?",
            (app, user, session),
        ).fetchone()
        assert found is not None  # the caller wrote the session row
        state = rules.parsed_for_merge(found[0], f"session {session!r}")
        state.update(delta.session)
        db.execute(
            "UPDATE sessions SET state = ? WHERE app_name = ? AND user_id = ? AND session_id = ?",
            (rows.json_text(state), app, user, session),
        )
        _record(db, "session", app, user, session, at_seq, delta.session)


def _merge(
    db: apsw.Connection,
    table: str,
    where: str,
    key: tuple[str, ...],
    what: str,
    delta: dict[str, Any],
    now_us: int,
) -> None:
    found = db.execute(f"SELECT state FROM {table} WHERE {where}", key).fetchone()
    state = rules.parsed_for_merge(found[0], what) if found else {}
    state.update(delta)
    text = rows.json_text(state)
    if found:
        db.execute(
            f"UPDATE {table} SET state = ?, updated_at = ? WHERE {where}", (text, now_us, *key)
        )
    else:
        columns = "app_name" if len(key) == 1 else "app_name, user_id"
        marks = ", ".join("?" * (len(key) + 2))
        db.execute(
            f"INSERT INTO {table} ({columns}, state, updated_at) VALUES ({marks})",
            (*key, text, now_us),
        )


def _record(
    db: apsw.Connection,
    scope: str,
    app: str,
    user: str,
    session: str,
    at_seq: int,
    delta: dict[str, Any],
) -> None:
    db.execute(
        "INSERT INTO state_deltas (scope, app_name, user_id, session_id, seq, delta)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (scope, app, user, session, at_seq, rows.json_text(delta)),
    )


def _in_group(
    db: apsw.Connection,
    item: rows.Prepared,
    index: int,
    now_us: int,
    added: list[tuple[Any, ...]] | None,
    upserted: set[tuple[str, str, str]] | None = None,
) -> AppendResult:
    try:
        return _append_one(db, item, now_us, added, upserted)
    except RpcError as exc:
        raise rules.refused_in_group(exc, index) from None
    except apsw.ConstraintError as exc:
        raise rules.refused_in_group(
            invalid_params(f"event rejected by the database: {exc}"), index
        ) from None


def _steal(
    db: apsw.Connection,
    key: tuple[str, str, str],
    old_holder: str,
    old_beat: int,
    new_holder: str,
    new_window_ms: int,
    now_us: int,
) -> bool:
    """Take a stale lease only if it is still exactly the stale lease we saw.

    Within SQLite's IMMEDIATE transaction nobody can interleave, but the rule is
    stated as a conditional update so that every backend (PostgreSQL under READ
    COMMITTED included) keeps it: of two stealers only one update matches.
    """
    db.execute(
        "UPDATE leases SET holder = ?, acquired_at = ?, heartbeat_at = ?, stale_after_ms = ?"
        " WHERE app_name = ? AND user_id = ? AND session_id = ?"
        " AND holder = ? AND heartbeat_at = ?",
        (new_holder, now_us, now_us, new_window_ms, *key, old_holder, old_beat),
    )
    return db.changes() == 1


