"""PostgreSQL servers that crash or stop answering: no acknowledged append is
lost, a cancelled call returns, close does not hang, and TCP connections are
set up to notice a silent server. Each needs a cluster of its own or stops
one (``postgres_cluster`` in conftest.py).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from support.frozen import stopped
from support.postgres_store import T0, ap, until

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.model import (
    Event,
    SinceParams,
)
from streamd.eventlog.postgres.runner import PostgresRunner
from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

# --- outages ---------------------------------------------------------------------------


@pytest.fixture
def own_cluster(postgres_cluster: Any) -> Iterator[Any]:
    """A cluster of the test's own, for stopping and starting it."""
    from support import pg_cluster

    cluster = pg_cluster.start()
    yield cluster
    cluster.destroy()


def test_a_crash_of_the_server_loses_no_acknowledged_append_and_errors_are_clear(
    own_cluster: Any,
) -> None:
    conninfo = own_cluster.fresh_database()
    store = PostgresStore.open(conninfo, PostgresOptions(reconnect_min_s=0.05, reconnect_max_s=0.2))
    try:
        acked = [store.append(ap(f"e{i}"), T0).seq for i in range(100)]
        own_cluster.stop("immediate")  # a crash: no shutdown checkpoint
        with pytest.raises(RpcError) as lost:
            store.append(ap("during"), T0)
        assert lost.value.code == SOURCE_UNAVAILABLE
        assert "the database" in lost.value.message or "PostgreSQL database" in lost.value.message
        # While it is down, calls fail at once rather than each waiting to connect.
        failing = time.monotonic()
        for _ in range(5):
            with pytest.raises(RpcError) as down:
                store.latest_seq(None)
            assert down.value.code == SOURCE_UNAVAILABLE
        assert time.monotonic() - failing < 2
        own_cluster.start()

        def back() -> bool:
            try:
                store.ping()
            except RpcError:
                return False
            return True

        until(back, 30, "the store reconnects after the server is back")
        assert [e.seq for e in store.since(SinceParams(from_seq=0, limit=1000)).entries][
            : len(acked)
        ] == acked
        # "during" may or may not have committed; a retry is safe either way.
        retried = store.append(ap("during"), T0)
        assert retried.seq > acked[-1]
    finally:
        store.close()


# --- a server that does not answer -------------------------------------------------------


async def test_a_cancelled_call_on_a_stopped_server_returns_and_the_next_call_reconnects(
    postgres_db: str,
) -> None:
    runner = await PostgresRunner.open(postgres_db, PostgresOptions(unresponsive_s=0.5))
    try:
        pid = runner.store.connection.info.backend_pid
        with stopped([pid]):
            started = time.monotonic()
            with trio.move_on_after(0.2):
                await runner.run(lambda s: s.newest_seq())
            # A cancel request reaches a stopped backend only when it runs again.
            assert time.monotonic() - started < 5
            assert await runner.run(lambda s: s.newest_seq()) == 0  # a new connection
            assert runner.store.connection.info.backend_pid != pid
    finally:
        await runner.aclose()


async def test_close_does_not_hang_on_a_stopped_server_and_the_append_hears_maybe(
    postgres_cluster: Any,
    postgres_db: str,
) -> None:
    from streamd.eventlog.log import EventLog

    url = postgres_cluster.url(psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"])
    got: list[BaseException] = []

    async def append_one(log: EventLog) -> None:
        try:
            await log.append("app", "u", "s", Event(id="in-flight", author="agent", content=None))
        except RpcError as exc:
            got.append(exc)

    with trio.fail_after(30):
        async with EventLog(url) as log, trio.open_nursery() as nursery:
            await log.append("app", "u", "s", Event(id="first", author="agent", content=None))
            assert log.connections.writer is not None
            pid = log.connections.writer.store.connection.info.backend_pid
            with stopped([pid]):
                nursery.start_soon(append_one, log)
                # Every task blocked: the append is on the worker thread, whose
                # statement the stopped backend will not answer.
                await trio.testing.wait_all_tasks_blocked()
                started = time.monotonic()
                await log.aclose()
                took = time.monotonic() - started
    assert took < 6, f"close took {took:.1f} s with the server stopped"
    (error,) = got
    assert isinstance(error, RpcError) and error.code == SOURCE_UNAVAILABLE
    assert "may or may not have committed" in error.message
    assert "same event id is safe" in error.message
    # Whatever it came to, the retry is safe.
    store = PostgresStore.open(postgres_db)
    try:
        retried = store.append(ap("in-flight"), T0)
        assert retried.seq == 2
    finally:
        store.close()


def test_tcp_connections_get_keepalives_and_a_user_timeout_unless_given() -> None:
    from streamd.eventlog.postgres.store import connect_params

    extra = connect_params("host=db.example port=5432 dbname=x", PostgresOptions())
    assert extra["keepalives"] == 1 and extra["keepalives_idle"] == 10
    assert extra["keepalives_interval"] == 5 and extra["keepalives_count"] == 3
    assert extra["tcp_user_timeout"] == 30_000
    own = connect_params(
        "postgresql://u@db.example/x?keepalives_idle=99&tcp_user_timeout=5", PostgresOptions()
    )
    assert "keepalives_idle" not in own and "tcp_user_timeout" not in own


async def test_calls_queued_behind_a_connect_that_times_out_fail_at_once() -> None:
    # A server that accepts and never answers (a hung host): the first call
    # waits out the connect timeout; the calls queued behind it each waited
    # out one of their own (12 calls: answered at 5, 10, ... 60 s). Now they
    # wait for that one attempt and fail with it; after a failed connect,
    # calls fail at once until the next attempt is due.
    from streamd.eventlog import EventLog

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    url = (f"postgresql://streamd@127.0.0.1:{port}/events"
           "?connect_timeout=2&sslmode=disable&gssencmode=disable")
    refusals: list[str] = []
    try:
        with trio.fail_after(60):
            async with EventLog(url) as log:

                async def call() -> None:
                    try:
                        await log.latest_seq()
                    except RpcError as exc:
                        assert exc.code == SOURCE_UNAVAILABLE
                        refusals.append(exc.message)

                async with trio.open_nursery() as nursery:
                    for _ in range(5):
                        nursery.start_soon(call)
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert len(refusals) == 5
    assert len(accepted) == 1  # one attempt, every call's
    assert all("cannot connect" in m for m in refusals)


async def test_the_logs_fault_says_the_server_is_gone_until_it_is_back(own_cluster: Any) -> None:
    # What streamd status shows as db_fault: a server gone after the log had
    # connected, not only one it never reached.
    from streamd.eventlog import EventLog

    conninfo = own_cluster.fresh_database()
    with trio.fail_after(120):
        async with EventLog(conninfo) as log:
            await log.append("app", "u", "s", Event(id="e0", author="a", content=None))
            assert log.fault is None
            await trio.to_thread.run_sync(own_cluster.stop, "fast")
            with pytest.raises(RpcError):
                await log.append("app", "u", "s", Event(id="e1", author="a", content=None))
            # A lost connection says nothing of the server yet; the attempt to
            # reconnect that fails does: the writer's here, as a retention
            # step's or a lease's would be.
            while log.fault is None:
                with pytest.raises(RpcError):
                    await log.append("app", "u", "s", Event(id="e1", author="a", content=None))
                await trio.sleep(0.05)  # the backoff's next attempt
            assert "cannot connect" in log.fault
            await trio.to_thread.run_sync(own_cluster.start)
            # The server is back, and a read reaches it: the writer's failed
            # attempt is older news, and status must not say the server is gone
            # until something happens to write.
            while True:
                try:
                    await log.latest_seq()
                    break
                except RpcError:
                    await trio.sleep(0.05)  # the backoff's next attempt
            assert log.fault is None
            # A newer failure is news again.
            await trio.to_thread.run_sync(own_cluster.stop, "fast")
            while log.fault is None:
                with pytest.raises(RpcError):
                    await log.append("app", "u", "s", Event(id="e1", author="a", content=None))
                await trio.sleep(0.05)
            assert "cannot connect" in log.fault
            await trio.to_thread.run_sync(own_cluster.start)
            while True:
                try:
                    await log.append("app", "u", "s", Event(id="e1", author="a", content=None))
                    break
                except RpcError:
                    await trio.sleep(0.05)
            assert log.fault is None
