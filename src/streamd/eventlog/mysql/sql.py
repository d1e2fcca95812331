"""A mysqlclient connection as the storage rules use it
(:class:`~streamd.eventlog.store.sql.Sql`).

The rules write ``?``; mysqlclient takes ``%s`` (and formats the statement
with ``%``, so a literal ``%`` is doubled), turned once per statement text.
The connection is in autocommit with ``CLIENT_FOUND_ROWS`` (an UPDATE counts
the rows it matched, as SQLite and PostgreSQL count them, not only those whose
value changed); a write is ``BEGIN``/``COMMIT``, always, since what is one
statement elsewhere (a delete that says what it deleted) is two here; a
snapshot is ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`` at
REPEATABLE READ (writes run at READ COMMITTED, as PostgreSQL's do).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import MySQLdb

from streamd.eventlog import filters
from streamd.eventlog.model import Filter
from streamd.eventlog.mysql import packets
from streamd.eventlog.store.sql import Args, Row, Rows, paged

__all__ = ["DB_NOW_US", "DUPLICATE_ENTRY", "READ_PAGE", "MySql", "error_code", "placeholders"]

DB_NOW_US = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
"""The database's clock in microseconds (the session's time zone is UTC, so no
daylight-saving hour is ambiguous): what leases are stamped and judged by."""
READ_PAGE = 1000
"""Rows fetched per query by reads that have no limit of their own."""
DUPLICATE_ENTRY = 1062

_DIALECT = filters.MYSQL.marked("?")


def error_code(exc: BaseException) -> int:
    """The error number of a driver error (the server's, or the client's own
    2xxx); 0 when it has none."""
    return exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0


def placeholders(values: Sequence[object]) -> str:
    """``?, ?, ...``, one per value: the list of an ``IN (...)``."""
    return ", ".join("?" * len(values))


@functools.lru_cache(maxsize=1024)
def _marks(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class MySql:
    """One mysqlclient connection behind the storage rules' protocol."""

    __slots__ = ("_cur", "_db", "_db_clock", "_describe", "_max_packet")

    dialect = _DIALECT
    duplicate_key: tuple[type[BaseException], ...] = (MySQLdb.IntegrityError,)
    bad_value: tuple[type[BaseException], ...] = (MySQLdb.DataError,)

    def __init__(
        self, db: Any, describe: Callable[[BaseException], str], db_clock: bool,
        max_packet: int = packets.DEFAULT_MAX_PACKET,
    ) -> None:
        self._db = db
        self._cur = db.cursor()
        self._describe = describe
        self._db_clock = db_clock
        self._max_packet = max_packet

    def _run(self, sql: str, args: Args) -> Any:
        cur = self._cur
        values = tuple(args)
        # Refused here, not sent: the server drops the connection under a
        # statement over its max_allowed_packet (see packets).
        packets.refuse_long_statement(sql, values, self._max_packet)
        cur.execute(_marks(sql), values)
        return cur

    def rows(self, sql: str, args: Args = ()) -> list[Row]:
        return list(self._run(sql, args).fetchall())

    def one(self, sql: str, args: Args = ()) -> Row | None:
        # The default cursor has read the whole result: nothing is left pending.
        row: Row | None = self._run(sql, args).fetchone()
        return row

    def run(self, sql: str, args: Args = ()) -> int:
        return int(self._run(sql, args).rowcount)

    def insert_id(self, sql: str, args: Args = ()) -> int:
        return int(self._run(sql, args).lastrowid)

    def insert_absent(self, sql: str, args: Args = ()) -> bool:
        # A refused statement is rolled back alone in InnoDB: the transaction
        # goes on. (INSERT IGNORE would also turn a value too long into a
        # warning and store it cut.)
        try:
            self._run(sql, args)
        except MySQLdb.IntegrityError as exc:
            if exc.args and exc.args[0] == DUPLICATE_ENTRY:
                return False
            raise
        return True

    def delete_returning(self, table: str, key: str, select: str, args: Args = ()) -> list[int]:
        # MySQL has no RETURNING, and no subquery of the table a DELETE deletes
        # from: the keys are read (locked) first, then deleted by value.
        keys = [k for k, in self._run(select + " FOR UPDATE", args).fetchall()]
        for start in range(0, len(keys), READ_PAGE):
            part = keys[start:start + READ_PAGE]
            self._run(f"DELETE FROM {table} WHERE {key} IN ({placeholders(part)})", part)
        return keys

    def update_each(
        self, table: str, assignment: str, args: Args, columns: Sequence[str], keys: Sequence[Row]
    ) -> list[bool]:
        # No RETURNING and no arrays here: a run of keys goes as one row list
        # (``(a, b) IN ((?, ?), ...)``, read by primary key), and the count of
        # rows it matched (CLIENT_FOUND_ROWS) says whether all of them did;
        # only when some did not are the matched keys read back.
        matched: list[bool] = []
        row = f"({placeholders(columns)})"
        for part in packets.key_runs(keys, self._max_packet, len(row) + 2):
            if len(part) == 1:
                # A list of one row MariaDB reads by scanning the whole index.
                listed = " AND ".join(f"{c} = ?" for c in columns)
            else:
                listed = f"({', '.join(columns)}) IN ({', '.join([row] * len(part))})"
            flat = [v for key in part for v in key]
            n = self.run(f"UPDATE {table} SET {assignment} WHERE {listed}", (*args, *flat))
            if n in (0, len(part)):
                matched.extend([n > 0] * len(part))
                continue
            found = set(self.rows(f"SELECT {', '.join(columns)} FROM {table} WHERE {listed}", flat))
            matched.extend(tuple(key) in found for key in part)
        return matched

    def delete_each(self, table: str, columns: Sequence[str], keys: Sequence[Row]) -> int:
        # As update_each: a run of keys a statement, as one row list.
        deleted = 0
        row = f"({placeholders(columns)})"
        for part in packets.key_runs(keys, self._max_packet, len(row) + 2):
            if len(part) == 1:
                listed = " AND ".join(f"{c} = ?" for c in columns)  # see update_each
            else:
                listed = f"({', '.join(columns)}) IN ({', '.join([row] * len(part))})"
            deleted += self.run(
                f"DELETE FROM {table} WHERE {listed}", tuple(v for key in part for v in key)
            )
        return deleted

    def scan(self, sql: str, args: Args = ()) -> Rows:
        yield from self._run(sql, args).fetchall()

    def scan_events(
        self, select: Callable[[int], tuple[str, Args]], after: int
    ) -> Rows:
        """A page of rows at a time, so a consumer that stops (its byte budget
        is spent) stops the reads."""
        return paged(self.rows, select, after, READ_PAGE)

    def events_source(self, flt: Filter | None, from_seq: int | None) -> str:
        return "events"

    @contextmanager
    def write(self, single: bool = False, removes: bool = False) -> Iterator[object]:
        db = self._db
        db.query("BEGIN")
        try:
            if removes:
                # Before anything else: see Sql.write and the schema's version 3.
                self._run("SELECT one FROM removal_order WHERE one = 1 FOR UPDATE", ())
            yield None
        except BaseException:
            _rollback(db)
            raise
        db.query("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        db = self._db
        db.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        db.query("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        try:
            yield
        except BaseException:
            _rollback(db)
            raise
        db.query("COMMIT")

    def newest_seq(self, lock: bool = False) -> int:
        lock_it = " FOR UPDATE" if lock else ""
        row = self.one("SELECT seq FROM seq_counter WHERE one = 1" + lock_it)
        return int(row[0]) if row else 0

    def lease_now(self, now_us: int) -> tuple[str, tuple[Any, ...]]:
        return (DB_NOW_US, ()) if self._db_clock else ("CAST(? AS SIGNED)", (now_us,))

    def describe(self, exc: BaseException) -> str:
        return self._describe(exc)


def _rollback(db: Any) -> None:
    try:
        db.query("ROLLBACK")
    except MySQLdb.Error:
        pass  # the connection broke: the server rolls back on its own
