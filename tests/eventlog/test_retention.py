"""Retention: per-app policies (maximum age, maximum events per session, idle
sessions) applied by ``compact`` and by the log's background task; nothing a live
lease or an open watch needs is removed, seqs are never given again, and the file
shrinks.

Store-level rules run against every backend (``test_eventlog_store``'s ``fx``);
the Trio layer runs under the mock clock (inline dispatch) where time matters.
"""

from __future__ import annotations

import datetime as dt
import functools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
import trio.testing
from support import store_contract as contract
from support.eventlog import mocked, take, thread_event
from support.server_locks import lock_waits, started, until
from support.service import Daemonish, append
from support.store_contract import SECOND, T0, Fixture, ap, ev

from streamd.errors import RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.model import (
    LeaseAcquireParams,
    RetentionPolicy,
    SessionCreateParams,
    SessionGetParams,
    SinceParams,
    StateDelta,
    from_us,
)
from streamd.eventlog.model.base import MAX_INT
from streamd.eventlog.retention import EARLIEST_US, Bounds, Step, cutoff
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.store.steps import kept_after

DAY = 86_400 * SECOND
B = Bounds()


def at(us: int) -> dt.datetime:
    return from_us(us)


def ids(fx: Fixture) -> list[str]:
    return [e.event.id for e in fx.store.since(SinceParams(from_seq=0, limit=10_000)).entries]


# --- policies ---------------------------------------------------------------------


def test_a_policy_is_set_read_and_removed_per_app(fx: Fixture) -> None:
    fx.store.set_retention(RetentionPolicy(app="a", max_age_s=60, max_events=10), T0)
    fx.store.set_retention(RetentionPolicy(app="b", idle_s=3600), T0)
    fx.store.set_retention(RetentionPolicy(app="a", max_events=5), T0)  # replaces
    assert fx.store.retention_policies() == [
        RetentionPolicy(app="a", max_events=5),
        RetentionPolicy(app="b", idle_s=3600),
    ]
    fx.store.set_retention(RetentionPolicy(app="b"), T0)  # no limits: removed
    assert fx.store.retention_policies("b") == []


# --- each rule -----------------------------------------------------------------------


def test_old_events_go_by_their_timestamp_and_a_leased_session_keeps_all(fx: Fixture) -> None:
    for i, s in enumerate(["s", "s", "leased", "s"]):
        fx.store.append(ap(ev(f"e{i}", timestamp=at(T0 + i * DAY)), session=s), T0)
    fx.store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session="leased", stale_after_ms=30_000),
        "h/1/aaaaaaaa",
        T0 + 3 * DAY,
    )
    now = T0 + 3 * DAY
    assert fx.store.drop_old_events("app", now - DAY, None, now, None, B).events == 2
    assert ids(fx) == ["e2", "e3"]
    # Once the lease is stale (its holder stopped beating), its events may go.
    later = now + 31 * SECOND
    assert fx.store.drop_old_events("app", later - DAY + 2 * DAY, None, later, None, B).events == 2
    assert ids(fx) == []


def test_a_lease_with_the_longest_window_allowed_keeps_its_session_and_fails_nothing(
    fx: Fixture,
) -> None:
    # A window of 2**63 - 1 ms (the params allow it) made "heartbeat + window
    # * 1000" overflow PostgreSQL's and MySQL's bigint: every retention step
    # of the app, and the count of its leased sessions, failed (-32000).
    for i, s in enumerate(["s", "leased", "s"]):
        fx.store.append(ap(ev(f"e{i}", timestamp=at(T0 + i * DAY)), session=s), T0)
    fx.store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session="leased", stale_after_ms=MAX_INT),
        "h/1/aaaaaaaa",
        T0,
    )
    now = T0 + 400 * DAY
    assert fx.store.leased_sessions("app", now) == 1
    assert fx.store.drop_old_events("app", now, None, now, None, B).events == 2
    assert fx.store.trim_sessions("app", 1, None, now, None, B).events == 0
    assert fx.store.drop_idle_sessions("app", now, None, now, None, B).sessions == 1  # "s"
    assert ids(fx) == ["e1"]


def test_each_session_keeps_its_newest_events(fx: Fixture) -> None:
    for i in range(10):
        fx.store.append(ap(ev(f"a{i}"), session="a"), T0)
        fx.store.append(ap(ev(f"b{i}"), session="b"), T0)
    fx.store.append(ap(ev("c0"), session="c"), T0)
    assert fx.store.trim_sessions("app", 3, None, T0, None, B) == Step(events=14, rows=14)
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session="a"))
    assert [e.event.id for e in got.events] == ["a7", "a8", "a9"]
    assert got.last_seq == 19  # history: it never goes back
    assert [
        e.event.id
        for e in fx.store.get_session(SessionGetParams(app="app", user="u", session="c")).events
    ] == ["c0"]
    # A cursor pages through the sessions: the first one the next step looks at.
    two = Bounds(sessions=2)
    step = fx.store.trim_sessions("app", 1, None, T0, None, two)
    assert step == Step(events=4, rows=4, more=True, cursor=("u", "c"))
    assert fx.store.trim_sessions("app", 1, None, T0, step, two) == Step(events=0, rows=0)


def test_idle_sessions_go_with_their_events_and_own_state_but_shared_state_stays(
    fx: Fixture,
) -> None:
    fx.store.append(
        ap(ev("old"), session="old", state_delta=StateDelta(session={"x": 1}, user={"u": 1})), T0
    )
    fx.store.append(ap(ev("new"), session="new"), T0 + 10 * DAY)
    fx.store.create_session(SessionCreateParams(app="app", user="u", session="leased"), T0)
    fx.store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session="leased", stale_after_ms=30_000),
        "h/1/aaaaaaaa",
        T0 + 10 * DAY,
    )
    now = T0 + 10 * DAY
    assert fx.store.drop_idle_sessions("app", now - DAY, None, now, None, B) == Step(
        events=1, rows=2, sessions=1
    )  # its event and its one state delta
    assert [s.session for s in fx.store.list_sessions("app", None)] == ["leased", "new"]
    assert fx.store.get_state("app", "u", None, None).user == {"u": 1}


def test_nothing_after_what_a_watch_has_been_given_is_removed(fx: Fixture) -> None:
    seqs = [fx.store.append(ap(ev(f"e{i}", timestamp=at(T0))), T0).seq for i in range(6)]
    now = T0 + DAY
    assert fx.store.drop_old_events("app", now, seqs[2], now, None, B).events == 3
    assert ids(fx) == ["e3", "e4", "e5"]
    assert fx.store.trim_sessions("app", 1, seqs[3], now, None, B) == Step(events=1, rows=1)
    assert ids(fx) == ["e4", "e5"]
    assert fx.store.drop_idle_sessions("app", now + DAY, seqs[3], now, None, B) == Step(0, 0)


def test_seqs_are_never_given_again_after_the_newest_events_are_compacted(fx: Fixture) -> None:
    last = [fx.store.append(ap(ev(f"e{i}", timestamp=at(T0))), T0).seq for i in range(5)][-1]
    fx.store.drop_old_events("app", T0 + DAY, None, T0 + DAY, None, B)
    assert fx.store.latest_seq(None) == 0
    assert fx.store.append(ap(ev("next")), T0).seq == last + 1


# --- the file gives the space back ---------------------------------------------------


def _fill(store: SqliteStore, n: int, sessions: int = 10) -> None:
    body = "x" * 1000
    for start in range(0, n, 1000):
        store.append_batch(
            [ap(ev(f"e{i}", body), session=f"s{i % sessions}") for i in range(start, start + 1000)],
            T0,
        )


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def test_compacting_most_events_gives_most_of_their_space_back(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    store = SqliteStore.open(str(path), SqliteOptions(synchronous="NORMAL"))
    _fill(store, 20_000)
    store.checkpoint()
    store.close()
    with trio.fail_after(120):
        async with EventLog(path, synchronous="NORMAL", retention_interval=0) as log:
            await log.set_retention("app", max_events=100)
            result = await log.compact()
    assert result.events_deleted == 19_000 and result.checkpointed
    assert result.pages_freed > 0
    # The 19,000 events were about 95 % of the file; at least 80 % of that came back.
    assert result.bytes_after <= result.bytes_before - 0.8 * 0.95 * result.bytes_before
    assert _bytes(path) == result.bytes_after


async def test_a_file_from_before_incremental_vacuum_shrinks_with_a_full_vacuum(
    tmp_path: Path,
) -> None:
    from streamd.eventlog.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

    path = tmp_path / "old.db"
    db = apsw.Connection(str(path))
    db.pragma("journal_mode", "wal")  # as streamd before this change: auto_vacuum NONE
    with db:
        for m in MIGRATIONS:
            db.execute(m)
        db.pragma("user_version", SCHEMA_VERSION)
    db.close()
    store = SqliteStore.open(str(path), SqliteOptions(synchronous="NORMAL"))
    assert store.connection.pragma("auto_vacuum") == 0
    _fill(store, 5000)
    store.close()
    with trio.fail_after(120):
        async with EventLog(path, synchronous="NORMAL", retention_interval=0) as log:
            await log.set_retention("app", max_events=10)
            incremental = await log.compact()
            assert incremental.pages_freed == 0  # nothing to give back incrementally
            full = await log.compact(vacuum="full")
    assert full.bytes_after < 0.2 * incremental.bytes_before
    again = SqliteStore.open(str(path))
    assert again.connection.pragma("auto_vacuum") == 2  # incremental from now on
    again.close()


# --- the Trio layer --------------------------------------------------------------------


async def test_compact_keeps_what_an_open_watch_has_not_been_given(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(60):
        async with mocked(tmp_path / "e.db", retention_interval=0) as log:
            for i in range(10):
                await log.append("app", "u", "s", ev(f"e{i}"))
            await log.set_retention("app", max_events=1)
            async with log.watch(0) as w:
                got = await take(w, 3)
                result = await log.compact()
                assert result.keep_after_seq == got[-1].seq == 3
                rest = await take(w, 7)  # every entry it had not been given is there
            assert [e.event.id for e in got + rest] == [f"e{i}" for i in range(10)]
            assert result.events_deleted == 3
            # With no watch open, the policy applies whole.
            assert (await log.compact()).events_deleted == 6


async def test_the_background_task_applies_the_policies(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(3600):  # mock time
        async with mocked(tmp_path / "e.db", retention_interval=600) as log:
            for i in range(5):
                await log.append("app", "u", "s", ev(f"e{i}"))
            await log.set_retention("app", max_events=2)
            await trio.sleep(601)
            assert log.last_compaction is not None
            assert log.last_compaction.events_deleted == 3
            got = await log.get_session("app", "u", "s")
            assert [e.event.id for e in got.events] == ["e3", "e4"]


def test_limits_longer_than_all_time_cut_off_at_the_earliest_time_and_remove_nothing(
    fx: Fixture,
) -> None:
    # A policy takes any count of seconds up to 2**63 - 1; now minus that many
    # seconds, in microseconds, is no 64-bit integer, and the store refused the
    # cutoff (OverflowError), failing the compaction of every app.
    fx.store.append(ap(ev("e1", timestamp=at(T0 - 10 * DAY)), session="s"), T0)
    earliest = cutoff(T0, MAX_INT)
    assert earliest == EARLIEST_US
    assert fx.store.drop_idle_sessions("app", earliest, None, T0, None, B).sessions == 0
    assert fx.store.drop_old_events("app", earliest, None, T0, None, B).events == 0
    assert ids(fx) == ["e1"]


async def test_a_policy_longer_than_all_time_neither_fails_compact_nor_stops_the_log(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Before, compact answered -32603 (OverflowError), and the background
    # task's OverflowError took down the log's nursery: the log, and the
    # daemon with it, stopped 10 minutes after such a policy was set.
    with trio.fail_after(3600):  # mock time
        async with mocked(tmp_path / "e.db", retention_interval=600) as log:
            await log.append("app", "u", "s", ev("e1"))
            await log.set_retention("app", max_age_s=MAX_INT, idle_s=MAX_INT)
            result = await log.compact()
            assert result.events_deleted == result.sessions_deleted == 0
            await trio.sleep(601)  # the background task applies it too
            assert log.last_compaction is not None and log.last_compaction is not result
            assert await log.latest_seq() == 1


async def test_retention_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(20):
        c = await daemon.connect()
        for i in range(5):
            await c.result("eventlog/append", append(f"e{i}"))
        assert await c.result("eventlog/retention.set", {"app": "app", "max_events": 2}) == {}
        assert await c.result("eventlog/retention.get", {}) == {
            "policies": [{"app": "app", "max_age_s": None, "max_events": 2, "idle_s": None}]
        }
        got = await c.result("eventlog/compact", {"app": "app"})
        assert got["events_deleted"] == 3 and got["sessions_deleted"] == 0
        assert got["keep_after_seq"] is None and got["checkpointed"] is True
        err = await c.error("eventlog/retention.set", {"app": "app", "max_events": 0})
        assert err["code"] == -32602
        err = await c.error("eventlog/compact", {"vacuum": "always"})
        assert err["code"] == -32602


async def test_compact_after_close_is_closed(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "e.db", retention_interval=0)
    async with log:
        await log.ping()
    with pytest.raises(RpcError) as info:
        await log.compact()
    assert info.value.code == -32013


@pytest.mark.parametrize("expected_seq", [None, 1])
def test_a_session_appended_to_while_it_is_dropped_keeps_the_append(
        fx: Fixture, monkeypatch: pytest.MonkeyPatch, expected_seq: int | None) -> None:
    # Another daemon's append, committed after a drop step chose its idle
    # sessions, was deleted by that step on PostgreSQL (READ COMMITTED) once
    # it had been acknowledged. The step now locks the rows it chose. An
    # append conditioned on the session as it was (``expected_seq``) finds it
    # gone, as on SQLite; it was acknowledged on a session made anew.
    from streamd.eventlog.store import retention as rules

    fx.store.append(ap(ev("old"), session="s"), T0)
    other = fx.reopen()
    chosen, go = threading.Event(), threading.Event()
    real = rules.drop_idle_sessions

    class Pausing:
        """The step's database, which stops once the idle sessions are chosen."""

        def __init__(self, db: Any) -> None:
            self.db = db

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

        def rows(self, sql: str, args: Any = ()) -> Any:
            out = self.db.rows(sql, args)
            if sql.startswith("SELECT user_id, session_id FROM sessions"):
                chosen.set()
                assert go.wait(30)
            return out

    monkeypatch.setattr(rules, "drop_idle_sessions", lambda db, *a: real(Pausing(db), *a))
    now = T0 + 10 * DAY
    outcomes: dict[str, Any] = {}
    run = functools.partial(started, outcomes)

    dropping = run("drop", lambda: fx.store.drop_idle_sessions(
        "app", now - DAY, None, now, None, B))
    assert chosen.wait(30)
    appending = run("append", lambda: other.append(
        ap(ev("late"), session="s", expected_seq=expected_seq), now))
    # Time for an append nothing holds back to commit; one that waits for
    # the step's lock goes on once the step ends, either way is right.
    appending.join(0.5)
    go.set()
    dropping.join(30)
    appending.join(30)
    assert not isinstance(outcomes["drop"], Exception), outcomes
    kept = [e.event.id for e in other.since(SinceParams(from_seq=0, limit=100)).entries]
    if expected_seq is None:
        assert not isinstance(outcomes["append"], Exception), outcomes
        assert kept == ["late"]
    else:
        refused = outcomes["append"]
        assert isinstance(refused, RpcError) and refused.code == -32012, outcomes
        assert kept == []


@pytest.fixture(params=["postgres", "mysql"])
def server_fx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fixture]:
    yield from contract.BACKENDS[request.param](request, tmp_path)


def test_a_group_commit_and_a_drop_step_lock_their_sessions_in_one_order(
        server_fx: Fixture, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A group commit appending to "sa" and, conditioned (expected_seq), to
    # "sb" locked "sb" first (to check its seq), then "sa" (its upsert),
    # where a drop step locks its idle sessions in key order: "sa", then
    # "sb". Each waited for the other, and the server broke the deadlock by
    # failing one: every append of the group, or the step. Now the group
    # locks all its sessions in key order before anything else.
    fx = server_fx
    backend = request.node.callspec.params["server_fx"]
    fx.store.append(ap(ev("a0"), session="sa"), T0)
    b0 = fx.store.append(ap(ev("b0"), session="sb"), T0)
    other = fx.reopen()
    module = sys.modules[type(other).__module__]
    real = module.commit_planned
    locked, go = threading.Event(), threading.Event()

    class Pausing:
        """The group commit's database, stopping once it has taken its first locks."""

        def __init__(self, db: Any) -> None:
            self.db = db

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

        def known(self, items: Any) -> Any:
            out = self.db.known(items)
            locked.set()
            assert go.wait(30)
            return out

    monkeypatch.setattr(module, "commit_planned",
                        lambda db, *a, **kw: real(Pausing(db), *a, **kw))
    now = T0 + 10 * DAY
    outcomes: dict[str, Any] = {}
    run = functools.partial(started, outcomes)

    group = [ap(ev("a1"), session="sa"), ap(ev("b1"), session="sb", expected_seq=b0.seq)]
    appending = run("append", lambda: other.append_commit(group, now, False))
    assert locked.wait(30), outcomes
    dropping = run("drop", lambda: fx.store.drop_idle_sessions(
        "app", now - DAY, None, now, None, B))
    waits = lock_waits(request, backend)

    def waiting() -> bool:  # the step waits for a session the group holds
        assert dropping.is_alive(), f"the drop step ended, the group holding its locks: {outcomes}"
        return waits() > 0

    until(waiting, "the drop step waiting for the group's lock", timeout=30)
    go.set()
    appending.join(60)
    dropping.join(60)
    assert not isinstance(outcomes["append"], Exception), outcomes
    assert all(not isinstance(o, RpcError) for o in outcomes["append"].results), outcomes
    assert not isinstance(outcomes["drop"], Exception), outcomes
    # Appended to, neither session was idle by the time the step had it.
    kept = [e.event.id for e in other.since(SinceParams(from_seq=0, limit=100)).entries]
    assert kept == ["a0", "b0", "a1", "b1"]


def slow_writer(log: EventLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call on the log's (open) writer waits 1 s first: a retention
    step queued now waits that long for the writer."""
    runner = log.connections.writer
    assert runner is not None
    real = runner.run

    async def slow(op: Any) -> Any:
        await trio.sleep(1)
        return await real(op)

    monkeypatch.setattr(runner, "run", slow)


async def test_a_watch_opened_while_a_step_waits_for_the_writer_gets_no_gap(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step reads what open watches still need before it waits for the
    # writer. A watch opened meanwhile (from 0, two entries a page) read its
    # first pages, then the step removed what it had not read yet: it was
    # handed e0-e5, then e9, silently skipping e6-e8 while it was open. It
    # now reads the store once the step has ended: what it is handed has no
    # hole (here e9 alone, as for a watch opened just after the step).
    with trio.fail_after(60):
        async with (
            mocked(tmp_path / "e.db", retention_interval=0, watch_buffer=2) as log,
            trio.open_nursery() as nursery,
        ):
            for i in range(10):
                await log.append("app", "u", "s", ev(f"e{i}"))
            await log.set_retention("app", max_events=1)
            slow_writer(log, monkeypatch)
            nursery.start_soon(log.compact)
            await trio.sleep(0.5)  # the step waits for the writer
            got: list[str] = []
            async with log.watch(0) as w:
                async for entry in w:
                    got.append(entry.event.id)
                    if len(got) == 2:
                        await trio.sleep(1)  # the step runs meanwhile
                    if entry.event.id == "e9":
                        break
            assert got == [f"e{i}" for i in range(10 - len(got), 10)]


async def test_what_another_process_commits_after_a_watch_opened_outlives_a_step_queued_before(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's step read what its watches needed (nothing: none was open), then
    # waited for A's writer. A watch opened on A meanwhile, and B (another
    # process on the file) committed f0-f2 after it: the step then cut the
    # session to its newest event, f0 and f1 with it, which the watch,
    # opened before they were committed, never got. The horizon is now read
    # inside the step's transaction, so it counts that watch.
    path = tmp_path / "e.db"
    with trio.fail_after(60):
        async with (
            mocked(path, retention_interval=0) as a,
            mocked(path, retention_interval=0) as b,
            trio.open_nursery() as nursery,
        ):
            for i in range(5):
                await a.append("app", "u", "s", ev(f"e{i}"))
            await a.set_retention("app", max_events=1)
            slow_writer(a, monkeypatch)
            nursery.start_soon(a.compact)
            await trio.sleep(0.5)  # the step waits for A's writer
            got: list[str] = []
            async with a.watch(0) as w:
                for i in range(3):
                    await b.append("app", "u", "s", ev(f"f{i}"))
                async for entry in w:
                    got.append(entry.event.id)
                    if entry.event.id == "f2":
                        break
            assert got[-3:] == ["f0", "f1", "f2"]


async def test_a_watch_opened_after_a_step_read_its_horizon_waits_for_that_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The step reads the horizon inside its transaction; a watch opened after
    # that (while the step still runs) is not counted by it, so it must read
    # nothing until the step has ended. Reading at once, it was handed e0 and
    # e1 (a page of two), then the step removed e2-e8 under it: a silent gap.
    # Real threads, no sleeps: the step holds its transaction until the watch
    # has read a page (which it now never does first: the step then goes on
    # after a bounded wait, a delay and not what the test judges).
    with trio.fail_after(60):
        async with (
            EventLog(tmp_path / "e.db", synchronous="NORMAL", watch_buffer=2) as log,
            trio.open_nursery() as nursery,
        ):
            for i in range(10):
                await log.append("app", "u", "s", ev(f"e{i}"))
            await log.set_retention("app", max_events=1)
            read, paged = threading.Event(), threading.Event()
            writer = getattr(log.connections.writer, "store", None)
            await log.connections.open_reader()
            reader = getattr(log.connections.reader, "store", None)
            assert writer is not None and reader is not None
            trim, since = writer.trim_sessions, reader.since_committed

            def trim_after_a_page(app: str, n: int, keep: Any, *rest: Any) -> Step:
                monkeypatch.setattr(writer, "trim_sessions", trim)  # the first step alone
                horizon = kept_after(keep)  # as the step reads it
                read.set()
                paged.wait(2)
                return trim(app, n, horizon, *rest)

            def since_paged(*args: Any) -> Any:
                page = since(*args)
                if page[0]:
                    paged.set()
                return page

            monkeypatch.setattr(writer, "trim_sessions", trim_after_a_page)
            monkeypatch.setattr(reader, "since_committed", since_paged)
            compacted = trio.Event()

            async def compact() -> None:
                await log.compact()
                compacted.set()

            nursery.start_soon(compact)
            await thread_event(read)
            got: list[str] = []
            async with log.watch(0) as w:
                await compacted.wait()
                async for entry in w:
                    got.append(entry.event.id)
                    if entry.event.id == "e9":
                        break
            assert got == [f"e{i}" for i in range(10 - len(got), 10)]
