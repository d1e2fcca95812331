"""What the PostgreSQL backend promises beyond the contract tests it shares
with SQLite (tests/eventlog/test_store.py): commit-ordered seq under writers on
several connections, leases judged by the database's clock, a LISTEN wake per
committed batch, outages that lose no acknowledged append, credentials that
never show. Every test here needs a cluster (``postgres_cluster`` in
conftest.py) and is skipped, loudly, where none can be started.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.commit_order import race_writers_and_a_reader
from support.filters import _ALPHABET, _filters, _Row, _text
from support.hosts import Host
from support.hosts import append_params as _append

from streamd.errors import SESSION_LOCKED, SOURCE_UNAVAILABLE, RpcError, is_closed
from streamd.eventlog import filters
from streamd.eventlog.model import (
    AppendParams,
    Event,
    Filter,
    LeaseAcquireParams,
    SessionTree,
    SinceParams,
    to_us,
)
from streamd.eventlog.postgres.changes import PgChanges
from streamd.eventlog.postgres.runner import PostgresRunner
from streamd.eventlog.postgres.schema import NOTIFY_CHANNEL
from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore, describe
from streamd.eventlog.store import AppendGroup

T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
HOUR = 3600 * 1_000_000
KEY = ("app", "u", "s")


def ap(event_id: str, session: str = "s", content: Any = None) -> AppendParams:
    return AppendParams(
        app="app",
        user="u",
        session=session,
        event=Event(id=event_id, author="agent", content=content),
    )


@pytest.fixture
def open_store(postgres_db: str) -> Iterator[Callable[..., PostgresStore]]:
    """Open stores on the test's database ("hosts": each its own connection)."""
    opened: list[PostgresStore] = []

    def open_(**kw: Any) -> PostgresStore:
        store = PostgresStore.open(postgres_db, PostgresOptions(**kw))
        opened.append(store)
        return store

    yield open_
    for s in opened:
        s.close()


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait for a real server to reach ``condition``, checking every 20 ms."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


# --- commit-ordered seq ---------------------------------------------------------------


def test_a_reader_never_sees_a_seq_before_every_lower_seq_is_visible(
    open_store: Callable[..., PostgresStore],
) -> None:
    writers = [open_store(synchronous="NORMAL") for _ in range(4)]
    reads = race_writers_and_a_reader(writers, open_store(), lambda i, s: ap(i, session=s), T0)
    assert reads > 4 * 40 / 4, "the reader must have raced the writers"


def test_each_batch_commits_as_one_run_of_seqs_even_with_two_writers(
    open_store: Callable[..., PostgresStore],
) -> None:
    a, b = open_store(), open_store()
    first = a.append_commit([ap("a1"), ap("a2")], T0, capture=False)
    second = b.append_commit([ap("b1"), ap("a1"), ap("b2")], T0, capture=True)
    assert (first.before_seq, first.after_seq) == (0, 2)
    assert (second.before_seq, second.after_seq) == (2, 4)
    assert second.results[1].duplicate  # a1 was committed by the other writer
    assert [c.seq for c in second.entries or []] == [3, 4]
    assert a.newest_seq() == b.newest_seq() == 4


# --- leases on the database's clock ----------------------------------------------------


def test_lease_staleness_is_judged_by_the_databases_clock_not_the_hosts(
    open_store: Callable[..., PostgresStore],
    postgres_db: str,
) -> None:
    host_a, host_b = open_store(), open_store()
    host_a.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "a/1/aaaaaaaa",
        T0,
    )
    # Host B's clock runs an hour ahead: by its clock A's heartbeat is an hour
    # old, by the database's it is fresh.
    with pytest.raises(RpcError) as info:
        host_b.acquire_lease(
            LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
            "b/2/bbbbbbbb",
            T0 + HOUR,
        )
    assert info.value.code == SESSION_LOCKED
    assert info.value.data["holder"] == "a/1/aaaaaaaa"
    assert info.value.data["heartbeat_age_ms"] < 30_000
    (lease,) = host_a.list_leases()
    stamped = to_us(lease.heartbeat_at)
    assert abs(stamped - host_a.database_now_us()) < 60 * 1_000_000
    # A last beat a minute ago by the database's clock (set by hand): stale for
    # its 30 s window although host B's clock now runs an hour *behind*.
    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("UPDATE streamd.leases SET heartbeat_at = heartbeat_at - 60000000")
    host_b.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "b/2/bbbbbbbb",
        T0 - HOUR,
    )
    assert [x.holder for x in host_b.list_leases()] == ["b/2/bbbbbbbb"]
    # A's next heartbeat matches no row: the lease was stolen (lock_lost).
    assert not host_a.heartbeat_lease(*KEY, "a/1/aaaaaaaa", T0)
    assert host_b.heartbeat_lease(*KEY, "b/2/bbbbbbbb", T0 - HOUR)


def test_two_hosts_racing_for_a_new_lease_get_one_holder(
    open_store: Callable[..., PostgresStore],
) -> None:
    hosts = [open_store() for _ in range(4)]
    start = threading.Barrier(len(hosts))
    won: list[str] = []
    lost: list[RpcError] = []

    def take(i: int) -> None:
        start.wait()
        try:
            hosts[i].acquire_lease(
                LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
                f"h{i}/1/0000000{i}",
                T0,
            )
            won.append(f"h{i}/1/0000000{i}")
        except RpcError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == len(hosts) - 1
    assert all(e.code == SESSION_LOCKED and e.data["holder"] == won[0] for e in lost)


# --- LISTEN/NOTIFY ---------------------------------------------------------------------


def test_one_notification_per_committed_batch_carrying_its_newest_seq(
    open_store: Callable[..., PostgresStore],
    postgres_db: str,
) -> None:
    store = open_store()
    with psycopg.connect(postgres_db, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        big = store.append_commit([ap(f"e{i}") for i in range(50)], T0, capture=False)
        store.append_batch([ap("e3")], T0)  # only a duplicate: nothing committed
        store.append_batch([AppendGroup([ap("g1"), ap("e3", content=1)])], T0)  # refused
        last = store.append_commit([ap("f1")], T0, capture=False)
        got = [int(n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
    assert got == [big.after_seq, last.after_seq] == [50, 51]


async def test_a_listener_wakes_for_another_connections_commit(
    postgres_db: str,
    open_store: Callable[..., PostgresStore],
) -> None:
    writer = open_store()
    with trio.fail_after(10):
        async with PgChanges(postgres_db, fallback_interval=0.2) as changes:
            assert changes.mode == "listen"
            await trio.to_thread.run_sync(lambda: writer.append_batch([ap("e1")], T0))
            await changes.wait()
            assert changes.newest_notified == 1
            # Two commits before the next wait: each is seen, in at most one
            # return apiece (the second may still be on its way to the socket
            # when the first is read, so they are not always one return).
            await trio.to_thread.run_sync(lambda: writer.append_batch([ap("e2")], T0))
            await trio.to_thread.run_sync(lambda: writer.append_batch([ap("e3")], T0))
            returns = 0
            while changes.newest_notified < 3:
                await changes.wait()
                returns += 1
            assert returns <= 2


async def test_a_dropped_listener_wakes_polls_and_listens_again(
    postgres_db: str,
    open_store: Callable[..., PostgresStore],
) -> None:
    writer = open_store()
    with trio.fail_after(20):
        async with PgChanges(
            postgres_db,
            fallback_interval=0.05,
            poll=lambda: trio.to_thread.run_sync(writer.newest_seq),
        ) as changes:
            pid = changes.backend_pid
            assert pid is not None
            with psycopg.connect(postgres_db, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # Notifications sent while it was away are lost: the drop is a wake.
            await changes.wait()
            while changes.mode != "listen":
                await changes.wait()  # each return is a poll or the reconnect
            assert changes.backend_pid not in (None, pid)
            await trio.to_thread.run_sync(lambda: writer.append_batch([ap("after")], T0))
            while changes.newest_notified < 1:
                await changes.wait()


# --- the Trio runner -------------------------------------------------------------------


async def test_a_cancelled_call_cancels_its_statement_and_the_next_call_works(
    postgres_db: str,
) -> None:
    runner = await PostgresRunner.open(postgres_db)
    try:
        started = time.monotonic()
        with trio.move_on_after(0.2):
            await runner.run(lambda s: s.connection.execute("SELECT pg_sleep(30)"))
        assert time.monotonic() - started < 5
        assert await runner.run(lambda s: s.newest_seq()) == 0
        runner.interrupt()
        with pytest.raises(RpcError) as info:
            await runner.run(lambda s: s.newest_seq())
        assert is_closed(info.value)
    finally:
        await runner.aclose()


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


# --- credentials -----------------------------------------------------------------------

SECRET = "s3cret-Pw-that-must-not-show"


@pytest.fixture
def password_db(postgres_cluster: Any) -> Iterator[str]:
    """A database owned by a role that must log in with :data:`SECRET`; its
    conninfo without the password."""
    from support import pg_cluster

    admin_info = postgres_cluster.conninfo()
    name = f"pw{os.getpid()}"
    with psycopg.connect(admin_info, autocommit=True) as admin:
        admin.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname ="
            f" '{pg_cluster.PASSWORD_ROLE}') THEN CREATE ROLE {pg_cluster.PASSWORD_ROLE}"
            f" LOGIN; END IF; END $$"
        )
        admin.execute(f"ALTER ROLE {pg_cluster.PASSWORD_ROLE} PASSWORD '{SECRET}'")
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name} OWNER {pg_cluster.PASSWORD_ROLE}")
    yield postgres_cluster.conninfo(name, user=pg_cluster.PASSWORD_ROLE)
    with psycopg.connect(admin_info, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_password_comes_from_a_passfile_and_never_shows(
    password_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(password_db)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"{params['host']}:{params['port']}:*:{params['user']}:{SECRET}\n")
    passfile.chmod(0o600)  # libpq ignores a passfile others can read
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    store = PostgresStore.open(password_db)
    store.append(ap("e1"), T0)
    store.close()
    assert SECRET not in caplog.text


def test_a_service_file_names_the_database(
    password_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(password_db)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        "[streamd-test]\n"
        + "".join(f"{k}={v}\n" for k, v in params.items())
        + f"password={SECRET}\n"
    )
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    store = PostgresStore.open("service=streamd-test")
    assert store.latest_seq(None) == 0
    assert SECRET not in store.where
    store.close()


def test_a_wrong_password_is_a_clear_error_that_names_no_password(
    password_db: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-" + SECRET
    with pytest.raises(RpcError) as info:
        PostgresStore.open(password_db + f" password={wrong}")
    text = f"{info.value.message} {info.value.data}"
    assert info.value.code == SOURCE_UNAVAILABLE
    assert "password authentication failed" in text
    assert "streamd_pw" in text  # which role, so the operator can act
    assert wrong not in text and SECRET not in text
    # Not chained to the driver's exception either, so no traceback shows it.
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert wrong not in caplog.text
    url = "postgresql://streamd_pw:" + wrong + "@/x?host=/nowhere"
    assert wrong not in describe(url)


# --- daemons on two hosts ------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


async def test_two_daemons_on_two_hosts_share_one_log(
    postgres_cluster: Any,
    postgres_db: str,
    tmp_path: Path,
) -> None:
    name = psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"]
    url = postgres_cluster.url(name)
    with trio.fail_after(60):
        a = await Host.start(url, tmp_path / "host-a")
        b = await Host.start(url, tmp_path / "host-b")
        try:
            watch = await a.send("eventlog/watch", {"from_seq": 0})
            first = await b.call("eventlog/append", _append("from-b"))
            assert first["result"] == {"seq": 1, "duplicate": False}
            # A's watcher is woken by B's commit (LISTEN/NOTIFY), not by a poll.
            entry = await a.note("eventlog/entry")
            assert entry["params"]["watch"] == watch
            assert entry["params"]["entry"]["event"]["id"] == "from-b"
            second = await a.call("eventlog/append", _append("from-a"))
            assert second["result"]["seq"] == 2
            got = await b.call("eventlog/since", {"from_seq": 0})
            assert [e["event"]["id"] for e in got["result"]["entries"]] == ["from-b", "from-a"]
            # The same event id from the other host is a retry, not a second event.
            again = await b.call("eventlog/append", _append("from-a"))
            assert again["result"] == {"seq": 2, "duplicate": True}
            # A lease held on one host is held on the other.
            lock = await a.call(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "s"}
            )
            assert "lock" in lock["result"]
            taken = await b.call(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "s"}
            )
            assert taken["error"]["code"] == SESSION_LOCKED
            assert taken["error"]["data"]["holder"] == lock["result"]["holder"]
            # Nothing of the log went to either host's own state directory.
            assert not list((tmp_path / "host-a").rglob("*.db"))
            assert not list((tmp_path / "host-b").rglob("*.db"))
        finally:
            for host in (a, b):
                with trio.move_on_after(10):
                    await host.stop()
                if host.proc.returncode is None:
                    host.proc.kill()


def test_the_eventlog_conformance_suite_passes_on_postgres(
    postgres_cluster: Any,
    postgres_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # postgres_db made the migrated template the adapter copies for each case.
    from streamd import conformance

    suite = REPO / "conformance" / "eventlog"
    cases = len(conformance.discover_cases(suite))
    adapter = shlex.join(
        [
            sys.executable,
            str(REPO / "tests" / "support" / "pg_cluster.py"),
            "adapter",
            postgres_cluster.conninfo(),
        ]
    )
    assert conformance.main(["verify", str(suite), "--adapter", adapter]) == 0, (
        capsys.readouterr().out
    )
    assert f"{cases} passed, 0 failed" in capsys.readouterr().out


async def test_a_password_in_the_db_url_is_refused_and_never_shown(postgres_cluster: Any) -> None:
    from streamd.eventlog.log import EventLog

    url = postgres_cluster.url("postgres").replace("streamd@", f"streamd:{SECRET}@")
    with trio.fail_after(10):
        async with EventLog(url) as log:
            assert SECRET not in log.where and "streamd@" in log.where
            with pytest.raises(RpcError) as info:
                await log.ping()
    assert info.value.code == SOURCE_UNAVAILABLE
    assert "process list" in info.value.message and SECRET not in info.value.message


async def test_a_lease_stolen_by_another_host_is_reported_lost_to_its_holder(
    postgres_cluster: Any,
    postgres_db: str,
) -> None:
    from streamd.eventlog.log import EventLog

    url = postgres_cluster.url(psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"])
    lost = trio.Event()

    async def on_lost(lease: Any) -> None:
        lost.set()

    with trio.fail_after(20):
        async with EventLog(url) as host_a, EventLog(url) as host_b:
            lease = await host_a.acquire_lock(
                "app", "u", "s", stale_after_ms=150, heartbeat_ms=50, on_lost=on_lost
            )
            with pytest.raises(RpcError) as info:
                await host_b.acquire_lock("app", "u", "s")
            assert info.value.code == SESSION_LOCKED
            # Host A stops being able to keep its promise (its window shrinks to
            # nothing, by hand): by the database's clock it is stale at once.
            with psycopg.connect(postgres_db, autocommit=True) as db:
                db.execute("UPDATE streamd.leases SET stale_after_ms = 0")
            taken = await host_b.acquire_lock("app", "u", "s")
            await lost.wait()
            assert lease.lost.is_set() and taken.holder != lease.holder
            assert [x.holder for x in await host_b.list_locks()] == [taken.holder]


# --- polling: the first poll is a wake ---------------------------------------------------


async def test_a_commit_before_the_first_poll_wakes_a_listener_that_could_not_listen(
    postgres_db: str,
    open_store: Callable[..., PostgresStore],
) -> None:
    # LISTEN fails at entry (here: a database that does not exist), so it polls
    # from the start. The log's confirmation read came before this commit; the
    # first poll is the only thing that can see it, so it must wake.
    writer = open_store()
    with trio.fail_after(10):
        async with PgChanges(
            postgres_db + " dbname=no_such_database",
            fallback_interval=0.05,
            reconnect_max=0.05,
            poll=lambda: trio.to_thread.run_sync(writer.newest_seq),
        ) as changes:
            assert changes.mode == "poll"
            await trio.to_thread.run_sync(lambda: writer.append_batch([ap("e1")], T0))
            await changes.wait()
            assert changes.mode == "poll"


async def test_a_listener_away_tries_to_listen_again_when_every_wait_is_cut_short(
    postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The log waits on its change source for at most SAFETY_POLL at a time, as
    # long as the backoff's cap: the time of the next LISTEN must survive a
    # wait() cut short, or the listener would poll forever after an outage.
    # Scaled down 50x (cap 0.1 s, each wait cut at 0.1 s), on the real clock,
    # because the refused connection runs in a thread. The count, not the
    # time, is the verdict: waits that restart the backoff stop trying after
    # the ramp to the cap (about five), however many waits follow, while a
    # kept schedule goes on trying; a slow machine only needs more waits.
    attempts = 0

    def refuse(self: PgChanges) -> Any:
        nonlocal attempts
        attempts += 1
        raise psycopg.OperationalError("the server is away")

    monkeypatch.setattr(PgChanges, "_connect_and_listen", refuse)

    async def unchanged() -> int:
        return 7

    with trio.fail_after(120):
        async with PgChanges(
            postgres_db, fallback_interval=0.01, reconnect_max=0.1, poll=unchanged
        ) as changes:
            for _ in range(600):
                if attempts >= 15:
                    break
                with trio.move_on_after(0.1):
                    await changes.wait()
    assert attempts >= 15


# --- one channel per schema ------------------------------------------------------------


async def test_a_commit_in_one_schema_does_not_wake_the_listener_of_another(
    postgres_db: str,
    open_store: Callable[..., PostgresStore],
) -> None:
    from streamd.eventlog.postgres.schema import notify_channel

    other = 'other "log"; x'  # quoting matters: a quote, a space, a semicolon
    assert notify_channel("streamd") == NOTIFY_CHANNEL
    assert notify_channel(other) != NOTIFY_CHANNEL
    assert len(notify_channel("s" * 63).encode()) < 64
    assert notify_channel("s" * 63) != notify_channel("s" * 62 + "t")
    default, second = open_store(), open_store(schema=other)
    with trio.fail_after(20):
        async with (
            PgChanges(postgres_db, fallback_interval=0.2) as a,
            PgChanges(
                postgres_db, fallback_interval=0.2, options=PostgresOptions(schema=other)
            ) as b,
        ):
            assert a.mode == b.mode == "listen"
            await trio.to_thread.run_sync(lambda: second.append_batch([ap("in-b")], T0))
            await b.wait()  # the real wake, on its own channel
            assert b.newest_notified == 1
            with trio.move_on_after(0.3) as quiet:
                await a.wait()
            assert quiet.cancelled_caught, "a commit in another schema woke this log"
            await trio.to_thread.run_sync(lambda: default.append_batch([ap("in-a")], T0))
            await a.wait()
            assert a.newest_notified == 1
            with trio.move_on_after(0.3) as quiet:
                await b.wait()
            assert quiet.cancelled_caught, "a commit in another schema woke this log"


# --- a server that does not answer -------------------------------------------------------


@contextlib.contextmanager
def stopped(pid: int, most: float = 15.0) -> Iterator[None]:
    """The server process ``pid`` stopped (SIGSTOP) for the block, and at most
    ``most`` seconds whatever the code under test does: continued in a finally,
    so the cluster can always stop."""
    os.kill(pid, signal.SIGSTOP)
    watchdog = threading.Timer(most, os.kill, (pid, signal.SIGCONT))
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        os.kill(pid, signal.SIGCONT)


async def test_a_cancelled_call_on_a_stopped_server_returns_and_the_next_call_reconnects(
    postgres_db: str,
) -> None:
    runner = await PostgresRunner.open(postgres_db, PostgresOptions(unresponsive_s=0.5))
    try:
        pid = runner.store.connection.info.backend_pid
        with stopped(pid):
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
            with stopped(pid):
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


# --- passwords: STREAMD_DB may hold one, --db may not ----------------------------------


def test_streamd_db_may_hold_a_password_for_the_log_commands(
    postgres_cluster: Any,
    postgres_db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from streamd.eventlog.cli import main as log_main

    name = psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"]
    # The cluster trusts the socket, so the password is ignored; it must still
    # never show.
    url = postgres_cluster.url(name).replace("streamd@", f"streamd:{SECRET}@")
    monkeypatch.setenv("STREAMD_DB", url)
    assert (
        log_main(
            [
                "append",
                "--app",
                "a",
                "--user",
                "u",
                "--session",
                "s",
                "--author",
                "me",
                "--text",
                "hello",
                "--id",
                "e1",
            ]
        )
        == 0
    )
    assert log_main(["since", "--app", "a"]) == 0
    assert log_main(["ping"]) == 0
    out, err = capsys.readouterr()
    assert "hello" in out
    assert SECRET not in out and SECRET not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--db", "{url}", "serve"],
        ["serve", "--db", "{url}"],
        ["daemon", "--db", "{url}"],
        ["log", "--db", "{url}", "ping"],
        ["--db", "{url}", "log", "ping"],
        ["serve", "--db", "{query_url}"],
    ],
)
def test_a_password_in_db_is_refused_as_the_command_line_is_read(
    argv: list[str],
    tmp_path: Path,
) -> None:
    url = f"postgresql://streamd:{SECRET}@/x?host=/nowhere"
    query_url = f"postgresql://streamd@/x?host=/nowhere&password={SECRET}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(tmp_path),
    }
    env.pop("STREAMD_DB", None)
    done = subprocess.run(
        [sys.executable, "-m", "streamd", *(a.format(url=url, query_url=query_url) for a in argv)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "--db holds a password" in lines[0]
    assert "process list" in lines[0] and SECRET not in done.stderr


# --- the in-memory filter agrees with the SQL on PostgreSQL --------------------------------

_SEPS = st.sampled_from([".", "/", ":sub:", ":sub;", ""])


def _joined_text() -> st.SearchStrategy[str]:
    # Values with the boundaries the rules turn on: a branch segment, a session
    # tree child, and the bytes next to them.
    return st.one_of(_text, st.builds(lambda a, s, b: a + s + b, _text, _SEPS, _text))


_pg_rows = st.lists(st.tuples(_text, _text, _joined_text(), _joined_text(), _text), max_size=25)


@pytest.fixture
def filter_db(postgres_db: str) -> Iterator[tuple[psycopg.Connection[Any], PostgresStore]]:
    admin = psycopg.connect(postgres_db, autocommit=True)
    admin.execute("SET search_path = streamd")
    store = PostgresStore.open(postgres_db)
    yield admin, store
    store.close()
    admin.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), rows=_pg_rows)
def test_the_in_memory_match_agrees_with_since_on_postgres(
    filter_db: tuple[psycopg.Connection[Any], PostgresStore],
    data: st.DataObject,
    rows: list[tuple[str, str, str, str, str]],
) -> None:
    admin, store = filter_db
    flt = data.draw(st.none() | _filters(rows))
    if flt is not None and rows and data.draw(st.booleans()):
        # A suffix longer than some author (short authors with a suffix).
        author = data.draw(st.sampled_from([r[4] for r in rows]))
        flt = msgspec.structs.replace(flt, author_suffix=data.draw(_ALPHABET) + author)
    with admin.transaction():
        admin.execute("TRUNCATE events, sessions")
        admin.cursor().executemany(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
            " updated_at) VALUES (%s, %s, %s, '{}', 0, 0) ON CONFLICT DO NOTHING",
            list(dict.fromkeys(r[:3] for r in rows)),
        )
        admin.cursor().executemany(
            "INSERT INTO events (seq, app_name, user_id, session_id, event_id, invocation_id,"
            " author, branch, event_time, content, digest) VALUES"
            " (%s, %s, %s, %s, %s, '', %s, %s, 0, 'null', '')",
            [
                (i + 1, app, user, session, f"e{i}", author, branch)
                for i, (app, user, session, branch, author) in enumerate(rows)
            ],
        )
    in_memory = [i + 1 for i, row in enumerate(rows) if filters.matches(flt, _Row(row))]
    assert [
        e.seq for e in store.since(SinceParams(from_seq=0, filter=flt, limit=1000)).entries
    ] == in_memory
    assert store.latest_seq(flt) == (in_memory[-1] if in_memory else 0)


def test_filters_spell_each_rule_in_the_dialect_asked_for() -> None:
    # One set of rules, two spellings: a conjunct written in SQLite's spelling
    # only would fail here instead of silently on PostgreSQL.
    flt = Filter(
        session_tree=SessionTree(app="a", user="u", parent="p"),
        branch_prefixes=["x"],
        author="me",
        author_suffix="é/x",
    )
    for dialect, param in ((filters.POSTGRES, "%s"), (filters.SQLITE, "?")):
        clauses = filters.where(flt, dialect)
        other = "?" if param == "%s" else "%s"
        assert all(other not in text for text, _ in clauses)
        assert sum(text.count(param) for text, _ in clauses) == sum(len(a) for _, a in clauses)
    assert filters.where(flt) == filters.where(flt, filters.SQLITE)
    assert filters.where(Filter(branch_prefixes=[""]), filters.POSTGRES) == [("false", ())]
    assert filters.where(Filter(author_suffix="é/x"), filters.POSTGRES) == [
        ("right(author, %s) = %s", (3, "é/x"))
    ]
