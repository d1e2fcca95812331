"""Leases on PostgreSQL and MariaDB while another transaction holds the lease's
row: an acquire, a steal or a beat is stamped with a time read once it has
the row, never with one read before its wait for the row.

The wait is the server's: a connection of the test's own holds the row (a
``SELECT ... FOR UPDATE``, or an insert not yet committed) in an open
transaction, the store's call waits for it on a thread, the server is polled
until it shows the wait, and only then is the row let go. Each lease clock is
tested: the database's (the default), against its time read before the row
is let go; and the caller's, a hand clock the test moves only while the call
waits, so the time a row holds tells when it was read. Both were read before
the wait: MariaDB's ``NOW(6)`` is its statement's start, PostgreSQL computes
a row's new values before it waits for the row's lock, and the caller's
clock was read as the transaction began.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest
from support.server_locks import holding, lock_waits, started, until
from support.store_contract import SECOND, T0

from streamd.eventlog.model import LeaseAcquireParams, LeaseInfo, to_us

APP, USER, SESSION = "app", "u", "s"
WINDOW = LeaseAcquireParams(app=APP, user=USER, session=SESSION, stale_after_ms=30_000)
HOLD_LEASE = ("SELECT holder FROM leases WHERE app_name = ? AND user_id = ?"
              " AND session_id = ? FOR UPDATE", (APP, USER, SESSION))
WAIT_US = 5 * SECOND
"""How far the caller's clock moves while the call waits."""

Clock = Literal["database", "caller"]


class HandClock:
    """A caller's lease clock (microseconds), moved by the test alone."""

    def __init__(self) -> None:
        self.us = T0

    def __call__(self) -> int:
        return self.us


class Server:
    """The test's database on one server: stores on it (each its own
    connection, as hosts have), and SQL behind their backs."""

    def __init__(self, request: pytest.FixtureRequest, backend: str, clock: Clock) -> None:
        self.request, self.backend, self.clock = request, backend, clock
        self.opened: list[Any] = []
        self._clock_store: Any = None

    def store(self) -> Any:
        if self.backend == "postgres":
            from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

            conninfo = self.request.getfixturevalue("postgres_db")
            opened: Any = PostgresStore.open(conninfo, PostgresOptions(lease_clock=self.clock))
        else:
            from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore

            url = self.request.getfixturevalue("mysql_db")
            opened = MysqlStore.open(url, MysqlOptions(lease_clock=self.clock))
        self.opened.append(opened)
        return opened

    def database_now_us(self) -> int:
        """The database's clock, on a store of its own (a store's connection
        serves one thread at a time, and another may be waiting on it)."""
        if self._clock_store is None:
            self._clock_store = self.store()
        return int(self._clock_store.database_now_us())

    def run(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        """``sql`` (``?`` placeholders) on a connection of its own, in autocommit."""
        statement = sql.replace("?", "%s")
        if self.backend == "postgres":
            import psycopg

            conninfo = self.request.getfixturevalue("postgres_db")
            with psycopg.connect(conninfo, autocommit=True) as db:
                db.execute("SET search_path = streamd")
                db.execute(statement, args)
            return
        from streamd.eventlog.mysql.store import MysqlOptions, connect
        from streamd.eventlog.mysql.url import parse

        db = connect(parse(self.request.getfixturevalue("mysql_db")), MysqlOptions())
        try:
            db.cursor().execute(statement, args)
        finally:
            db.close()

    def held_while(self, hold: tuple[str, tuple[Any, ...]], call: Callable[[], Any],
                   clock: HandClock) -> tuple[Any, int]:
        """``call`` made while another transaction runs ``hold`` and stays
        open: what it returned, and the time, by the lease clock, at which
        the row was let go (past every time read before then)."""
        waits = lock_waits(self.request, self.backend)
        outcomes: dict[str, Any] = {}
        with holding(self.request, self.backend, *hold):
            thread = started(outcomes, "call", call)
            until(lambda: waits() >= 1, "the call waiting for the lease's row")
            clock.us += WAIT_US
            released = clock.us if self.clock == "caller" else self.database_now_us()
        thread.join(60)
        assert not thread.is_alive(), "the call still waits after the row was let go"
        if isinstance(outcomes["call"], BaseException):
            raise outcomes["call"]
        return outcomes["call"], released


@pytest.fixture(params=["postgres", "mysql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["database", "caller"])
def server(request: pytest.FixtureRequest, backend: str) -> Iterator[Server]:
    on = Server(request, backend, request.param)
    yield on
    for store in on.opened:
        store.close()


def stamped_after(lease: LeaseInfo, released: int) -> None:
    assert lease.heartbeat_at is not None
    stamped = to_us(lease.heartbeat_at)
    early_ms = (released - stamped) / 1000
    assert stamped >= released, f"stamped {early_ms:.0f} ms before it had the row"


def test_a_steal_that_waited_for_the_lease_row_is_stamped_once_it_had_the_row(
    server: Server,
) -> None:
    # Before: the new lease was as old as the wait when it was written (2.0 s
    # for a 2 s hold on the database's clock), stealable at once under a
    # shorter window before its holder's first beat.
    a, b = server.store(), server.store()
    clock = HandClock()
    a.acquire_lease(WINDOW, "a/1/aaaaaaaa", clock)
    # A last beat a minute before now, on either clock: stale for its 30 s window.
    server.run("UPDATE leases SET heartbeat_at = heartbeat_at - ?", (60 * SECOND,))
    _, released = server.held_while(
        HOLD_LEASE, lambda: b.acquire_lease(WINDOW, "b/2/bbbbbbbb", clock), clock)
    [lease] = b.list_leases()
    assert lease.holder == "b/2/bbbbbbbb"
    stamped_after(lease, released)
    assert lease.acquired_at == lease.heartbeat_at


def test_a_beat_that_waited_for_the_lease_row_is_stamped_once_it_had_the_row(
    server: Server,
) -> None:
    # As a steal: a beat stamped before its wait left the lease as old as the
    # wait when written, though its holder had just beaten.
    a = server.store()
    clock = HandClock()
    a.acquire_lease(WINDOW, "a/1/aaaaaaaa", clock)
    beat, released = server.held_while(
        HOLD_LEASE, lambda: a.heartbeat_lease(APP, USER, SESSION, "a/1/aaaaaaaa", clock), clock)
    assert beat is True
    [lease] = a.list_leases()
    stamped_after(lease, released)


def test_a_new_lease_that_waited_for_another_requesters_insert_is_stamped_once_it_had_the_row(
    server: Server,
) -> None:
    # Another requester inserted the lease's row and has not committed (a host
    # that vanished mid-transaction holds it until its server gives up on
    # it); it rolls back, and the lease is ours. PostgreSQL's SELECT ... FOR
    # UPDATE passes over such a row: there it is the insert that waits.
    b = server.store()
    clock = HandClock()
    insert = ("INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at,"
              " heartbeat_at, stale_after_ms) VALUES (?, ?, ?, 'gone/0/00000000', ?, ?, 30000)",
              (APP, USER, SESSION, T0, T0))
    _, released = server.held_while(
        insert, lambda: b.acquire_lease(WINDOW, "b/2/bbbbbbbb", clock), clock)
    [lease] = b.list_leases()
    assert lease.holder == "b/2/bbbbbbbb"
    stamped_after(lease, released)
    assert lease.acquired_at == lease.heartbeat_at
