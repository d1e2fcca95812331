"""What the PostgreSQL backend promises beyond the contract tests it shares
with SQLite (``tests/eventlog/test_store*.py``): commit-ordered seq under writers
on several connections, leases judged by the database's clock, a LISTEN wake
per committed batch (and polling where a listener cannot listen), one channel
per schema, the Trio runner's cancellation. Outages, credentials, several
hosts and the filters' SQL have files of their own (``test_postgres_*.py``).
Every test here needs a cluster (``postgres_cluster`` in conftest.py) and is
skipped, loudly, where none can be started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from support.commit_order import race_writers_and_a_reader
from support.frozen import unanswered_listener
from support.postgres_store import HOUR, KEY, T0, ap

from streamd.errors import SESSION_LOCKED, SESSION_NOT_FOUND, RpcError, is_closed
from streamd.eventlog.model import (
    LeaseAcquireParams,
    RetentionPolicy,
    to_us,
)
from streamd.eventlog.postgres.changes import PgChanges
from streamd.eventlog.postgres.runner import PostgresRunner
from streamd.eventlog.postgres.schema import NOTIFY_CHANNEL
from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore
from streamd.eventlog.store import AppendGroup

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


def test_an_event_id_postgres_cannot_hold_fails_alone_in_its_batch(
    open_store: Callable[..., PostgresStore],
) -> None:
    # The batch's duplicate lookup sent every id to the server, and one with
    # U+0000 failed the whole transaction: every other client's appends too.
    store = open_store()
    out = store.append_commit([ap("a1"), ap("bad\x00id"), ap("a2")], T0, capture=False)
    refused = out.results[1]
    assert isinstance(refused, RpcError) and refused.code == -32602
    assert "U+0000" in refused.message
    assert [r.seq for r in (out.results[0], out.results[2])] == [1, 2]
    assert store.newest_seq() == 2
    # In a group, the refusal says which member, and that none was written.
    group = AppendGroup(appends=[ap("g0"), ap("g1\x00"), ap("g2")])
    (refused,) = store.append_commit([group], T0, capture=False).results
    assert isinstance(refused, RpcError) and refused.code == -32602
    assert refused.message.startswith("append 1 of the batch: ")
    assert refused.message.endswith("; nothing of the batch was written")
    assert isinstance(refused.data, dict) and refused.data["index"] == 1
    assert store.newest_seq() == 2


def test_a_lease_or_a_policy_postgres_cannot_hold_is_refused_as_an_event_is(
    open_store: Callable[..., PostgresStore],
) -> None:
    # Sent, the server refused the parameter and the write answered -32000,
    # as if the database were down. (SQLite and MySQL store it.)
    store = open_store()
    with pytest.raises(RpcError) as lease:
        store.acquire_lease(LeaseAcquireParams(app="app", user="u", session="s\x00"), "me", T0)
    assert lease.value.code == -32602 and "session contains U+0000" in lease.value.message
    with pytest.raises(RpcError) as policy:
        store.set_retention(RetentionPolicy(app="a\x00", max_events=1), T0)
    assert policy.value.code == -32602 and "app contains U+0000" in policy.value.message
    store.set_retention(RetentionPolicy(app="a\x00"), T0)  # removing it: there is none
    assert store.list_leases() == [] and store.retention_policies() == []


async def test_reads_naming_u0000_over_the_wire_answer_as_for_an_absent_name(
    postgres_cluster: Any, postgres_db: str
) -> None:
    # What a client saw: -32000 (source_unavailable) for a read of a session
    # that cannot exist. The store contract holds every read to this
    # (test_store_nul.py); here the daemon's methods answer it.
    from support.service import Daemonish, _server

    from streamd.eventlog.log import EventLog

    url = postgres_cluster.url(psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"])
    key = {"app": "app", "user": "u", "session": "s\x00"}
    with trio.fail_after(20):
        async with EventLog(url) as log, trio.open_nursery() as nursery:
            client = await Daemonish(log, nursery, _server(lambda: log)).connect()
            await client.result("eventlog/append", {**key, "session": "s", "event": {
                "id": "e1", "author": "agent", "content": None}})
            for method, params in [("eventlog/sessions.get", key), ("eventlog/state.get", key)]:
                error = await client.error(method, params)
                assert error["code"] == SESSION_NOT_FOUND, (method, error)
            flt = {"filter": {"session": "s\x00"}}
            assert (await client.result("eventlog/since", flt))["entries"] == []
            assert (await client.result("eventlog/latest_seq", flt))["seq"] == 0
            listed = await client.result("eventlog/sessions.list", {"app": "app", "user": "u\x00"})
            assert listed["sessions"] == []
            nursery.cancel_scope.cancel()


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


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_call(
    postgres_db: str,
    open_store: Callable[..., PostgresStore],
) -> None:
    # A server restarted, or its idle_session_timeout, closes a connection the
    # driver still takes for open: the next call failed on it ("lost the
    # connection ... a write in flight"). Checked after every idle moment here.
    store = open_store(idle_check_s=0.0)
    assert store.append(ap("before"), T0).seq == 1
    with psycopg.connect(postgres_db, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert ended and all(ok for (ok,) in ended)
    assert store.append(ap("after"), T0).seq == 2


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


async def test_a_listener_left_connecting_is_not_waited_for_and_its_connection_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that accepts and never answers held the listener's connect,
    # and so the close of the log watching it, for the whole connect timeout
    # (for ever with none). Now the close leaves the connect to its thread,
    # which closes the connection it makes: nobody is there to take it.
    let_go, closed = threading.Event(), threading.Event()

    class Made:
        def close(self) -> None:
            closed.set()

    def connecting(self: PgChanges) -> Any:
        assert let_go.wait(30), "the test never let the connect end"
        return Made()

    monkeypatch.setattr(PgChanges, "_connect_and_listen", connecting)
    with trio.fail_after(10), trio.CancelScope() as scope:
        scope.deadline = trio.current_time() + 0.1
        async with PgChanges("host=/nowhere dbname=events", fallback_interval=0.05):
            pass
    assert scope.cancelled_caught and not closed.is_set()
    let_go.set()
    assert await trio.to_thread.run_sync(closed.wait, 10)


async def test_a_listener_away_keeps_one_connect_under_way_however_often_its_wait_is_cut_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The log cuts its wait on the change source short every SAFETY_POLL (5 s)
    # to read the newest seq anyway. Before: a cut that came while the
    # listener was connecting to a server that never answers left that
    # connect to its thread, and the next wait started another: one thread
    # more each cut, until the 16 connects the process leaves running were
    # all this watch's, and every open of every log in the process was refused.
    # Scaled down 50x on the real clock (the connects run in threads); the
    # count is the verdict: one attempt, never ending, however many cuts.
    from streamd.eventlog import handoff

    left = handoff.LeftRunning()
    monkeypatch.setattr(handoff, "left_running", left)
    frozen, unanswered = threading.Event(), threading.Event()
    connects = 0

    def connect(self: PgChanges) -> Any:
        nonlocal connects
        connects += 1
        if connects == 1:
            raise psycopg.OperationalError("refused at entry")
        unanswered.set()
        assert frozen.wait(30), "the test never thawed the server"
        raise psycopg.OperationalError("the server gave up")

    monkeypatch.setattr(PgChanges, "_connect_and_listen", connect)

    async def unchanged() -> int:
        return 7

    try:
        with trio.fail_after(60):
            async with PgChanges("host=/nowhere dbname=events", fallback_interval=0.01,
                                 reconnect_max=0.05, poll=unchanged) as changes:
                async def cut_short() -> None:
                    with trio.move_on_after(0.1):  # as the log's safety poll does
                        await changes.wait()

                # The cuts that count come once the unanswered attempt is
                # under way, however late a loaded machine starts it.
                while not unanswered.is_set():
                    await cut_short()
                for _ in range(20):
                    await cut_short()
                assert changes.mode == "poll"
                assert connects == 2 and left.count == 0  # the one attempt, still its own
    finally:
        frozen.set()


async def test_a_listener_whose_first_connect_goes_unanswered_polls_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: entering waited for the first connect, for the whole connect
    # timeout (for ever with connect_timeout=0): the log's watches heard no
    # other host's commit meanwhile, not even by polling.
    frozen = unanswered_listener(monkeypatch)
    newest = 7

    async def poll() -> int:
        return newest

    try:
        with trio.fail_after(10):
            async with PgChanges("host=/nowhere dbname=events", fallback_interval=0.01,
                                 reconnect_max=0.1, poll=poll) as changes:
                assert changes.mode == "poll" and changes.attempts.attempt_s() is not None
                await changes.wait()  # the first poll: a commit may have come before it
                newest = 8  # another host commits
                await changes.wait()
                assert changes.attempts.attempt_s() is not None  # the connect goes on
    finally:
        frozen.set()


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


def test_the_servers_words_keep_their_hint_and_lose_the_quoted_statement() -> None:
    # libpq quotes our statement in its errors ("LINE 1: ...", a caret under
    # it): ours, never the caller's, and it cut a one-line error in odd places.
    from streamd.eventlog.postgres.store import _without_statement

    said = ('relation "events" does not exist\nLINE 1: SELECT seq FROM events WHE...\n'
            "                              ^\nHINT:  Perhaps you meant to reference \"event\".")
    assert _without_statement(said) == (
        'relation "events" does not exist\nHINT:  Perhaps you meant to reference "event".')
    assert _without_statement("server closed the connection unexpectedly") == (
        "server closed the connection unexpectedly")
