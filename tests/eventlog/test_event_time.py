"""A session's event time (``last_event_time``): the timestamp of its newest
event, or its creation time before the first, kept by the store on every
append (both backends), carried over by the migrations, and sent on the wire
only to a caller that asks (``event_time: true``), so every other caller's
answers keep their keys."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import apsw
import trio
from support.service import Daemonish, append
from support.store_contract import Fixture, ap, ev

from streamd.eventlog.model import (
    SessionCreateParams,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionsGetParams,
    from_us,
    to_us,
)
from streamd.eventlog.sqlite import SqliteStore

T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
HOUR = 3600 * 1_000_000


def at(us: int) -> dt.datetime:
    return from_us(us)


def test_a_sessions_event_time_is_its_newest_events_timestamp_not_the_write_clock(
    fx: Fixture,
) -> None:
    store = fx.store
    created = store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    assert created.last_event_time == at(T0)
    assert store.get_session(
        SessionGetParams(app="app", user="u", session="s")
    ).last_event_time == at(T0)
    # An event stamped an hour before it is written (a replayed or imported
    # one): the session's event time is the event's, its update time the clock.
    store.append(ap(ev("e1", timestamp=at(T0 - HOUR))), T0 + 5)
    got = store.get_session(SessionGetParams(app="app", user="u", session="s"))
    assert got.last_event_time == at(T0 - HOUR)
    assert got.updated_at == at(T0 + 5)
    # In one batch, the newest event (by seq) sets it, whatever its timestamp.
    store.append_batch(
        [ap(ev("e2", timestamp=at(T0 + HOUR))), ap(ev("e3", timestamp=at(T0 + 7)))], T0 + 9
    )
    assert store.get_session(
        SessionGetParams(app="app", user="u", session="s")
    ).last_event_time == at(T0 + 7)
    # An event without a timestamp gets the append time, and so does the session.
    store.append(ap(ev("e4")), T0 + 11)
    assert store.get_session(
        SessionGetParams(app="app", user="u", session="s")
    ).last_event_time == at(T0 + 11)
    # A session created by its first append; another untouched.
    store.append(ap(ev("f1", timestamp=at(T0 + 3)), session="t"), T0 + 20)
    store.create_session(SessionCreateParams(app="app", user="u", session="empty"), T0 + 21)
    # Every read of sessions carries it.
    listed = store.list_sessions_page(SessionListParams(app="app", limit=10))
    assert {s.session: s.last_event_time for s in listed.sessions} == {
        "s": at(T0 + 11),
        "t": at(T0 + 3),
        "empty": at(T0 + 21),
    }
    many = store.get_sessions(
        SessionsGetParams(app="app", sessions=[SessionKey(user="u", session="t")])
    )
    assert many.sessions[0].last_event_time == at(T0 + 3)
    # A duplicate append changes nothing.
    store.append(ap(ev("f1", timestamp=at(T0 + 3)), session="t"), T0 + 30)
    assert store.get_session(
        SessionGetParams(app="app", user="u", session="t")
    ).last_event_time == at(T0 + 3)


def test_a_version_4_database_migrates_with_each_sessions_newest_event_time(
    tmp_path: Path,
) -> None:
    from streamd.eventlog.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

    path = str(tmp_path / "v4.db")
    db = apsw.Connection(path)
    with db:
        for migration in MIGRATIONS[:4]:
            db.execute(migration)
        db.pragma("user_version", 4)
        for session, updated in (("s", T0 + 50), ("empty", T0 + 60), ("gone", T0 + 70)):
            db.execute(
                "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
                " updated_at) VALUES ('app', 'u', ?, '{}', ?, ?)",
                (session, T0, updated),
            )
        for i, (session, when) in enumerate((("s", T0 + 1), ("s", T0 - HOUR), ("gone", T0))):
            db.execute(
                "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id,"
                " author, branch, event_time, content, digest) VALUES"
                " ('app', 'u', ?, ?, '', 'a', '', ?, 'null', x'00')",
                (session, f"e{i}", when),
            )
        # The newest event of "gone" was compacted away before the upgrade.
        db.execute("DELETE FROM events WHERE session_id = 'gone'")
    db.close()
    store = SqliteStore.open(path)
    try:
        assert store.connection.pragma("user_version") == SCHEMA_VERSION == 8
        times = {s.session: s.last_event_time for s in store.list_sessions("app", None)}
        # The newest event's time; no event (ever, or left): the last write.
        assert times == {"s": at(T0 - HOUR), "empty": at(T0 + 60), "gone": at(T0 + 70)}
        # And the trigger keeps it from then on.
        store.append(ap(ev("e9", timestamp=at(T0 + 2)), session="gone"), T0 + 80)
        assert store.get_session(
            SessionGetParams(app="app", user="u", session="gone")
        ).last_event_time == at(T0 + 2)
    finally:
        store.close()


def test_a_version_1_postgresql_schema_migrates_with_each_sessions_newest_event_time(
    postgres_cluster: Any,
) -> None:
    import psycopg
    from psycopg import sql as pgsql

    from streamd.eventlog.postgres.schema import APPLICATION, migration_sql
    from streamd.eventlog.postgres.store import PostgresStore

    def version_1(conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
            conn.execute("CREATE SCHEMA streamd")
            conn.execute(pgsql.SQL("SET LOCAL search_path = streamd"))
            conn.execute(
                "CREATE TABLE streamd_meta (one boolean PRIMARY KEY DEFAULT true CHECK (one),"
                " application text NOT NULL, version integer NOT NULL)"
            )
            conn.execute(
                "INSERT INTO streamd_meta (application, version) VALUES (%s, 1)", (APPLICATION,)
            )
            conn.execute(migration_sql(0).encode())
            for session, updated, last in (("s", T0 + 50, 2), ("empty", T0 + 60, 0)):
                conn.execute(
                    "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
                    " updated_at, last_seq) VALUES ('app', 'u', %s, '{}', %s, %s, %s)",
                    (session, T0, updated, last),
                )
            for seq, when in ((1, T0 + 1), (2, T0 - HOUR)):
                conn.execute(
                    "INSERT INTO events (seq, app_name, user_id, session_id, event_id,"
                    " invocation_id, author, branch, event_time, content, digest) VALUES"
                    " (%s, 'app', 'u', 's', %s, '', 'a', '', %s, 'null', '\\x00')",
                    (seq, f"e{seq}", when),
                )
            conn.execute("UPDATE seq_counter SET seq = 2")

    conninfo = postgres_cluster.fresh_database()
    try:
        version_1(conninfo)
        store = PostgresStore.open(conninfo)
        try:
            times = {s.session: s.last_event_time for s in store.list_sessions("app", None)}
            assert times == {"s": at(T0 - HOUR), "empty": at(T0 + 60)}
            store.append(ap(ev("e9", timestamp=at(T0 + 2))), T0 + 80)
            assert store.get_session(
                SessionGetParams(app="app", user="u", session="s")
            ).last_event_time == at(T0 + 2)
        finally:
            store.close()
    finally:
        postgres_cluster.drop_database(conninfo)


async def test_the_wire_carries_last_event_time_only_to_a_caller_that_asks(
    daemon: Daemonish,
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        keys = {"app", "user", "session", "state", "created_at", "updated_at", "last_seq"}
        created = await c.result("eventlog/sessions.create", {"app": "app", "user": "u"})
        assert set(created) == keys
        sid = created["session"]
        await c.result(
            "eventlog/append", append("e1", session=sid, timestamp="2001-02-03T04:05:06.123456Z")
        )
        key = {"app": "app", "user": "u", "session": sid}
        plain = await c.result("eventlog/sessions.get", key)
        assert "last_event_time" not in plain
        asked = await c.result("eventlog/sessions.get", {**key, "event_time": True})
        assert asked["last_event_time"] == "2001-02-03T04:05:06.123456Z"
        listed = await c.result("eventlog/sessions.list", {"app": "app"})
        assert set(listed["sessions"][0]) == keys
        listed = await c.result("eventlog/sessions.list", {"app": "app", "event_time": True})
        assert listed["sessions"][0]["last_event_time"] == "2001-02-03T04:05:06.123456Z"
        many = {"app": "app", "sessions": [{"user": "u", "session": sid}]}
        got = await c.result("eventlog/sessions.get_many", many)
        assert "last_event_time" not in got["sessions"][0]
        got = await c.result("eventlog/sessions.get_many", {**many, "event_time": True})
        assert got["sessions"][0]["last_event_time"] == "2001-02-03T04:05:06.123456Z"
