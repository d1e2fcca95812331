"""A PostgreSQL log under the defaults a database or role may carry
(``ALTER DATABASE ... SET``, ``ALTER ROLE ... SET``), which every new
connection takes before streamd says a word: the log behaves as it does
under the server's own defaults.

Each test sets the default on its own database and opens the stores after
it, as a daemon that connects to a database so configured would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.postgres_store import T0, ap
from support.server_locks import holding, lock_waits, started, until

from streamd.eventlog.model import AppendParams, Event, SinceParams
from streamd.eventlog.postgres.schema import SCHEMA_VERSION
from streamd.eventlog.postgres.store import PostgresStore
from streamd.eventlog.store import CommitOutcome


def database_default(conninfo: str, setting: str, value: str) -> None:
    """``ALTER DATABASE`` (the test's own) ``SET setting = value``: what every
    connection opened after it starts with."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()
        assert name is not None
        admin.execute(psycopg.sql.SQL("ALTER DATABASE {} SET {} = {}").format(
            psycopg.sql.Identifier(name[0]), psycopg.sql.Identifier(setting),
            psycopg.sql.Literal(value)))


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_an_append_waiting_for_another_writers_commit_succeeds_under_any_default_isolation(
    request: pytest.FixtureRequest,
    postgres_db: str,
    open_store: Callable[..., PostgresStore],
    level: str,
) -> None:
    # Before: a write transaction was a plain BEGIN, so it ran at the
    # database's default level, and an append that waited for the seq counter
    # while another host's append moved it failed "could not serialize access
    # due to concurrent update" (two daemons appending at once: half their
    # appends failed). The other host is a connection of the test's own that
    # moves the counter and commits once the append waits for it.
    database_default(postgres_db, "default_transaction_isolation", level)
    store = open_store()
    waits = lock_waits(request, "postgres")
    outcomes: dict[str, Any] = {}
    with psycopg.connect(postgres_db) as other:  # not autocommit: one transaction
        other.execute("SET search_path = streamd")
        other.execute("UPDATE seq_counter SET seq = seq")
        thread = started(outcomes, "append", lambda: store.append_commit(
            [ap("e1")], T0, capture=False))
        until(lambda: waits() >= 1, "the append waiting for the seq counter")
        other.commit()
    thread.join(60)
    assert not thread.is_alive(), "the append still waits after the counter was let go"
    outcome = outcomes["append"]
    assert isinstance(outcome, CommitOutcome), outcome
    assert (outcome.before_seq, outcome.after_seq) == (0, 1)
    assert store.newest_seq() == 1


def test_text_outside_latin1_is_written_and_read_under_a_latin1_client_encoding(
    postgres_db: str, open_store: Callable[..., PostgresStore],
) -> None:
    # Before: psycopg encodes what it sends in the connection's client
    # encoding, which the database's default set to LATIN1: an append holding
    # a character outside it was refused as a bad value (-32602, "'latin-1'
    # codec can't encode"), and an event stored by a connection opened before
    # the default changed could not be read back (the server cannot convert
    # it). The log's text is UTF-8 whatever a client of the database speaks.
    before = open_store()
    before.append_commit([ap("e1", content={"t": "日本 ✓"})], T0, capture=False)
    database_default(postgres_db, "client_encoding", "LATIN1")
    after = open_store()
    wide = AppendParams(app="app", user="u", session="séance-日本",
                        event=Event(id="e2", author="agent", content={"t": "Ωmega"}))
    outcome = after.append_commit([wide], T0, capture=False)
    assert outcome.after_seq == 2
    read = [(e.session, e.event.content) for e in after.since(SinceParams()).entries]
    assert read == [("s", {"t": "日本 ✓"}), ("séance-日本", {"t": "Ωmega"})]


def test_a_migration_outlasts_the_databases_statement_and_lock_timeouts(
    request: pytest.FixtureRequest, postgres_db: str,
) -> None:
    # Before: the migration's CREATE INDEX CONCURRENTLY ran under the
    # database's statement_timeout and lock_timeout (an application's role
    # often has them), so a build longer than they allow (a big log, or
    # another transaction it must wait out) was cancelled at every open:
    # the invalid index dropped and built again, and cancelled again, and
    # the newer streamd could never open the log. The build here waits for
    # a writer's transaction of the test's own, held until the server shows
    # the build waiting for five times the timeouts.
    with psycopg.connect(postgres_db, autocommit=True) as admin:
        admin.execute("SET search_path = streamd")
        admin.execute("DROP INDEX events_by_author")  # version 6's
        admin.execute("UPDATE streamd_meta SET version = 5")
    database_default(postgres_db, "statement_timeout", "100ms")
    database_default(postgres_db, "lock_timeout", "100ms")
    outcomes: dict[str, Any] = {}

    def build_waited_500_ms() -> bool:
        with psycopg.connect(postgres_db, autocommit=True) as db:
            row = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock'"
                " AND clock_timestamp() - query_start > interval '500 ms'").fetchone()
            return bool(row and row[0])

    with holding(request, "postgres", "DELETE FROM events WHERE seq < 0"):
        thread = started(outcomes, "open", lambda: PostgresStore.open(postgres_db))
        until(lambda: "open" in outcomes or build_waited_500_ms(),
              "the migration's build waiting for the writer's transaction")
    thread.join(60)
    assert not thread.is_alive(), "the open still waits after the transaction ended"
    opened = outcomes["open"]
    assert isinstance(opened, PostgresStore), opened
    try:
        db = opened.connection
        assert db.execute("SELECT version FROM streamd_meta").fetchone() == (SCHEMA_VERSION,)
        # The connection's limits are the database's again once migrated.
        assert db.execute("SHOW statement_timeout").fetchone() == ("100ms",)
        assert db.execute("SHOW lock_timeout").fetchone() == ("100ms",)
    finally:
        opened.close()
