"""What the MySQL backend promises beyond the contract tests it shares with
SQLite and PostgreSQL (tests/eventlog/test_store*.py): commit-ordered seq under
writers on several connections, text stored and compared as it is sent (4-byte
characters, code-point order, nothing cut), leases on the database's clock,
migrations serialized between openers, a wake by polling that backs off,
outages that lose no acknowledged append, credentials that never show. Every
test here needs the MariaDB server of ``mysql_server`` (conftest.py) and is
skipped, loudly, where none can be started (a failure with ``CI=true``).
"""

from __future__ import annotations

import itertools
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import MySQLdb
import pytest
import trio
import trio.testing
from support.commit_order import race_writers_and_a_reader
from support.frozen import freeze
from support.hosts import Host, append_params
from support.mysql_store import T0, ap

from streamd.errors import INVALID_PARAMS, SESSION_LOCKED, SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.model import (
    Event,
    LeaseAcquireParams,
    SessionCreateParams,
    SessionGetParams,
    SinceParams,
)
from streamd.eventlog.mysql.changes import PolledChanges
from streamd.eventlog.mysql.runner import MysqlRunner
from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore

REPO = Path(__file__).resolve().parents[2]


def raw(url: str) -> Any:
    """A connection of its own, behind the stores' backs."""
    from streamd.eventlog.mysql.url import connect_kwargs, parse

    return MySQLdb.connect(**connect_kwargs(parse(url)), autocommit=True)


# --- commit-ordered seq ---------------------------------------------------------------


def test_a_reader_never_sees_a_seq_before_every_lower_seq_is_visible(
    open_mysql_store: Callable[..., MysqlStore],
) -> None:
    writers = [open_mysql_store() for _ in range(4)]
    reads = race_writers_and_a_reader(
        writers, open_mysql_store(), lambda i, s: ap(i, session=s), T0)
    assert reads > 1, "the reader must have raced the writers"


def test_each_batch_commits_as_one_run_of_seqs_even_with_two_writers(
    open_mysql_store: Callable[..., MysqlStore],
) -> None:
    a, b = open_mysql_store(), open_mysql_store()
    first = a.append_commit([ap("a1"), ap("a2")], T0, capture=False)
    second = b.append_commit([ap("b1"), ap("a1"), ap("b2")], T0, capture=True)
    assert (first.before_seq, first.after_seq) == (0, 2)
    assert (second.before_seq, second.after_seq) == (2, 4)
    assert second.results[1].duplicate  # a1 was committed by the other writer
    assert [c.seq for c in second.entries or []] == [3, 4]
    assert a.newest_seq() == b.newest_seq() == 4


# --- text and order ---------------------------------------------------------------------


def test_four_byte_characters_round_trip_and_keys_compare_as_code_points(
    open_mysql_store: Callable[..., MysqlStore],
) -> None:
    store = open_mysql_store()
    emoji = "\U0001f680 naïve 𝔘"
    store.append(ap("e-\U0001f600", session=emoji, content={"t": emoji}, branch="b.\U0001f600"),
                 T0)
    # Trailing spaces are part of a key (utf8mb4_bin would pad them away).
    store.append(ap("e2", session="x"), T0)
    store.append(ap("e3", session="x ", branch="b.z"), T0)
    store.append(ap("e4", session="x", branch="b.é"), T0)
    got = store.get_session(SessionGetParams(app="app", user="u", session=emoji))
    assert [e.event.id for e in got.events] == ["e-\U0001f600"]
    assert got.events[0].event.content == {"t": emoji}
    plain = store.get_session(SessionGetParams(app="app", user="u", session="x"))
    assert [e.event.id for e in plain.events] == ["e2", "e4"]
    # Code-point order is UTF-8 byte order: 'z' (7A) < 'é' (C3 A9) < U+1F600.
    assert store.branches(None, None) == ["b.z", "b.é", "b.\U0001f600"]


def test_a_key_longer_than_its_column_is_refused_naming_the_field_and_nothing_is_cut(
    open_mysql_store: Callable[..., MysqlStore],
) -> None:
    store = open_mysql_store()
    with pytest.raises(RpcError) as info:
        store.append(ap("e1", session="s" * 256), T0)
    assert info.value.code == INVALID_PARAMS and "session is 256 characters" in info.value.message
    with pytest.raises(RpcError) as branch:
        store.append(ap("e2", branch="b" * 513), T0)
    assert branch.value.code == INVALID_PARAMS and "event.branch" in branch.value.message
    with pytest.raises(RpcError) as created:
        store.create_session(SessionCreateParams(app="app", user="u", session="s" * 300), T0)
    assert created.value.code == INVALID_PARAMS and "session_id" in created.value.message
    assert store.since(SinceParams(from_seq=0)).entries == []
    # At the limit, whole.
    store.append(ap("e3", session="s" * 255), T0)
    (entry,) = store.since(SinceParams(from_seq=0)).entries
    assert entry.session == "s" * 255


# --- leases ------------------------------------------------------------------------------


def test_lease_staleness_is_judged_by_the_databases_clock_not_the_callers(
    open_mysql_store: Callable[..., MysqlStore],
) -> None:
    a, b = open_mysql_store(), open_mysql_store()
    db_now = a.database_now_us()
    assert abs(db_now - time.time() * 1_000_000) < 60 * 1_000_000
    p = LeaseAcquireParams(app="app", user="u", session="s", stale_after_ms=60_000)
    # The callers' clocks are a day apart; the database's clock decides.
    a.acquire_lease(p, "host-a", now_us=0)
    with pytest.raises(RpcError) as info:
        b.acquire_lease(p, "host-b", now_us=db_now + 86_400 * 1_000_000)
    assert info.value.code == SESSION_LOCKED and info.value.data["holder"] == "host-a"
    assert a.heartbeat_lease("app", "u", "s", "host-a", now_us=0)
    assert not b.heartbeat_lease("app", "u", "s", "host-b", now_us=0)


# --- the schema ---------------------------------------------------------------------------


def test_openers_that_start_at_once_leave_one_schema_at_the_current_version(mysql_db: str) -> None:
    stores: list[MysqlStore] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_() -> None:
        try:
            start.wait()
            stores.append(MysqlStore.open(mysql_db))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors and len(stores) == 4
        conn = raw(mysql_db)
        cur = conn.cursor()
        cur.execute("SELECT version FROM streamd_meta")
        # Version 2 added the deletion signal (removed_events), version 3 the
        # row deleters lock so that its marks commit in order (removal_order),
        # version 4 an app's events by time (events_by_app_time), version 5
        # events by author (events_by_author).
        assert cur.fetchall() == ((5,),)
        cur.execute("SELECT count(*) FROM seq_counter")
        assert cur.fetchall() == ((1,),)
        cur.execute("SELECT count(*) FROM removal_order")
        assert cur.fetchall() == ((1,),)
        conn.close()
    finally:
        for s in stores:
            s.close()


def test_a_database_holding_someone_elses_tables_is_refused_untouched(mysql_db: str) -> None:
    conn = raw(mysql_db)
    conn.cursor().execute("CREATE TABLE invoices (id INT PRIMARY KEY)")
    with pytest.raises(RpcError) as info:
        MysqlStore.open(mysql_db)
    assert info.value.code == SOURCE_UNAVAILABLE and "invoices" in info.value.message
    cur = conn.cursor()
    cur.execute("SHOW TABLES")
    assert cur.fetchall() == (("invoices",),)
    conn.close()


# --- the wake --------------------------------------------------------------------------------


async def test_polling_backs_off_while_idle_and_wakes_on_a_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    newest = [0]
    polled: list[float] = []

    async def poll() -> int:
        polled.append(trio.current_time())
        return newest[0]

    async with PolledChanges(poll, floor=0.002, ceiling=0.05) as changes:
        start = trio.current_time()
        await changes.wait()  # the first poll wakes whatever it reads
        assert polled == [pytest.approx(start + 0.002)]
        with trio.move_on_after(1):
            await changes.wait()  # nothing moves: from 2 ms after a wake, doubling to 50
        gaps = [round(b - a, 4) for a, b in itertools.pairwise(polled)]
        assert gaps[:6] == [0.002, 0.004, 0.008, 0.016, 0.032, 0.05]
        assert set(gaps[6:]) == {0.05}
        newest[0] = 7
        before = trio.current_time()
        await changes.wait()
        assert trio.current_time() - before <= 0.05 + 1e-9
        changes.expect_commit()
        assert changes.interval == 0.002


async def test_a_failed_poll_is_followed_by_a_wake_once_the_server_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers: list[int | RpcError] = [3, RpcError(SOURCE_UNAVAILABLE, "down"), 3]

    async def poll() -> int:
        got = answers.pop(0) if answers else 3
        if isinstance(got, RpcError):
            raise got
        return got

    async with PolledChanges(poll) as changes:
        await changes.wait()
        # The same seq as before the failure, yet a wake: a commit may have
        # come and gone unseen while the server was away.
        with trio.fail_after(1):
            await changes.wait()
        assert answers == []


# --- cancellation and outages ------------------------------------------------------------


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_call(
    mysql_db: str, open_mysql_store: Callable[..., MysqlStore]
) -> None:
    # wait_timeout, or a restart, closes a connection the driver still holds:
    # the next call failed on it. Checked after every idle moment here.
    store = open_mysql_store(idle_check_s=0.0)
    assert store.append(ap("before"), T0).seq == 1
    admin = raw(mysql_db)
    try:
        admin.query("SELECT id FROM information_schema.processlist"
                    " WHERE db = DATABASE() AND id <> CONNECTION_ID()")
        ids = [row[0] for row in admin.store_result().fetch_row(maxrows=0)]
        assert ids
        for conn_id in ids:
            admin.query(f"KILL {int(conn_id)}")
    finally:
        admin.close()
    assert store.append(ap("after"), T0).seq == 2


async def test_a_cancelled_append_has_its_statement_killed_and_the_next_call_works(
    mysql_db: str,
) -> None:
    runner = await MysqlRunner.open(mysql_db)
    blocker = raw(mysql_db)
    try:
        await runner.run(lambda s: s.append(ap("first"), T0))
        # Another connection holds the counter's lock: the append waits on it.
        blocker.query("BEGIN")
        blocker.query("SELECT seq FROM seq_counter FOR UPDATE")
        blocker.store_result()
        with trio.fail_after(20):
            with trio.move_on_after(0.5) as scope:
                await runner.run(lambda s: s.append(ap("blocked"), T0))
            assert scope.cancelled_caught
        blocker.query("ROLLBACK")
        with trio.fail_after(20):
            assert (await runner.run(lambda s: s.append(ap("after"), T0))).seq == 2
            ids = [e.event.id for e in (await runner.run(
                lambda s: s.since(SinceParams(from_seq=0)))).entries]
        assert ids == ["first", "after"]
    finally:
        blocker.close()
        await runner.aclose()


@pytest.fixture
def own_server() -> Iterator[Any]:
    """A server of this test's own, to crash."""
    from support import mariadb_server

    try:
        server = mariadb_server.start()
    except mariadb_server.Unavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.destroy()


def test_a_crash_of_the_server_loses_no_acknowledged_append_and_errors_are_clear(
    own_server: Any,
) -> None:
    url = own_server.fresh_database()
    store = MysqlStore.open(url, MysqlOptions(reconnect_min_s=0.05, reconnect_max_s=0.2))
    try:
        acked = [store.append(ap(f"e{i}"), T0).seq for i in range(100)]
        own_server.kill()  # SIGKILL: no shutdown, only the redo log
        with pytest.raises(RpcError) as lost:
            store.append(ap("during"), T0)
        assert lost.value.code == SOURCE_UNAVAILABLE and "MySQL database" in lost.value.message
        failing = time.monotonic()
        for _ in range(5):
            with pytest.raises(RpcError) as down:
                store.latest_seq(None)
            assert down.value.code == SOURCE_UNAVAILABLE
        assert time.monotonic() - failing < 2, "calls while down fail at once"
        own_server.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                store.ping()
                break
            except RpcError:
                assert time.monotonic() < deadline, "the store reconnects"
                time.sleep(0.05)
        seqs = [e.seq for e in store.since(SinceParams(from_seq=0, limit=1000)).entries]
        assert seqs[: len(acked)] == acked
        retried = store.append(ap("during"), T0)  # safe whether or not it had committed
        assert retried.seq > acked[-1]
    finally:
        store.close()


# --- credentials -----------------------------------------------------------------------------


def test_a_password_comes_from_mysql_pwd_or_an_option_file_and_never_shows(
    mysql_server: Any, mysql_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from support import mariadb_server

    name = mysql_db.split("/")[3].split("?")[0]
    url = mysql_server.url(name, user=mariadb_server.PASSWORD_USER)
    secret = mariadb_server.PASSWORD
    with pytest.raises(RpcError) as refused:
        MysqlStore.open(url)  # no password given anywhere
    assert refused.value.code == SOURCE_UNAVAILABLE and "Access denied" in refused.value.message
    monkeypatch.setenv("MYSQL_PWD", secret)
    store = MysqlStore.open(url)
    store.append(ap("by-env"), T0)
    store.close()
    monkeypatch.delenv("MYSQL_PWD")
    option_file = tmp_path / "my.cnf"
    option_file.write_text(f"[client]\npassword={secret}\n")
    store = MysqlStore.open(url + f"&read_default_file={option_file}")
    assert store.latest_seq(None) == 1
    assert secret not in store.where
    store.close()
    monkeypatch.setenv("MYSQL_PWD", "wrong" + secret)
    with pytest.raises(RpcError) as wrong:
        MysqlStore.open(url)
    assert secret not in wrong.value.message and "Access denied" in wrong.value.message
    assert secret not in caplog.text


# --- two daemons, one log -------------------------------------------------------------------


async def test_two_daemons_on_two_hosts_share_one_log(
    mysql_db: str, tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        a = await Host.start(mysql_db, tmp_path / "host-a")
        b = await Host.start(mysql_db, tmp_path / "host-b")
        try:
            watch = await a.send("eventlog/watch", {"from_seq": 0})
            first = await b.call("eventlog/append", append_params("from-b"))
            assert first["result"] == {"seq": 1, "duplicate": False}
            # A's watcher hears B's commit by polling the newest seq.
            entry = await a.note("eventlog/entry")
            assert entry["params"]["watch"] == watch
            assert entry["params"]["entry"]["event"]["id"] == "from-b"
            second = await a.call("eventlog/append", append_params("from-a"))
            assert second["result"]["seq"] == 2
            got = await b.call("eventlog/since", {"from_seq": 0})
            assert [e["event"]["id"] for e in got["result"]["entries"]] == ["from-b", "from-a"]
            again = await b.call("eventlog/append", append_params("from-a"))
            assert again["result"] == {"seq": 2, "duplicate": True}
            lock = await a.call(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "s"}
            )
            assert "lock" in lock["result"]
            taken = await b.call(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "s"}
            )
            assert taken["error"]["code"] == SESSION_LOCKED
            assert not list((tmp_path / "host-a").rglob("*.db"))
            assert not list((tmp_path / "host-b").rglob("*.db"))
        finally:
            for host in (a, b):
                with trio.move_on_after(10):
                    await host.stop()
                if host.proc.returncode is None:
                    host.proc.kill()


def test_the_eventlog_conformance_suite_passes_on_mysql(
    mysql_server: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    from streamd import conformance

    suite = REPO / "conformance" / "eventlog"
    cases = len(conformance.discover_cases(suite))
    adapter = shlex.join([
        sys.executable, str(REPO / "tests" / "support" / "mariadb_server.py"), "adapter",
        str(mysql_server.socket),
    ])
    assert conformance.main(["verify", str(suite), "--adapter", adapter]) == 0, (
        capsys.readouterr().out
    )
    assert f"{cases} passed, 0 failed" in capsys.readouterr().out


async def test_a_lease_stolen_by_another_host_is_reported_lost_to_its_holder(
    mysql_db: str,
) -> None:
    from streamd.eventlog.log import EventLog

    lost = trio.Event()

    async def on_lost(lease: Any) -> None:
        lost.set()

    with trio.fail_after(20):
        async with EventLog(mysql_db) as host_a, EventLog(mysql_db) as host_b:
            lease = await host_a.acquire_lock(
                "app", "u", "s", stale_after_ms=150, heartbeat_ms=50, on_lost=on_lost
            )
            with pytest.raises(RpcError) as info:
                await host_b.acquire_lock("app", "u", "s")
            assert info.value.code == SESSION_LOCKED
            # Host A's window shrinks to nothing, by hand: by the database's
            # clock its lease is stale at once, and B takes it.
            conn = raw(mysql_db)
            conn.cursor().execute("UPDATE leases SET stale_after_ms = 0")
            conn.close()
            taken = await host_b.acquire_lock("app", "u", "s")
            await lost.wait()
            assert lease.lost.is_set() and taken.holder != lease.holder
            assert [x.holder for x in await host_b.list_locks()] == [taken.holder]


def test_a_password_in_streamd_db_works_for_the_log_commands_and_never_shows(
    mysql_server: Any, mysql_db: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from urllib.parse import quote

    from support import mariadb_server

    from streamd.eventlog.cli import main as log_main

    name = mysql_db.split("/")[3].split("?")[0]
    secret = mariadb_server.PASSWORD  # holds ? # and &: written %-escaped in a URL
    url = mysql_server.url(name, user=mariadb_server.PASSWORD_USER).replace(
        "@/", f":{quote(secret, safe='')}@/"
    )
    monkeypatch.setenv("STREAMD_DB", url)
    append = ["append", "--app", "a", "--user", "u", "--session", "s", "--author", "me",
              "--text", "hello", "--id", "e1"]
    assert log_main(append) == 0
    assert log_main(["since", "--app", "a"]) == 0
    assert log_main(["ping"]) == 0
    out, err = capsys.readouterr()
    assert "hello" in out and "ok: mysql://streamd_pw@/" in out
    assert secret not in out + err and quote(secret, safe="") not in out + err
    # On the command line the same URL is refused before anything runs.
    monkeypatch.delenv("STREAMD_DB")
    assert log_main(["--db", url, "ping"]) == 2
    _, err = capsys.readouterr()
    assert "MYSQL_PWD" in err and secret not in err and quote(secret, safe="") not in err


async def test_a_cancelled_call_on_a_stopped_server_returns_and_the_next_call_reconnects(
    mysql_server: Any, mysql_db: str,
) -> None:
    import os
    import signal

    runner = await MysqlRunner.open(mysql_db, MysqlOptions(unresponsive_s=0.5))
    try:
        await runner.run(lambda s: s.append(ap("first"), T0))
        pid = mysql_server.proc.pid
        freeze(pid)  # a server that no longer answers at all
        try:
            started = time.monotonic()
            with trio.fail_after(20):
                with trio.move_on_after(0.2) as scope:
                    await runner.run(lambda s: s.newest_seq())
            assert scope.cancelled_caught
            # Neither the statement nor its KILL is answered: the connection
            # is cut after the grace, and the call returns.
            assert time.monotonic() - started < 5
        finally:
            os.kill(pid, signal.SIGCONT)
        with trio.fail_after(30):
            assert await runner.run(lambda s: s.newest_seq()) == 1  # a new connection
    finally:
        await runner.aclose()


async def test_close_does_not_hang_on_a_stopped_server_and_the_append_hears_maybe(
    mysql_server: Any, mysql_db: str,
) -> None:
    import os
    import signal

    from streamd.eventlog.log import EventLog

    got: list[BaseException] = []

    async def append_one(log: EventLog) -> None:
        try:
            await log.append("app", "u", "s", Event(id="in-flight", author="agent", content=None))
        except RpcError as exc:
            got.append(exc)

    pid = mysql_server.proc.pid
    with trio.fail_after(30):
        async with EventLog(mysql_db) as log, trio.open_nursery() as nursery:
            await log.append("app", "u", "s", Event(id="first", author="agent", content=None))
            freeze(pid)
            try:
                nursery.start_soon(append_one, log)
                await trio.testing.wait_all_tasks_blocked()
                started = time.monotonic()
                await log.aclose()
                took = time.monotonic() - started
            finally:
                os.kill(pid, signal.SIGCONT)
    assert took < 6, f"close took {took:.1f} s with the server stopped"
    (error,) = got
    assert isinstance(error, RpcError) and error.code == SOURCE_UNAVAILABLE
    assert "may or may not have committed" in error.message
    store = MysqlStore.open(mysql_db)
    try:
        assert store.append(ap("in-flight"), T0).seq == 2  # whatever it came to, safe
    finally:
        store.close()


def test_durability_and_size_are_the_servers(
    open_mysql_store: Callable[..., MysqlStore], mysql_server: Any,
) -> None:
    store = open_mysql_store(synchronous="NORMAL")  # not applied: the server's setting decides
    # The tests' server writes every commit to disk (innodb_flush_log_at_trx_commit=1).
    assert store.synchronous() == 2
    store.append(ap("e1", content={"t": "x" * 1000}), T0)
    used, free, page = store.pages()
    assert page == 16384 and used > 0 and free >= 0
