"""What the PostgreSQL backend promises beyond the contract tests it shares
with SQLite (tests/test_eventlog_store.py): commit-ordered seq under writers on
several connections, leases judged by the database's clock, a LISTEN wake per
committed batch, outages that lose no acknowledged append, credentials that
never show. Every test here needs a cluster (``postgres_cluster`` in
conftest.py) and is skipped, loudly, where none can be started.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from streamd.errors import SESSION_LOCKED, SOURCE_UNAVAILABLE, RpcError, is_closed
from streamd.eventlog.model import AppendParams, Event, to_us
from streamd.eventlog.pg_changes import PgChanges
from streamd.eventlog.pg_runner import PostgresRunner
from streamd.eventlog.store import AppendGroup
from streamd.eventlog.store.pg_schema import NOTIFY_CHANNEL
from streamd.eventlog.store.postgres import PostgresOptions, PostgresStore, describe

T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
HOUR = 3600 * 1_000_000
KEY = ("app", "u", "s")


def ap(event_id: str, session: str = "s", content: Any = None) -> AppendParams:
    return AppendParams(
        app="app", user="u", session=session,
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
    # Four writers on four connections append batches as fast as they can while
    # a reader pages with since(). With numbers handed out at insert time (a
    # sequence), a batch that got lower seqs but commits later would show as a
    # gap the reader skips forever; the counter row makes commit order seq order.
    writers, batches, per_batch = 4, 40, 8
    stores = [open_store(synchronous="NORMAL") for _ in range(writers)]
    reader = open_store()
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            start.wait()
            for b in range(batches):
                got = stores[w].append_batch(
                    [ap(f"w{w}-b{b}-{i}", session=f"s{w}") for i in range(per_batch)], T0
                )
                assert all(not isinstance(r, RpcError) for r in got), got
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    start.wait()
    total = writers * batches * per_batch
    seen: list[int] = []
    cursor, reads = 0, 0
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline and not errors:
        page = reader.since(cursor, None, 1000)
        reads += 1
        for e in page.entries:
            # The next entry a reader sees is always the next seq: nothing
            # lower can still appear behind it.
            assert e.seq == cursor + 1, f"saw seq {e.seq} while {cursor + 1} was not visible"
            cursor = e.seq
            seen.append(e.seq)
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen == list(range(1, total + 1))
    assert reads > writers * batches / 4, "the reader must have raced the writers"


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
    open_store: Callable[..., PostgresStore], postgres_db: str,
) -> None:
    host_a, host_b = open_store(), open_store()
    host_a.acquire_lease(*KEY, "a/1/aaaaaaaa", 30_000, T0)
    # Host B's clock runs an hour ahead: by its clock A's heartbeat is an hour
    # old, by the database's it is fresh.
    with pytest.raises(RpcError) as info:
        host_b.acquire_lease(*KEY, "b/2/bbbbbbbb", 30_000, T0 + HOUR)
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
    host_b.acquire_lease(*KEY, "b/2/bbbbbbbb", 30_000, T0 - HOUR)
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
            hosts[i].acquire_lease(*KEY, f"h{i}/1/0000000{i}", 30_000, T0)
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
    open_store: Callable[..., PostgresStore], postgres_db: str,
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
    postgres_db: str, open_store: Callable[..., PostgresStore],
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
    postgres_db: str, open_store: Callable[..., PostgresStore],
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
    import pg_cluster

    cluster = pg_cluster.start()
    yield cluster
    cluster.destroy()


def test_a_crash_of_the_server_loses_no_acknowledged_append_and_errors_are_clear(
    own_cluster: Any,
) -> None:
    conninfo = own_cluster.fresh_database()
    store = PostgresStore.open(conninfo, PostgresOptions(reconnect_min_s=0.05,
                                                         reconnect_max_s=0.2))
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
        assert [e.seq for e in store.since(0, None, 1000).entries][: len(acked)] == acked
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
    import pg_cluster

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
    password_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
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
    password_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(password_db)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        "[streamd-test]\n" + "".join(f"{k}={v}\n" for k, v in params.items())
        + f"password={SECRET}\n"
    )
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    store = PostgresStore.open("service=streamd-test")
    assert store.latest_seq(None) == 0
    assert SECRET not in store.where
    store.close()


def test_a_wrong_password_is_a_clear_error_that_names_no_password(
    password_db: str, caplog: pytest.LogCaptureFixture,
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

REPO = Path(__file__).resolve().parents[1]


class Host:
    """``python -m streamd --db URL`` on stdio, with a state directory (and
    so a default SQLite log, resident socket, ...) of its own: another host, as
    far as the log can tell."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = bytearray()
        self.next_id = 0
        self.notes: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, url: str, home: Path) -> Host:
        home.mkdir()
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HOME": str(home),
               "XDG_STATE_HOME": str(home / "state"), "XDG_RUNTIME_DIR": str(home)}
        env.pop("STREAMD_DB", None)
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamd", "--db", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        )
        return cls(proc)

    async def frame(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while b"\n" not in self.buffer:
            chunk = await self.proc.stdout.receive_some(65536)
            if not chunk:
                raise EOFError("the daemon closed stdout")
            self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        return json.loads(line)

    async def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self.next_id += 1
        await self.proc.stdin.send_all(json.dumps(
            {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        ).encode() + b"\n")
        return self.next_id

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        want = await self.send(method, params)
        while True:
            frame = await self.frame()
            if frame.get("id") == want:
                return frame
            self.notes.append(frame)

    async def note(self, method: str) -> dict[str, Any]:
        while True:
            for i, frame in enumerate(self.notes):
                if frame.get("method") == method:
                    return self.notes.pop(i)
            self.notes.append(await self.frame())

    async def stop(self) -> int:
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()
        return await self.proc.wait()


def _append(event_id: str, session: str = "s") -> dict[str, Any]:
    return {"app": "app", "user": "u", "session": session,
            "event": {"id": event_id, "author": "agent", "content": event_id}}


async def test_two_daemons_on_two_hosts_share_one_log(
    postgres_cluster: Any, postgres_db: str, tmp_path: Path,
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
            lock = await a.call("eventlog/lock.acquire", {"app": "app", "user": "u",
                                                          "session": "s"})
            assert "lock" in lock["result"]
            taken = await b.call("eventlog/lock.acquire", {"app": "app", "user": "u",
                                                           "session": "s"})
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
    postgres_cluster: Any, postgres_db: str, capsys: pytest.CaptureFixture[str],
) -> None:
    # postgres_db made the migrated template the adapter copies for each case.
    from streamd import conformance

    suite = REPO / "conformance" / "eventlog"
    cases = len(conformance.discover_cases(suite))
    adapter = shlex.join([sys.executable, str(REPO / "tests" / "pg_cluster.py"), "adapter",
                          postgres_cluster.conninfo()])
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
    postgres_cluster: Any, postgres_db: str,
) -> None:
    from streamd.eventlog.log import EventLog

    url = postgres_cluster.url(psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"])
    lost = trio.Event()

    async def on_lost(lease: Any) -> None:
        lost.set()

    with trio.fail_after(20):
        async with EventLog(url) as host_a, EventLog(url) as host_b:
            lease = await host_a.acquire_lock("app", "u", "s", stale_after_ms=150,
                                              heartbeat_ms=50, on_lost=on_lost)
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
