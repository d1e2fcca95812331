"""A PostgreSQL or MariaDB server that accepts the log's connection and then
refuses to let it set up its schema (the first writer's role or user may not
``CREATE``): the error says the connection was made and what was refused.

Before, it said ``cannot connect to the event log's ...``, the words of a
server that cannot be reached: an operator was sent to the network and the
credentials, not to the grant the docs say the first writer needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamd.errors import SOURCE_UNAVAILABLE, RpcError

Open = Callable[[], Any]


@pytest.fixture(params=["postgres", "mysql"])
def without_create(request: pytest.FixtureRequest) -> Iterator[tuple[Open, str]]:
    """The open of a log on a fresh, empty database by a role (user) that
    may connect, read and write there but not create tables; and the words
    the server refuses the first ``CREATE`` with."""
    if request.param == "postgres":
        import psycopg

        from streamd.eventlog.postgres.store import PostgresStore

        cluster = request.getfixturevalue("postgres_cluster")
        conninfo = cluster.fresh_database()  # empty: no streamd schema yet
        name = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname ="
                          " 'streamd_nocreate') THEN CREATE ROLE streamd_nocreate LOGIN;"
                          " END IF; END $$")
            admin.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC')
        yield (lambda: PostgresStore.open(cluster.conninfo(name, user="streamd_nocreate")),
               "permission denied for database")
        cluster.drop_database(conninfo)
    else:
        from streamd.eventlog.mysql.store import MysqlStore

        server = request.getfixturevalue("mysql_server")
        url = request.getfixturevalue("mysql_db")
        database = url.split("/")[3].split("?")[0]
        server.sql("CREATE USER IF NOT EXISTS 'streamd_nocreate'@'localhost'")
        server.sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {database}.*"
                   " TO 'streamd_nocreate'@'localhost'")
        yield (lambda: MysqlStore.open(server.url(database, user="streamd_nocreate")),
               "CREATE command denied")


def test_a_schema_the_role_may_not_create_is_not_called_a_connection_failure(
    without_create: tuple[Open, str],
) -> None:
    open_log, refused = without_create
    with pytest.raises(RpcError) as failed:
        open_log()
    message = failed.value.message
    assert failed.value.code == SOURCE_UNAVAILABLE
    assert "cannot connect" not in message
    assert message.startswith("connected to the event log's ")
    assert "could not check or set up its schema" in message
    assert refused in message
