"""A newer streamd migrating a server log that other hosts are appending to.

The migrations that add an index to ``events`` (PostgreSQL's version 5,
MySQL's 4, and any added since) are run on a log rolled back to before them.
Each build is stopped where it waits for the transactions open on the table,
by one of the test's own kept open on events (PostgreSQL's concurrent build
waits for writers' transactions before it reads the table; MariaDB's ALTER
waits for any transaction on it where it needs the table to itself: before
an online build, after a copy); the server is polled until it shows that
wait, and only then is the transaction let go. What is asserted is what the
server says meanwhile: whether an append on another connection went through
or waits for a lock (PostgreSQL), which lock the build holds on the table
(MariaDB: the one it builds or copies under), the schema's version, the
index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.server_locks import holding, lock_waits, started, until
from support.store_contract import T0, ap, ev, seqs

from streamd.errors import RpcError

# --- PostgreSQL ---------------------------------------------------------------------

HOLD_EVENTS_PG = "LOCK TABLE events IN ROW EXCLUSIVE MODE"
"""What every append's transaction holds on events until it ends."""


def pg(conninfo: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """``sql`` on a connection of its own, in autocommit."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as db:
        found = db.execute(sql, args or None)  # none: a % is a percent sign
        return found.fetchall() if found.description else []


def older_log_pg(conninfo: str) -> None:
    """The log as a streamd of schema version 4 left it: no events_by_app_time
    (nor any index a later version added)."""
    pg(conninfo, "DROP INDEX streamd.events_by_app_time")
    pg(conninfo, "DROP INDEX IF EXISTS streamd.events_by_author")
    pg(conninfo, "UPDATE streamd.streamd_meta SET version = 4")


def version_pg(conninfo: str) -> int:
    [(version,)] = pg(conninfo, "SELECT version FROM streamd.streamd_meta")
    return int(version)


def building_pg(conninfo: str) -> list[int]:
    """The sessions whose index build waits for a lock."""
    return [pid for pid, in pg(
        conninfo, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query LIKE '%CREATE INDEX%'"
        " AND pid <> pg_backend_pid()")]


def valid_pg(conninfo: str, name: str = "events_by_app_time") -> bool | None:
    """Whether the index is usable (None: there is none)."""
    found = pg(conninfo, "SELECT i.indisvalid FROM pg_index i JOIN pg_class c"
               " ON c.oid = i.indexrelid WHERE c.relname = %s", (name,))
    return found[0][0] if found else None


def current_pg(conninfo: str) -> None:
    """Migrated whole: the newest version, and every index of events valid."""
    from streamd.eventlog.postgres.schema import SCHEMA_VERSION

    assert version_pg(conninfo) == SCHEMA_VERSION
    assert valid_pg(conninfo) is True
    invalid = pg(conninfo, "SELECT c.relname FROM pg_index i JOIN pg_class c"
                 " ON c.oid = i.indexrelid WHERE NOT i.indisvalid")
    assert invalid == []


def opened(outcomes: dict[str, Any], name: str) -> None:
    """The store a thread opened, closed; its failure raised."""
    store = outcomes[name]
    if isinstance(store, BaseException):
        raise store
    store.close()


def test_appends_go_on_while_a_newer_streamd_builds_an_index_on_postgresql(
    request: pytest.FixtureRequest, postgres_db: str, open_store: Any,
) -> None:
    from streamd.eventlog.postgres.store import PostgresStore

    writer = open_store()  # another host's daemon, open on the log before it
    writer_pid = writer.connection.info.backend_pid
    older_log_pg(postgres_db)
    outcomes: dict[str, Any] = {}
    with holding(request, "postgres", HOLD_EVENTS_PG):
        migration = started(outcomes, "open", lambda: PostgresStore.open(postgres_db))
        until(lambda: bool(building_pg(postgres_db)), "the index build waiting")
        append = started(outcomes, "append", lambda: writer.append(ap(ev("meanwhile")), T0))
        until(lambda: not append.is_alive() or bool(pg(
            postgres_db, "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", (writer_pid,)
        )), "the append done, or waiting for a lock")
        # Before: the append waited behind CREATE INDEX's SHARE lock, as
        # every host's did for the whole build (2.5 s at a million events).
        assert not append.is_alive(), "the append waits for the index build"
        assert version_pg(postgres_db) == 4, "the version moved before the index was built"
    migration.join(60)
    opened(outcomes, "open")
    current_pg(postgres_db)
    assert seqs(writer) == [outcomes["append"].seq]


def test_two_streamds_migrating_at_once_leave_one_valid_schema_on_postgresql(
    request: pytest.FixtureRequest, postgres_db: str,
) -> None:
    from streamd.eventlog.postgres.store import PostgresStore

    older_log_pg(postgres_db)
    outcomes: dict[str, Any] = {}
    with holding(request, "postgres", HOLD_EVENTS_PG):
        first = started(outcomes, "first", lambda: PostgresStore.open(postgres_db))
        until(lambda: bool(building_pg(postgres_db)), "the first one's build waiting")
        second = started(outcomes, "second", lambda: PostgresStore.open(postgres_db))
        until(lambda: bool(pg(postgres_db, "SELECT 1 FROM pg_stat_activity WHERE query"
                                           " LIKE 'SELECT pg_try_advisory_lock%'")),
              "the second one asking for its turn")
        assert second.is_alive(), "the second one did not wait for the first's migration"
    first.join(60)
    second.join(60)
    opened(outcomes, "first")
    opened(outcomes, "second")
    current_pg(postgres_db)
    named = pg(postgres_db, "SELECT count(*) FROM pg_indexes WHERE indexname LIKE"
               " 'events_by_app_time%'")
    assert named == [(1,)]


def test_a_migration_killed_mid_build_is_finished_by_the_next_open_on_postgresql(
    request: pytest.FixtureRequest, postgres_db: str,
) -> None:
    from streamd.eventlog.postgres.store import PostgresStore

    older_log_pg(postgres_db)
    outcomes: dict[str, Any] = {}
    with holding(request, "postgres", HOLD_EVENTS_PG):
        migration = started(outcomes, "open", lambda: PostgresStore.open(postgres_db))
        until(lambda: bool(building_pg(postgres_db)), "the index build waiting")
        [pid] = building_pg(postgres_db)
        pg(postgres_db, "SELECT pg_terminate_backend(%s)", (pid,))
        migration.join(60)
    assert isinstance(outcomes["open"], RpcError), outcomes["open"]
    assert version_pg(postgres_db) == 4
    PostgresStore.open(postgres_db).close()
    current_pg(postgres_db)


def test_an_invalid_index_a_cut_short_build_left_is_built_again_on_postgresql(
    request: pytest.FixtureRequest, postgres_db: str,
) -> None:
    from streamd.eventlog.postgres.store import PostgresStore

    older_log_pg(postgres_db)
    outcomes: dict[str, Any] = {}
    # A concurrent build whose session is killed leaves its index in the
    # catalog, INVALID: kept up to date by writes, never read.
    with holding(request, "postgres", HOLD_EVENTS_PG):
        build = started(outcomes, "build", lambda: pg(
            postgres_db, "CREATE INDEX CONCURRENTLY events_by_app_time"
            " ON streamd.events (app_name, event_time, seq)"))
        until(lambda: bool(building_pg(postgres_db)), "the build waiting")
        [pid] = building_pg(postgres_db)
        pg(postgres_db, "SELECT pg_terminate_backend(%s)", (pid,))
        build.join(60)
    assert valid_pg(postgres_db) is False
    # Before: "relation events_by_app_time already exists", at every open.
    PostgresStore.open(postgres_db).close()
    current_pg(postgres_db)


# --- MariaDB ------------------------------------------------------------------------

HOLD_EVENTS_MY = "SELECT seq FROM events LIMIT 1"
"""A read transaction left open: it holds the table's metadata lock (shared)."""


def my(url: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    from streamd.eventlog.mysql.store import MysqlOptions, connect
    from streamd.eventlog.mysql.url import parse

    db = connect(parse(url), MysqlOptions())
    try:
        cur = db.cursor()
        cur.execute(sql, args or None)  # none: a % is a percent sign
        return list(cur.fetchall() or ())
    finally:
        db.close()


def older_log_my(url: str) -> None:
    """The log as a streamd of schema version 3 left it."""
    my(url, "DROP INDEX events_by_app_time ON events")
    for (name,) in my(url, "SELECT DISTINCT index_name FROM information_schema.statistics"
                           " WHERE table_schema = database() AND index_name = 'events_by_author'"):
        my(url, f"DROP INDEX {name} ON events")
    my(url, "UPDATE streamd_meta SET version = 3")


def building_my(url: str) -> int | None:
    """The connection whose index build waits for the table's metadata lock."""
    found = my(url, "SELECT id FROM information_schema.processlist WHERE state ="
               " 'Waiting for table metadata lock' AND info LIKE '%events_by_app_time%'")
    return int(found[0][0]) if found else None


def current_my(url: str) -> None:
    from streamd.eventlog.mysql.schema import SCHEMA_VERSION

    assert my(url, "SELECT version FROM streamd_meta") == [(SCHEMA_VERSION,)]
    indexes = {name for name, in my(url, "SELECT index_name FROM information_schema.statistics"
                                         " WHERE table_schema = database()"
                                         " AND table_name = 'events'")}
    assert "events_by_app_time" in indexes


@pytest.fixture
def copying_server(mysql_server: Any) -> Iterator[None]:
    """The server set to change tables by copying them (MariaDB's
    ``alter_algorithm``, for new sessions), and able to show who holds which
    metadata lock (the ``metadata_lock_info`` plugin, shipped with it)."""
    if not mysql_server.sql("SELECT 1 FROM information_schema.plugins"
                            " WHERE plugin_name = 'METADATA_LOCK_INFO'"):
        mysql_server.sql("INSTALL SONAME 'metadata_lock_info'")
    mysql_server.sql("SET GLOBAL alter_algorithm = 'COPY'")
    try:
        yield
    finally:
        mysql_server.sql("SET GLOBAL alter_algorithm = DEFAULT")


def test_a_mariadb_index_build_lets_writes_through_where_the_server_copies_tables(
    request: pytest.FixtureRequest, mysql_db: str, copying_server: None,
) -> None:
    from streamd.eventlog.mysql.store import MysqlStore

    MysqlStore.open(mysql_db).close()
    older_log_my(mysql_db)
    outcomes: dict[str, Any] = {}
    with holding(request, "mysql", HOLD_EVENTS_MY):
        migration = started(outcomes, "open", lambda: MysqlStore.open(mysql_db))
        until(lambda: building_my(mysql_db) is not None, "the build waiting for the table")
        modes = {mode for mode, in my(
            mysql_db, "SELECT lock_mode FROM information_schema.metadata_lock_info"
            " WHERE thread_id = %s AND table_name = 'events'", (building_my(mysql_db),))}
        # Before: MDL_SHARED_NO_WRITE, taken before the copy's first row and
        # held past its last: every host's appends waited for the whole copy.
        # Online, the build runs under MDL_SHARED_UPGRADABLE, which excludes
        # no write.
        assert modes == {"MDL_SHARED_UPGRADABLE"}
    migration.join(60)
    opened(outcomes, "open")
    current_my(mysql_db)


def test_a_mariadb_migration_killed_mid_build_is_finished_by_the_next_open(
    request: pytest.FixtureRequest, mysql_db: str,
) -> None:
    from streamd.eventlog.mysql.store import MysqlStore

    MysqlStore.open(mysql_db).close()
    older_log_my(mysql_db)
    outcomes: dict[str, Any] = {}
    with holding(request, "mysql", HOLD_EVENTS_MY):
        migration = started(outcomes, "open", lambda: MysqlStore.open(mysql_db))
        until(lambda: building_my(mysql_db) is not None, "the build waiting for the table")
        my(mysql_db, f"KILL {building_my(mysql_db)}")
        migration.join(60)
    assert isinstance(outcomes["open"], RpcError), outcomes["open"]
    assert my(mysql_db, "SELECT version FROM streamd_meta") == [(3,)]
    MysqlStore.open(mysql_db).close()
    current_my(mysql_db)


def test_an_append_under_way_when_an_index_build_asks_for_the_table_commits_on_mariadb(
    request: pytest.FixtureRequest, mysql_db: str,
) -> None:
    from streamd.eventlog.mysql.store import MysqlStore

    writer = MysqlStore.open(mysql_db)
    first = writer.append(ap(ev("first")), T0)
    older_log_my(mysql_db)
    waits = lock_waits(request, "mysql")
    outcomes: dict[str, Any] = {}
    # The append is stopped after it has read the table (its duplicate
    # lookup) and before it writes it: at its session's row, which an
    # ``expected_seq`` makes it lock, held by the test.
    with holding(request, "mysql", "SELECT last_seq FROM sessions FOR UPDATE"):
        append = started(outcomes, "append", lambda: writer.append(
            ap(ev("second"), expected_seq=first.seq), T0))
        until(lambda: waits() >= 1, "the append waiting for its session's row")
        migration = started(outcomes, "open", lambda: MysqlStore.open(mysql_db))
        until(lambda: building_my(mysql_db) is not None, "the build waiting for the table")
    append.join(60)
    migration.join(60)
    # Before: the append, asking to write a table it had read while the
    # build waited to have it alone, was failed: "Deadlock found when trying
    # to get lock" (in 2 rounds of 3 beside a build at 200,000 events).
    assert not isinstance(outcomes["append"], BaseException), outcomes["append"]
    assert seqs(writer) == [first.seq, outcomes["append"].seq]
    opened(outcomes, "open")
    current_my(mysql_db)
    writer.close()


def test_a_server_that_cannot_add_an_index_online_fails_the_open_naming_it() -> None:
    """No MariaDB or MySQL 8 table of the log's refuses an online index, so
    the refusal is the driver's error as the server would raise it."""
    import MySQLdb

    from streamd.eventlog.mysql.migrate import migrate_schema
    from streamd.eventlog.mysql.schema import APPLICATION, NOPAD_COLLATIONS

    class Server:
        """A log at version 3 on a server that builds no index online."""

        def __init__(self) -> None:
            self.statements: list[str] = []
            self._rows: list[tuple[Any, ...]] = []

        rowcount = 0

        def cursor(self) -> Server:
            return self

        def execute(self, sql: str, args: Any = None) -> int:
            self.statements.append(sql)
            if "ADD INDEX" in sql:
                raise MySQLdb.OperationalError(
                    1846, "LOCK=NONE is not supported. Reason: the engine's. Try LOCK=SHARED.")
            self._rows = ([(1,)] if "GET_LOCK" in sql or "RELEASE_LOCK" in sql
                          or "table_name = 'streamd_meta'" in sql
                          else [(APPLICATION, 3)] if "FROM streamd_meta" in sql
                          else [(NOPAD_COLLATIONS[0],)] if "collations" in sql else [])
            self.rowcount = len(self._rows)
            return self.rowcount

        def fetchone(self) -> tuple[Any, ...] | None:
            return self._rows[0] if self._rows else None

        def fetchall(self) -> list[tuple[Any, ...]]:
            return self._rows

    server = Server()
    with pytest.raises(RpcError) as refused:
        migrate_schema(server, "log")
    message = refused.value.message
    assert "events_by_app_time" in message and "LOCK=NONE is not supported" in message
    assert "ALTER TABLE events ADD INDEX events_by_app_time (app_name, event_time)" in message
    assert not any("UPDATE streamd_meta" in s for s in server.statements)
    assert not any("LOCK=SHARED" in s or "ALGORITHM=COPY" in s for s in server.statements)
