"""Row locks on the test servers (PostgreSQL, MariaDB), held and watched
from connections of their own, for tests that stop a store's transaction at
a lock deterministically: no sleeps, only a poll of the server while waiting
on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

__all__ = ["holding", "lock_waits", "started", "until"]


def lock_waits(request: pytest.FixtureRequest, backend: str) -> Callable[[], int]:
    """How many connections of the test's database wait for a lock, asked on
    a connection of its own."""
    if backend == "postgres":
        import psycopg

        conninfo = request.getfixturevalue("postgres_db")

        def pg() -> int:
            with psycopg.connect(conninfo, autocommit=True) as db:
                row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                                 " current_database() AND wait_event_type = 'Lock'").fetchone()
                return int(row[0]) if row else 0

        return pg
    from streamd.eventlog.mysql.store import MysqlOptions, connect
    from streamd.eventlog.mysql.url import parse

    url = request.getfixturevalue("mysql_db")

    def my() -> int:
        db = connect(parse(url), MysqlOptions())
        try:
            cur = db.cursor()
            # A row lock (InnoDB's wait), or a table's metadata lock (the
            # server's), whichever a statement meets first.
            cur.execute("SELECT (SELECT count(*) FROM information_schema.innodb_trx"
                        " WHERE trx_state = 'LOCK WAIT') + (SELECT count(*) FROM"
                        " information_schema.processlist WHERE state LIKE 'Waiting for%lock%')")
            return int(cur.fetchone()[0])
        finally:
            db.close()

    return my


@contextmanager
def holding(request: pytest.FixtureRequest, backend: str, sql: str,
            args: tuple[Any, ...] = ()) -> Iterator[None]:
    """``sql`` (``?`` placeholders; a ``SELECT ... FOR UPDATE``) run in a
    transaction of its own connection, kept open, and so its locks held,
    until the block ends; then rolled back."""
    statement = sql.replace("?", "%s")
    if backend == "postgres":
        import psycopg

        with psycopg.connect(request.getfixturevalue("postgres_db")) as db:
            db.execute("SET search_path = streamd")
            db.execute(statement, args)
            try:
                yield
            finally:
                db.rollback()
        return
    from streamd.eventlog.mysql.store import MysqlOptions, connect
    from streamd.eventlog.mysql.url import parse

    db = connect(parse(request.getfixturevalue("mysql_db")), MysqlOptions())
    try:
        db.query("BEGIN")
        db.cursor().execute(statement, args)
        yield
    finally:
        db.rollback()
        db.close()


_POLL_S = 0.15
"""Between two polls of the server: more than the 0.1 s within which InnoDB
answers ``innodb_trx`` from the cache it filled at the read before, so a
server polled faster would show the first wait it saw for ever."""


def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll the server until ``condition`` holds (generous: CI's machine is busy)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(_POLL_S)


def started(outcomes: dict[str, Any], name: str, fn: Callable[[], Any]) -> threading.Thread:
    """``fn`` (a store call that may wait for a lock) on a thread of its own,
    its result or exception in ``outcomes[name]``, for the test to report by name."""
    def body() -> None:
        try:
            outcomes[name] = fn()
        except Exception as exc:
            outcomes[name] = exc
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread
