"""A ``max_age_s`` step reads the app's old events by time, on every backend.

The step chose its events (older than the cutoff, in seq order after its
cursor) by reading every event of the app after the cursor: a step that found
none, as the last of every compaction does, read the whole log (0.1-0.3 s on
PostgreSQL and 2.6-2.9 s on MariaDB at a million events, on the writer's
connection; 60-85 ms on SQLite). ``events_by_app_time`` (PostgreSQL's schema
version 5, MySQL's 4, SQLite's 7) holds them by time. These tests count the
rows the step's statement examines (the planner's own figures on PostgreSQL,
``Handler_read_*`` on MariaDB, VM steps on SQLite) on a modest table; nothing
is timed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw
import pytest
from support.sqlite_cost import vm_steps
from support.store_contract import T0, ap, ev

from streamd.eventlog.sqlite import SCHEMA_VERSION, SqliteStore
from streamd.eventlog.store import retention as rules
from streamd.eventlog.store.sql import MAX_SEQ
from streamd.eventlog.store.steps import DEFAULT_BOUNDS

EVENTS = 2000
SESSIONS = 20


class Recording:
    """The rules' connection, recording what a delete selects instead of deleting."""

    def __init__(self, sql: Any) -> None:
        self._sql = sql
        self.selects: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sql, name)

    def delete_returning(self, table: str, key: str, select: str, args: Any = ()) -> list[int]:
        self.selects.append((select, tuple(args)))
        return []


def filled(store: Any) -> None:
    """EVENTS events of one app, newer than the cutoff the tests use."""
    for start in range(0, EVENTS, 500):
        store.append_batch(
            [ap(ev(f"e{i}"), session=f"s{i % SESSIONS}") for i in range(start, start + 500)],
            T0,
        )


def step_select(sql: Any) -> tuple[str, tuple[Any, ...]]:
    """The statement a step with nothing to remove runs, and its arguments."""
    recording = Recording(sql)
    rules.drop_old_events(recording, "app", T0 - 3600 * 10**6, MAX_SEQ, T0, None,  # type: ignore[arg-type]
                          DEFAULT_BOUNDS)
    [found] = recording.selects
    return found


def events_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's nodes that read the events table or one of its indexes."""
    found = [plan] if plan.get("Relation Name") == "events" else []
    return found + [n for child in plan.get("Plans", ()) for n in events_scans(child)]


def test_a_max_age_step_that_finds_nothing_reads_no_event_on_postgresql(
    open_store: Any,
) -> None:
    from streamd.eventlog.postgres.sql import PgSql

    store = open_store()
    filled(store)
    db = store.connection
    db.execute("ANALYZE events")
    select, args = step_select(PgSql(db, str, False))
    marked = select.replace("?", "%s")
    [(plan,)] = db.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {marked}", args).fetchall()
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    [scan] = events_scans(top)
    # Before: every entry of the app in events_by_session_time (the time is
    # not its second column), the whole index at a million events; now the
    # root and the one leaf where the old events would be.
    assert scan["Index Name"] == "events_by_app_time"
    assert scan["Shared Hit Blocks"] + scan["Shared Read Blocks"] <= 2


@pytest.fixture
def mysql_store(mysql_db: str) -> Any:
    from streamd.eventlog.mysql.store import MysqlStore

    store = MysqlStore.open(mysql_db)
    yield store
    store.close()


def test_a_max_age_step_that_finds_nothing_reads_no_event_on_mysql(mysql_store: Any) -> None:
    from streamd.eventlog.mysql.sql import MySql

    filled(mysql_store)
    conn = mysql_store.connection
    cur = conn.cursor()
    cur.execute("ANALYZE TABLE events")
    cur.fetchall()
    select, args = step_select(MySql(conn, str, True))
    cur.execute("FLUSH STATUS")
    cur.execute(select.replace("?", "%s"), args)
    assert cur.fetchall() == ()
    cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%'")
    reads = {name: int(value) for name, value in cur.fetchall()}
    # Before: Handler_read_next 2,000, the primary key walked from the cursor.
    assert reads["Handler_read_next"] + reads["Handler_read_rnd_next"] == 0


def test_a_postgresql_log_at_version_4_gets_the_index_when_opened(open_store: Any) -> None:
    store = open_store()
    db = store.connection
    db.execute("DROP INDEX events_by_app_time")
    db.execute("DROP INDEX events_by_author")  # version 6's
    db.execute("UPDATE streamd_meta SET version = 4")
    store.close()
    again = open_store()
    names = {n for n, in again.connection.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'events'"
        " AND schemaname = current_schema()")}
    assert "events_by_app_time" in names


def test_a_mysql_migration_cut_short_after_its_index_finishes_when_opened_again(
    mysql_db: str,
) -> None:
    from streamd.eventlog.mysql import schema
    from streamd.eventlog.mysql.store import MysqlStore

    MysqlStore.open(mysql_db).close()
    store = MysqlStore.open(mysql_db)
    cur = store.connection.cursor()
    # The index made, the version row not moved yet.
    cur.execute("UPDATE streamd_meta SET version = %s", (schema.SCHEMA_VERSION - 1,))
    store.close()
    store = MysqlStore.open(mysql_db)
    try:
        cur = store.connection.cursor()
        cur.execute("SELECT version FROM streamd_meta")
        assert cur.fetchall() == ((schema.SCHEMA_VERSION,),)
        cur.execute("SHOW INDEX FROM events WHERE Key_name = 'events_by_app_time'")
        assert cur.fetchall()
    finally:
        store.close()


def test_a_max_age_step_that_finds_nothing_reads_no_event_on_sqlite(tmp_path: Path) -> None:
    store = SqliteStore.open(str(tmp_path / "log.db"))
    try:
        filled(store)
        step, steps = vm_steps(store, lambda: store.drop_old_events(
            "app", T0 - 3600 * 10**6, MAX_SEQ, T0, None, DEFAULT_BOUNDS))
    finally:
        store.close()
    assert step.events == 0
    # Before: 8,060 steps, every entry of the app in events_by_session_time
    # (4,001,516 at a million events); now a seek that finds no old entry.
    assert steps < 200


def test_a_sqlite_log_at_version_6_gets_the_index_when_opened(tmp_path: Path) -> None:
    path = str(tmp_path / "log.db")
    SqliteStore.open(path).close()
    db = apsw.Connection(path)
    db.execute("DROP INDEX IF EXISTS events_by_app_time")
    db.execute("DROP INDEX IF EXISTS events_by_author")  # version 8's
    db.pragma("user_version", 6)
    db.close()
    store = SqliteStore.open(path)
    try:
        db = store.connection
        assert db.pragma("user_version") == SCHEMA_VERSION == 8
        names = {n for n, in db.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'events'")}
        assert "events_by_app_time" in names
    finally:
        store.close()
