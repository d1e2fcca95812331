"""On a server backend, a read that is slow for its answer alone holds up no
other client: reads share a few connections (``eventlog/reader_pool.py``).

With one reader connection, a 1 s read (a whole long session, every session
of a user) made a ping of another client wait 1 s, and every other read with
it. A store read is held here on a thread handshake, never timed; every test
is bounded by ``trio.fail_after``. Each runs on PostgreSQL and MariaDB, but
the one on the pool's choice of a connection, which drives a stand-in store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import ev, thread_event

from streamd.eventlog import EventLog, reader_pool
from streamd.eventlog.server_runner import ServerRunner


@pytest.fixture(params=["postgres", "mysql"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, type[Any]]]:
    """A fresh log's URL on each server backend, and its store class."""
    if request.param == "postgres":
        import psycopg

        from streamd.eventlog.postgres.store import PostgresStore

        cluster = request.getfixturevalue("postgres_cluster")
        conninfo = request.getfixturevalue("postgres_db")
        name = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]
        yield cluster.url(name), PostgresStore
    else:
        from streamd.eventlog.mysql.store import MysqlStore

        yield request.getfixturevalue("mysql_db"), MysqlStore


def held(store_cls: type[Any], name: str, monkeypatch: pytest.MonkeyPatch,
         ) -> tuple[threading.Event, threading.Event]:
    """Make ``store_cls.name`` wait, once in it, until the second event is set;
    the first is set when it is in."""
    inside, finish = threading.Event(), threading.Event()
    original = getattr(store_cls, name)

    def waiting(self: Any, *args: Any) -> Any:
        inside.set()
        finish.wait(60)
        return original(self, *args)

    monkeypatch.setattr(store_cls, name, waiting)
    return inside, finish


async def test_a_slow_read_holds_up_no_ping_read_or_append_of_another_client(
    server: tuple[str, type[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, store_cls = server
    inside, finish = held(store_cls, "list_sessions", monkeypatch)
    listed: list[int] = []
    with trio.fail_after(60):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))

            async def slow_read() -> None:
                listed.append(len(await log.list_sessions("a", "u")))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_read)
                await thread_event(inside)
                try:
                    # Before: the ping and the session read waited for the
                    # slow read to end (here: for ever).
                    with trio.fail_after(20):
                        await log.ping()
                        session = await log.get_session("a", "u", "s")
                        await log.append("a", "u", "s", ev("e1"))
                        assert await log.latest_seq() == 2
                finally:
                    finish.set()
            assert [e.event.id for e in session.events] == ["e0"]
    assert listed == [1]


async def test_reads_open_no_more_connections_than_the_pool_holds(
    server: tuple[str, type[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, store_cls = server
    monkeypatch.setattr(reader_pool, "READERS", 2)
    opened = 0
    original_open = store_cls.open

    def counted(*args: Any, **kw: Any) -> Any:
        nonlocal opened
        opened += 1
        return original_open(*args, **kw)

    monkeypatch.setattr(store_cls, "open", counted)
    inside, finish = held(store_cls, "list_sessions", monkeypatch)
    with trio.fail_after(60):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            assert opened == 2  # the writer and the reader
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(log.list_sessions, "a", "u")
                await thread_event(inside)
                await trio.testing.wait_all_tasks_blocked()
                finish.set()
            # Two slow reads at once at most: the reader and one more.
            assert opened == 3


async def test_a_watch_reading_its_history_holds_up_no_ping_of_another_client(
    server: tuple[str, type[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A watch read its pages on the first reader connection, which the pool
    # counted as free and lent the next read: a ping waited for the page.
    url, store_cls = server
    inside, finish = held(store_cls, "since_committed", monkeypatch)
    with trio.fail_after(60):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            got: list[str] = []

            async def watching() -> None:
                async with log.watch(0) as w:
                    async for entry in w:
                        got.append(entry.event.id)
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watching)
                await thread_event(inside)
                try:
                    with trio.fail_after(20):
                        await log.ping()
                finally:
                    finish.set()
            assert got == ["e0"]


class _Store:
    """A server store whose next call hangs in the driver's connect (the
    server restarting) until ``back`` is set; the others answer at once."""

    def __init__(self) -> None:
        self.back = threading.Event()
        self.inside = threading.Event()
        self.connecting = False

    def hang(self) -> str:
        self.connecting = True
        self.inside.set()
        self.back.wait(60)
        self.connecting = False
        return "late"

    def ping(self) -> str:
        return "pong"

    def cancel_running(self) -> None:
        pass

    def sever(self) -> None:
        pass

    def cut_if_connecting(self) -> bool:
        return self.connecting

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def attempts(self) -> Any:
        raise NotImplementedError


async def test_a_read_takes_another_connection_than_one_a_cancelled_read_still_holds() -> None:
    # A read cancelled while its connection was reconnecting returns at
    # once, and its thread holds the connection until the connect ends (the
    # whole connect timeout, or for ever without one). The pool lent that
    # connection first (the last returned), so the next read, a ping among
    # them, waited for that connect while it could open another.
    stuck = _Store()
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as opens:
                pool = reader_pool.ReaderPool(
                    ServerRunner(stuck, grace_s=1.0),
                    lambda: _open(ServerRunner(_Store(), grace_s=1.0)), spawn=opens.start_soon)
                with trio.CancelScope() as cancelled:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(pool.run, _Store.hang)
                        await thread_event(stuck.inside)
                        cancelled.cancel()
                assert await pool.run(_Store.ping) == "pong"
                assert len(pool.runners) == 2
    finally:
        stuck.back.set()


async def _open(runner: Any) -> Any:
    return runner
