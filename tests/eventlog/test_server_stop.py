"""A daemon stopping (SIGTERM) while its database server is frozen (SIGSTOP)
with a call in flight on each of its two connections, on PostgreSQL and on
MariaDB: the stop gives the server one grace (``unresponsive_s``), shared by
the connections. Each connection's grace ran after the other's (the read's
when the stop cancelled it, the append's when the log closed), and the stop
took two and a half graces.

The calls are made to wait inside the server on a lock the test holds, which
the server's own view of its sessions confirms, before the server is frozen:
nothing here hopes a call got there in time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from support.frozen import stopped
from support.hosts import Host, append_params

from streamd.eventlog.mysql.store import MysqlOptions
from streamd.eventlog.postgres.store import PostgresOptions


@dataclass
class Frozen:
    """A database server of the test's, as the test freezes it."""

    url: str
    grace: float
    """The product's grace for a server that does not answer."""
    pids: Callable[[], list[int]]
    locked: Callable[[], AbstractContextManager[None]]
    """The log's events (and its counter) locked by a session of the test's."""
    waiting: Callable[[], int]
    """How many of the daemon's sessions the server says wait on that lock."""


def _postgres(request: pytest.FixtureRequest) -> Iterator[Frozen]:
    import psycopg
    from support import pg_cluster

    request.getfixturevalue("postgres_cluster")  # skipped loudly where none can run
    cluster = pg_cluster.start()  # its own: the whole server is frozen
    try:
        conninfo = cluster.fresh_database()
        name = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]

        @contextmanager
        def locked() -> Iterator[None]:
            with psycopg.connect(conninfo) as holder:
                holder.execute("LOCK TABLE streamd.events IN ACCESS EXCLUSIVE MODE")
                yield
                holder.rollback()

        def waiting() -> int:
            with psycopg.connect(conninfo, autocommit=True) as db:
                row = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                    " AND application_name = 'streamd' AND wait_event_type = 'Lock'",
                    (name,),
                ).fetchone()
            return int(row[0]) if row else 0

        yield Frozen(cluster.url(name), PostgresOptions().unresponsive_s, cluster.pids,
                     locked, waiting)
    finally:
        cluster.destroy()


def _mysql(request: pytest.FixtureRequest) -> Iterator[Frozen]:
    import MySQLdb

    server = request.getfixturevalue("mysql_server")
    url = request.getfixturevalue("mysql_db")
    name = url.split("/")[3].split("?")[0]

    def connect() -> Any:
        return MySQLdb.connect(unix_socket=str(server.socket), user="root", database=name)

    @contextmanager
    def locked() -> Iterator[None]:
        holder = connect()
        try:
            holder.cursor().execute("LOCK TABLES events WRITE, seq_counter WRITE")
            yield
        finally:
            holder.close()

    def waiting() -> int:
        db = connect()
        try:
            cur = db.cursor()
            cur.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = %s"
                " AND state = 'Waiting for table metadata lock'",
                (name,),
            )
            row = cur.fetchone()
            return int(row[0]) if row else 0
        finally:
            db.close()

    yield Frozen(url, MysqlOptions().unresponsive_s, lambda: [server.proc.pid], locked, waiting)


@pytest.fixture(params=["postgres", "mysql"])
def frozen(request: pytest.FixtureRequest) -> Iterator[Frozen]:
    yield from (_postgres if request.param == "postgres" else _mysql)(request)


async def test_a_daemon_stopping_while_its_server_is_frozen_gives_it_one_grace(
    frozen: Frozen, tmp_path: Path
) -> None:
    host = await Host.start(frozen.url, tmp_path / "host")
    try:
        with trio.fail_after(60):
            # Both connections open (the writer's first: it makes the schema).
            assert "result" in await host.call("eventlog/append", append_params("e0"))
            assert "result" in await host.call("eventlog/since", {"from_seq": 0})
            with frozen.locked():
                await host.send("eventlog/append", append_params("e1"))  # the writer's
                await host.send("eventlog/since", {"from_seq": 0})  # the reader's
                while frozen.waiting() < 2:
                    await trio.sleep(0.02)  # the server's sessions: no event to wait on
                with stopped(frozen.pids()):
                    started = time.monotonic()
                    host.proc.send_signal(signal.SIGTERM)
                    assert await host.proc.wait() == 0
                    took = time.monotonic() - started
    finally:
        if host.proc.returncode is None:
            host.proc.kill()
    # One grace and the daemon's own short waits; the graces one after the
    # other took 2.5 of them.
    assert took < 2 * frozen.grace, f"the stop took {took:.2f} s, the grace is {frozen.grace} s"
