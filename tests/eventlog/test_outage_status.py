"""What the log says of an outage of its database server, for ``streamd
status`` (``db_reconnecting_s``, ``db_connecting_s``, ``db_fault``): a server
it had reached is stopped (its connects are refused at once), then started
again. Before, the newest failed attempt was all there was to see: nothing
said the log had lost its server, nor since when.

On PostgreSQL and on MariaDB, each a server of the test's own to stop, which
the log reaches with a password holding the characters a URL escapes: it
shows nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
import trio
from support.eventlog import ev

from streamd.errors import RpcError
from streamd.eventlog import EventLog

SECRET = "p@ss?w#rd%&"
"""The log's password: written %-escaped in its URL."""


@dataclass
class Own:
    """A server of the test's own, and the log's URL on it."""

    url: str
    stop: Callable[[], object]
    start: Callable[[], object]


@pytest.fixture(params=["postgres", "mysql"])
def own(request: pytest.FixtureRequest) -> Iterator[Own]:
    secret = quote(SECRET, safe="")
    if request.param == "postgres":
        request.getfixturevalue("postgres_cluster")  # a loud skip where none can start
        from support import pg_cluster

        cluster = pg_cluster.start()
        try:
            role = pg_cluster.PASSWORD_ROLE  # the role the cluster asks a password of
            cluster.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'")
            cluster.psql(f"CREATE DATABASE outage OWNER {role}")
            yield Own(f"postgresql://{role}:{secret}@/outage?host={cluster.socket_dir}"
                      f"&port={pg_cluster.PORT}", lambda: cluster.stop("fast"), cluster.start)
        finally:
            cluster.destroy()
    else:
        request.getfixturevalue("mysql_server")
        from support import mariadb_server

        server = mariadb_server.start()
        try:
            user = mariadb_server.PASSWORD_USER
            server.sql(f"ALTER USER '{user}'@'localhost' IDENTIFIED BY '{SECRET}'")
            server.sql("CREATE DATABASE outage")
            yield Own(server.url("outage", user=user).replace("@/", f":{secret}@/"),
                      server.stop, server.start)
        finally:
            server.destroy()


async def _attempt(log: EventLog) -> str | None:
    """A ping, once the reconnects' backoff lets it make an attempt: its
    error, None when it was answered."""
    while True:
        try:
            await log.ping()
        except RpcError as exc:
            if "reconnect attempt in" not in exc.message:
                return exc.message  # an attempt's, or the broken connection's
            await trio.sleep(0.05)  # the backoff's next attempt
        else:
            return None


def _no_secret(*texts: Any) -> None:
    for text in texts:
        for form in (SECRET, quote(SECRET, safe=""), quote(SECRET)):
            assert form not in str(text)


async def test_a_stopped_server_shows_as_reconnecting_from_the_first_attempt_until_it_is_back(
        own: Own, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMD_DB", own.url)  # a password is refused in an argument
    with trio.fail_after(120):
        async with EventLog() as log:
            await log.append("a", "u", "s", ev("e0"))
            assert log.reconnecting_s is None
            await trio.to_thread.run_sync(own.stop)
            while "cannot connect" not in (error := await _attempt(log) or ""):
                pass  # the connection found broken, before an attempt to make it again
            first_failed = time.monotonic()
            assert log.fault is not None and log.fault.startswith(error)
            assert log.reconnecting_s is not None
            assert log.connecting_s is None  # refused at once: none under way
            assert "cannot connect" in (await _attempt(log) or "")
            # Measured from the first attempt, through the second, not from it.
            now = time.monotonic()
            lost = log.reconnecting_s
            assert lost is not None and lost > now - first_failed
            _no_secret(log.fault, error)
            await trio.to_thread.run_sync(own.start)
            while await _attempt(log) is not None:
                await trio.sleep(0.05)  # the server still starting
            assert log.reconnecting_s is None and log.fault is None and log.connecting_s is None
