"""A psycopg connection as the storage rules use it (:class:`~streamd.eventlog.store.sql.Sql`).

The rules write ``?``; psycopg takes ``%s``, so each statement text is turned
once and then found in a cache. The connection is in autocommit: a write is
``BEGIN``/``COMMIT`` (:meth:`PgSql.write`), except a single statement, which
is its own transaction; a snapshot is REPEATABLE READ READ ONLY. The newest
seq is the one row of ``seq_counter``, locked ``FOR UPDATE`` by a writer that
must take its place after every seq committed (see
:mod:`~streamd.eventlog.postgres.schema` for why a sequence would not do);
a writer that deletes events locks ``removal_order`` the same way, for its
removal marks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import psycopg
import psycopg.errors

from streamd.eventlog import filters
from streamd.eventlog.model import Filter
from streamd.eventlog.store.sql import Args, Row, Rows, paged

__all__ = ["DB_NOW_US", "READ_PAGE", "PgSql"]

DB_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
"""The database's clock in microseconds: what leases are stamped and judged by."""
READ_PAGE = 1000
"""Rows fetched per query by reads that have no limit of their own
(``sessions.get`` of a long session), so a read cut by its byte budget never
loads what it leaves out."""

_DIALECT = filters.POSTGRES.marked("?")


@functools.lru_cache(maxsize=1024)
def _marks(sql: str) -> str:
    """``sql`` with psycopg's placeholders (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgSql:
    """One psycopg connection behind the storage rules' protocol."""

    __slots__ = ("_db", "_db_clock", "_describe")

    dialect = _DIALECT
    duplicate_key: tuple[type[BaseException], ...] = (psycopg.errors.UniqueViolation,)
    bad_value: tuple[type[BaseException], ...] = (psycopg.DataError,)

    def __init__(
        self,
        db: psycopg.Connection[Any],
        describe: Callable[[BaseException], str],
        db_clock: bool,
    ) -> None:
        self._db = db
        self._describe = describe
        self._db_clock = db_clock

    def rows(self, sql: str, args: Args = ()) -> list[Row]:
        return self._db.execute(_marks(sql), args).fetchall()

    def one(self, sql: str, args: Args = ()) -> Row | None:
        return self._db.execute(_marks(sql), args).fetchone()

    def run(self, sql: str, args: Args = ()) -> int:
        return self._db.execute(_marks(sql), args).rowcount

    def insert_id(self, sql: str, args: Args = ()) -> int:
        row = self._db.execute(_marks(sql + " RETURNING id"), args).fetchone()
        assert row is not None
        return int(row[0])

    def insert_absent(self, sql: str, args: Args = ()) -> bool:
        done = self._db.execute(_marks(sql + " ON CONFLICT DO NOTHING RETURNING 1"), args)
        return done.fetchone() is not None

    def delete_returning(self, table: str, key: str, select: str, args: Args = ()) -> list[int]:
        return [k for k, in self._db.execute(
            _marks(f"DELETE FROM {table} WHERE {key} IN ({select}) RETURNING {key}"), args
        ).fetchall()]

    def update_each(
        self, table: str, assignment: str, args: Args, columns: Sequence[str], keys: Sequence[Row]
    ) -> list[bool]:
        # One statement, one round trip, whatever the count: the keys go as
        # one array a column (no parameter limit near), unnested into rows
        # and joined on the key; RETURNING names the rows it matched.
        if not keys:
            return []
        arrays = ", ".join("?::text[]" for _ in columns)
        names = ", ".join(columns)
        on = " AND ".join(f"t.{c} = k.{c}" for c in columns)
        returned = ", ".join(f"t.{c}" for c in columns)
        sql = (
            f"UPDATE {table} AS t SET {assignment} FROM unnest({arrays}) AS k({names})"
            f" WHERE {on} RETURNING {returned}"
        )
        by_column = ([key[i] for key in keys] for i in range(len(columns)))
        found = set(self._db.execute(_marks(sql), (*args, *by_column)).fetchall())
        return [tuple(key) in found for key in keys]

    def delete_each(self, table: str, columns: Sequence[str], keys: Sequence[Row]) -> int:
        # One statement, as update_each: the keys as one array a column.
        if not keys:
            return 0
        arrays = ", ".join("?::text[]" for _ in columns)
        on = " AND ".join(f"t.{c} = k.{c}" for c in columns)
        sql = (
            f"DELETE FROM {table} AS t USING unnest({arrays}) AS k({', '.join(columns)})"
            f" WHERE {on}"
        )
        by_column = ([key[i] for key in keys] for i in range(len(columns)))
        return int(self._db.execute(_marks(sql), tuple(by_column)).rowcount)

    def scan(self, sql: str, args: Args = ()) -> Rows:
        # fetchall: psycopg builds the rows in C in one go (900k rows/s here),
        # where iterating the cursor costs a Python call per row (400k rows/s).
        yield from self._db.execute(_marks(sql), args).fetchall()

    def scan_events(
        self, select: Callable[[int], tuple[str, Args]], after: int
    ) -> Rows:
        """A page of rows at a time, so a consumer that stops (its byte budget
        is spent) stops the reads."""
        return paged(self.rows, select, after, READ_PAGE)

    def events_source(self, flt: Filter | None, from_seq: int | None) -> str:
        return "events"

    def write(self, single: bool = False, removes: bool = False) -> AbstractContextManager[object]:
        if removes:
            return self._removing()
        return nullcontext() if single else self._db.transaction()

    @contextmanager
    def _removing(self) -> Iterator[object]:
        """A transaction that deletes events: ``removal_order`` locked first
        (see :meth:`Sql.write` and the schema's version 4)."""
        with self._db.transaction() as tx:
            self._db.execute("SELECT one FROM removal_order FOR UPDATE")
            yield tx

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        db = self._db
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield
        except BaseException:
            if not db.closed and not db.broken:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def newest_seq(self, lock: bool = False) -> int:
        sql = "SELECT seq FROM seq_counter FOR UPDATE" if lock else "SELECT seq FROM seq_counter"
        row = self._db.execute(sql).fetchone()
        return int(row[0]) if row else 0

    def lease_now(self, now_us: int) -> tuple[str, tuple[Any, ...]]:
        """The database's clock, or the caller's ``now_us``."""
        return (DB_NOW_US, ()) if self._db_clock else ("?::bigint", (now_us,))

    def describe(self, exc: BaseException) -> str:
        return self._describe(exc)
