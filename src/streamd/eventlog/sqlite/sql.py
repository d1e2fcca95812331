"""An APSW connection as the storage rules use it (:class:`~streamd.eventlog.store.sql.Sql`).

Statements run as written (SQLite takes ``?``). Writes are ``with db:``,
which begins ``IMMEDIATE`` on these connections: a write reads (a duplicate
check, a lease) before it writes, and a deferred transaction that has read
cannot wait for the write lock. The one writer at a time is also why
:meth:`SqliteSql.newest_seq` needs no lock of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from typing import Any

import apsw

from streamd.eventlog import filters
from streamd.eventlog.model import Filter
from streamd.eventlog.sqlite import lossy_text
from streamd.eventlog.store.sql import Args, Row, Rows

__all__ = ["SqliteSql", "indexed_by", "newest_seq"]

# A since whose cursor is this close to the newest seq reads the rows past the
# cursor by primary key instead of through the filter's index (see events_source).
_TAIL_SCAN_ROWS = 2048


def indexed_by(flt: Filter | None) -> str:
    """The FROM clause that pins a filtered read to the index that answers it."""
    if flt is None:
        return "events"
    app_user = flt.app is not None and flt.user is not None
    if (
        flt.session_tree is not None
        or filters.in_session_order(flt)
        or (app_user and flt.session is not None)
        # A user and an author: the user's range, not the author's. A log has
        # few authors and many users, and the planner, without statistics,
        # took the author's: 204 ms against 24 ms for a user none of whose
        # events has a common author, at a million events.
        or (app_user and flt.author is not None and flt.branch_prefixes is None)
    ):
        return "events INDEXED BY events_by_session"
    if flt.branch_prefixes and filters.branch_prefixes(flt.branch_prefixes):
        return "events INDEXED BY events_by_branch"
    if flt.author is not None:
        return "events INDEXED BY events_by_author"
    return "events"


def newest_seq(db: apsw.Connection) -> int:
    """The newest seq ever given, even if its event was deleted since: where a
    write that is not an event (a session's creation) takes its place in the
    state's history, after every delta already written."""
    row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    return row[0] if row else 0


class SqliteSql:
    """One APSW connection behind the storage rules' protocol."""

    __slots__ = ("_db", "_lossy")

    dialect = filters.SQLITE
    duplicate_key: tuple[type[BaseException], ...] = (apsw.ConstraintError,)
    bad_value: tuple[type[BaseException], ...] = ()

    def __init__(self, db: apsw.Connection) -> None:
        self._db = db
        # Set for a store call run again after it met text that is not
        # UTF-8 (:meth:`lossy`): reads decode it with U+FFFD.
        self._lossy = False

    @property
    def connection(self) -> apsw.Connection:
        """The connection itself, for the store's own statements."""
        return self._db

    @contextmanager
    def lossy(self) -> Iterator[None]:
        """Within it, text that is not UTF-8 is read with U+FFFD for each bad
        byte (:mod:`.lossy_text`), where APSW raises ``UnicodeDecodeError``."""
        self._lossy = True
        try:
            yield
        finally:
            self._lossy = False

    def rows(self, sql: str, args: Args = ()) -> list[Row]:
        if self._lossy:
            return list(lossy_text.rows(self._db, sql, args))
        return self._db.execute(sql, args).fetchall()

    def one(self, sql: str, args: Args = ()) -> Row | None:
        if self._lossy:
            with closing(lossy_text.rows(self._db, sql, args)) as found:
                return next(found, None)
        return self._db.execute(sql, args).fetchone()

    def run(self, sql: str, args: Args = ()) -> int:
        self._db.execute(sql, args)
        return self._db.changes()

    def insert_id(self, sql: str, args: Args = ()) -> int:
        self._db.execute(sql, args)
        return self._db.last_insert_rowid()

    def insert_absent(self, sql: str, args: Args = ()) -> bool:
        done = self._db.execute(sql + " ON CONFLICT DO NOTHING RETURNING 1", args)
        return done.fetchone() is not None

    def delete_returning(self, table: str, key: str, select: str, args: Args = ()) -> list[int]:
        return [k for k, in self._db.execute(
            f"DELETE FROM {table} WHERE {key} IN ({select}) RETURNING {key}", args
        )]

    def update_each(
        self, table: str, assignment: str, args: Args, columns: Sequence[str], keys: Sequence[Row]
    ) -> list[bool]:
        # One statement run once a key, with no round trip to save: APSW
        # keeps it prepared, and executemany runs it without a Python call a
        # key. Each run matches at most one row, so the count of rows changed
        # says whether every key matched; only when one did not is each run
        # again, alone, to say which (an update run twice in one transaction
        # writes the same value). 3,000 keys: 8-21 ms, against 9-28 ms a key
        # at a time and 32 ms as one statement (``IN (VALUES ...)``, runs of
        # 256); an OR of the keys cost SQLite's planner 63 ms.
        if not keys:
            return []
        db = self._db
        sql = f"UPDATE {table} SET {assignment} WHERE " + " AND ".join(f"{c} = ?" for c in columns)
        before = db.total_changes()
        db.executemany(sql, [(*args, *key) for key in keys])
        if db.total_changes() - before == len(keys):
            return [True] * len(keys)
        matched = []
        for key in keys:
            db.execute(sql, (*args, *key))
            matched.append(db.changes() > 0)
        return matched

    def delete_each(self, table: str, columns: Sequence[str], keys: Sequence[Row]) -> int:
        # As update_each: one prepared statement, run once a key in C.
        if not keys:
            return 0
        db = self._db
        before = db.total_changes()
        db.executemany(
            f"DELETE FROM {table} WHERE " + " AND ".join(f"{c} = ?" for c in columns), keys
        )
        return int(db.total_changes() - before)

    def scan(self, sql: str, args: Args = ()) -> Rows:
        # The cursor itself: iterated in C, and closed by the consumer when it
        # stops, so rows past a cut are never read.
        if self._lossy:
            return lossy_text.rows(self._db, sql, args)
        return self._db.execute(sql, args)

    def scan_events(
        self, select: Callable[[int], tuple[str, Args]], after: int
    ) -> Rows:
        return self.scan(*select(after))

    def events_source(self, flt: Filter | None, from_seq: int | None) -> str:
        """Without statistics SQLite guesses that a branch range matches a
        quarter of the table and, with ``ORDER BY seq LIMIT n``, prefers
        walking the primary key and filtering; for a subtree that is a few
        percent of the log that reads the whole table. So the path is stated,
        not guessed:

        * a caught-up cursor (few rows past it) walks the primary key from the
          cursor: at most ``tip - from_seq`` rows lie past it (seqs are unique),
          however large the filter's history is. ``NOT INDEXED`` still allows
          the INTEGER PRIMARY KEY.
        * a read filtered by session or session tree uses ``events_by_session``
          (equality on the triple, then a seq range, already in seq order), and
          so does one by an app or an app's user, whose range of it holds
          every field the filter tests (:func:`filters.in_session_order`), and
          one by an app's user and an author;
        * a read filtered by branch alone uses ``events_by_branch``;
        * one by an author otherwise, ``events_by_author`` (the planner chose
          ``events_by_app_time`` for an app and an author: 340-380 ms at a
          million events, 0.1-4.4 ms now).
        """
        if from_seq is not None:
            row = self._db.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            tip: Any = row[0] if row else 0
            if tip - from_seq <= _TAIL_SCAN_ROWS:
                return "events NOT INDEXED"
        return indexed_by(flt)

    def write(self, single: bool = False, removes: bool = False) -> AbstractContextManager[object]:
        # ``removes`` needs nothing here: a write transaction (BEGIN
        # IMMEDIATE) already excludes every other writer, so marks commit in
        # the order they are given.
        return self._db

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Deferred on purpose (``with db:`` would begin IMMEDIATE and take the
        write lock for a read)."""
        db = self._db
        db.execute("BEGIN DEFERRED")
        try:
            yield
        except BaseException:
            if not db.get_autocommit():
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def newest_seq(self, lock: bool = False) -> int:
        return newest_seq(self._db)

    def lease_now(self, now_us: int) -> tuple[str, tuple[Any, ...]]:
        return "?", (now_us,)

    def describe(self, exc: BaseException) -> str:
        return str(exc)
