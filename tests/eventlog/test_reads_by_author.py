"""A read filtered by an author reads that author's events, on every backend.

Without an index holding the author, ``since`` by an author no event has
walked the whole log and tested every event: at a million events 0.15-0.2 s
on SQLite, 0.3-0.4 s on PostgreSQL and 2.4-2.6 s on MariaDB.
``events_by_author`` (SQLite's schema version 8, PostgreSQL's 6, MySQL's 5)
holds them in seq order. Each test reads the plan the database chose for the
statement ``since`` runs (SQLite's ``EXPLAIN QUERY PLAN``, PostgreSQL's and
MariaDB's ``EXPLAIN``) on a modest log, after the server's statistics are
taken, and SQLite's count of the rows it visited; nothing is timed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.sqlite_cost import vm_steps
from support.store_contract import T0, ap, ev

from streamd.eventlog.model import Filter, SinceParams
from streamd.eventlog.sqlite import SqliteStore
from streamd.eventlog.store.reads import since_query

EVENTS = 4000
"""More than SQLite's store reads from the tip by the primary key alone."""
AUTHORS = ("user", "planner", "coder", "reviewer")
NOBODY = Filter(author="nobody")


def filled(store: Any) -> None:
    """EVENTS events of one app, twenty users, the authors dealt in turn,
    but user u0's events are all the planner's."""
    store.append_batch(
        [ap(ev(f"e{i}", author="planner" if i % 20 == 0 else AUTHORS[i % 4]),
            user=f"u{i % 20}", session=f"s{i % 40}") for i in range(EVENTS)],
        T0,
    )


def sqlite_plan(store: SqliteStore, flt: Filter) -> list[str]:
    from streamd.eventlog.sqlite.sql import SqliteSql

    db = store.connection
    sql, args = since_query(SqliteSql(db), 0, flt, 100)
    return [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", args)]


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    store = SqliteStore.open(str(tmp_path / "log.db"))
    filled(store)
    yield store
    store.close()


def test_a_read_by_an_author_no_event_has_reads_no_event_on_sqlite(sqlite_store: Any) -> None:
    found, steps = vm_steps(sqlite_store, lambda: sqlite_store.since(SinceParams(filter=NOBODY)))
    assert found.entries == []
    assert any("events_by_author" in step for step in sqlite_plan(sqlite_store, NOBODY))
    # Before: every event of the log visited and tested, 12,019 steps.
    assert steps < 100


def test_a_read_by_a_user_and_an_author_reads_the_users_events_on_sqlite(
    sqlite_store: Any,
) -> None:
    # A common author none of the user's events has: SQLite, without
    # statistics, would walk the author's events (a quarter of the log
    # here, 204 ms against 24 ms at a million) to find none of the user's.
    flt = Filter(app="app", user="u0", author="coder")
    found, steps = vm_steps(sqlite_store, lambda: sqlite_store.since(SinceParams(filter=flt)))
    assert found.entries == []
    assert any("events_by_session" in step for step in sqlite_plan(sqlite_store, flt))
    # The user's 200 events: 1,426 steps; the author's 1,000 took 7,026.
    assert steps < 3000


def test_a_read_by_an_author_no_event_has_uses_the_author_index_on_postgresql(
    open_store: Any,
) -> None:
    from streamd.eventlog.postgres.sql import PgSql

    store = open_store()
    filled(store)
    db = store.connection
    db.execute("ANALYZE events")
    sql, args = since_query(PgSql(db, str, False), 0, NOBODY, 100)
    [(plan,)] = db.execute(f"EXPLAIN (FORMAT JSON) {sql.replace('?', '%s')}", args).fetchall()
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    # Before: a Seq Scan of events (or its primary key, every entry).
    assert "events_by_author" in json.dumps(top)
    assert "Seq Scan" not in json.dumps(top)


def test_a_read_by_an_author_no_event_has_uses_the_author_index_on_mysql(mysql_db: str) -> None:
    from streamd.eventlog.mysql.sql import MySql
    from streamd.eventlog.mysql.store import MysqlStore

    store = MysqlStore.open(mysql_db)
    try:
        filled(store)
        conn = store.connection
        cur = conn.cursor()
        cur.execute("ANALYZE TABLE events")
        cur.fetchall()
        sql, args = since_query(MySql(conn, str, True), 0, NOBODY, 100)
        cur.execute("EXPLAIN " + sql.replace("?", "%s"), args)
        columns = [d[0] for d in cur.description]
        keys = [dict(zip(columns, row, strict=True))["key"] for row in cur.fetchall()]
        # Before: PRIMARY, walked from the cursor to the end, every row tested.
        assert keys == ["events_by_author"]
        cur.execute("FLUSH STATUS")
        assert store.since(SinceParams(filter=NOBODY)).entries == []
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%'")
        reads = {name: int(value) for name, value in cur.fetchall()}
        assert reads["Handler_read_next"] + reads["Handler_read_rnd_next"] == 0
    finally:
        store.close()
