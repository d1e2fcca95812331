"""A newer streamd migrating a MariaDB log for a user whose statements the
server cuts short (``MAX_STATEMENT_TIME``, or the global
``max_statement_time``): the migration's index build runs to its end.

Before, the build was interrupted (``Query execution was interrupted
(max_statement_time exceeded)``) at every open, so a log whose build outlasts
the limit (a million events and 300 ms, by hand) could never be opened. The
build here waits for the table's metadata lock, held by a transaction of the
test's own until the server shows the build waiting for ten times the limit.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.server_locks import holding, started, until

from streamd.eventlog.mysql import schema
from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore, connect
from streamd.eventlog.mysql.url import parse

USER = "streamd_short"
LIMIT_S = 0.05


def test_a_migration_outlasts_the_users_statement_time_limit(
    request: pytest.FixtureRequest, mysql_server: Any, mysql_db: str,
) -> None:
    MysqlStore.open(mysql_db).close()
    database = mysql_db.split("/")[3].split("?")[0]
    admin = MysqlStore.open(mysql_db)
    try:
        cur = admin.connection.cursor()
        cur.execute("ALTER TABLE events DROP INDEX events_by_author")  # version 5's
        cur.execute("UPDATE streamd_meta SET version = 4")
    finally:
        admin.close()
    mysql_server.sql(f"CREATE USER IF NOT EXISTS '{USER}'@'localhost'")
    mysql_server.sql(f"GRANT ALL ON {database}.* TO '{USER}'@'localhost'")
    mysql_server.sql(f"ALTER USER '{USER}'@'localhost' WITH MAX_STATEMENT_TIME {LIMIT_S}")
    url = mysql_server.url(database, user=USER)

    def build_waited() -> bool:
        db = connect(parse(mysql_db), MysqlOptions())
        try:
            cur = db.cursor()
            cur.execute("SELECT count(*) FROM information_schema.processlist WHERE"
                        " info LIKE 'ALTER TABLE events ADD INDEX%%' AND time_ms > %s",
                        (LIMIT_S * 10 * 1000,))
            return bool(cur.fetchone()[0])
        finally:
            db.close()

    outcomes: dict[str, Any] = {}
    # An open transaction that has read events holds the table's metadata
    # lock, which the build must wait for as it starts.
    with holding(request, "mysql", "SELECT seq FROM events LIMIT 1"):
        thread = started(outcomes, "open", lambda: MysqlStore.open(url))
        until(lambda: "open" in outcomes or build_waited(),
              "the migration's build waiting for the table")
    thread.join(60)
    assert not thread.is_alive(), "the open still waits after the transaction ended"
    opened = outcomes["open"]
    assert isinstance(opened, MysqlStore), opened
    try:
        cur = opened.connection.cursor()
        cur.execute("SELECT version FROM streamd_meta")
        assert cur.fetchall() == ((schema.SCHEMA_VERSION,),)
        # The session's limit is the user's again once migrated.
        cur.execute("SELECT @@SESSION.max_statement_time")
        assert float(cur.fetchone()[0]) == LIMIT_S
    finally:
        opened.close()
