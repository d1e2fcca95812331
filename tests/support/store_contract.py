"""The store contract's backends and values: one fixture per backend, events and appends."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest

from streamd.eventlog.model import (
    AppendParams,
    Event,
    Filter,
    SinceParams,
    to_us,
)
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.store import Backend

T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))


SECOND = 1_000_000


@dataclass
class Fixture:
    store: Backend
    close: Callable[[], None]
    """Close ``store`` (closing is the backend's own business, not an operation)."""
    raw: Callable[[str, tuple[Any, ...]], None]
    """Run SQL (``?`` placeholders) on the database behind the store's back."""
    reopen: Callable[[], Backend]
    not_json: tuple[type[BaseException], str] = (apsw.ConstraintError, "event content is not JSON")
    """What ``raw`` raises when content that is not JSON is written by hand."""
    unguard: str = "DROP TRIGGER events_content_stays_json"
    """SQL that lets content that is not JSON in, as a file changed by other means."""


def _kept(
    first: Backend, reopen: Callable[[], Backend], raw: Callable[[str, tuple[Any, ...]], None],
    **kw: Any,
) -> Iterator[Fixture]:
    """The fixture of ``first``, whose ``reopen`` opens more stores on the
    same database; every one is closed after the test."""
    opened = [first]

    def again() -> Backend:
        opened.append(reopen())
        return opened[-1]

    yield Fixture(first, first.close, raw, again, **kw)
    for s in opened:
        s.close()


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fixture]:
    path = str(tmp_path / "events.db")
    store = SqliteStore.open(path, SqliteOptions(synchronous="NORMAL"))

    def raw(sql: str, args: tuple[Any, ...] = ()) -> None:
        db = apsw.Connection(path)
        try:
            db.execute(sql, args)
        finally:
            db.close()

    yield from _kept(store, lambda: SqliteStore.open(path), raw)


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fixture]:
    """A fresh database copied from a migrated template (``postgres_db`` in
    conftest.py; skipped loudly where no cluster can run). Leases on the
    caller's clock, because these tests move time by hand; the database's
    clock is tested in test_eventlog_postgres.py."""
    import psycopg

    from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

    conninfo = request.getfixturevalue("postgres_db")
    options = PostgresOptions(synchronous="NORMAL", lease_clock="caller")
    store = PostgresStore.open(conninfo, options)

    def raw(sql: str, args: tuple[Any, ...] = ()) -> None:
        with psycopg.connect(conninfo, autocommit=True) as db:
            db.execute("SET search_path = streamd")
            db.execute(sql.replace("?", "%s").replace("x'00'", "'\\x00'"), args)

    yield from _kept(
        store, lambda: PostgresStore.open(conninfo, options), raw,
        not_json=(psycopg.errors.InvalidTextRepresentation, "invalid input syntax for type json"),
        unguard="ALTER TABLE events ALTER COLUMN content TYPE text",
    )


def _mysql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fixture]:
    """A fresh database on the MariaDB server the tests start (``mysql_db`` in
    conftest.py). Leases on the caller's clock, as for PostgreSQL."""
    import MySQLdb

    from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore, connect
    from streamd.eventlog.mysql.url import parse

    url = request.getfixturevalue("mysql_db")
    options = MysqlOptions(lease_clock="caller")
    store = MysqlStore.open(url, options)

    def raw(sql: str, args: tuple[Any, ...] = ()) -> None:
        db = connect(parse(url), options)
        try:
            db.cursor().execute(sql.replace("%", "%%").replace("?", "%s"), args)
        finally:
            db.close()

    yield from _kept(
        store, lambda: MysqlStore.open(url, options), raw,
        # An INSERT by hand without a seq is refused for that first.
        not_json=(MySQLdb.DatabaseError, "events_content_is_json|'seq' doesn't have a default"),
        unguard="ALTER TABLE events DROP CONSTRAINT events_content_is_json",
    )


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Iterator[Fixture]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
    "mysql": _mysql,
}


KEY = ("app", "u", "s")
"""The (app, user, session) of the contract tests' leases."""


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


def ap(
    event: Event, app: str = "app", user: str = "u", session: str = "s", **kw: Any
) -> AppendParams:
    return AppendParams(app=app, user=user, session=session, event=event, **kw)


def seqs(store: Backend, flt: Filter | None = None, from_seq: int = 0) -> list[int]:
    """The seqs of the log's entries after ``from_seq`` matching ``flt``."""
    return [
        e.seq for e in store.since(SinceParams(from_seq=from_seq, filter=flt, limit=10_000)).entries
    ]


def ids(store: Backend, flt: Filter | None = None) -> list[str]:
    """The event ids of the log's entries matching ``flt``, in seq order."""
    return [
        e.event.id for e in store.since(SinceParams(from_seq=0, filter=flt, limit=10_000)).entries
    ]
