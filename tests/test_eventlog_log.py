"""The Trio layer: lazy open, group commit, watchers, leases, boots, close.

Timing logic runs under Trio's MockClock with ``dispatch="inline"`` (the store on
the event loop thread): with a real worker thread the autojump clock would jump
while SQLite works. Those tests also read the lease clock from the Trio clock, so
"30 seconds later" is exact and instant. A few tests use the real dispatch and the
real clock on purpose; each says why. Every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamd.errors import (
    BUDGET_EXCEEDED,
    CLOSED,
    EVENT_CONFLICT,
    INVALID_PARAMS,
    SESSION_LOCKED,
    SOURCE_UNAVAILABLE,
    RpcError,
    is_closed,
    is_session_not_found,
)
from streamd.eventlog import (
    AppendParams,
    Entry,
    Event,
    EventLog,
    Filter,
    Lease,
    resolve_db_path,
)
from streamd.eventlog.store import SqliteStore

EPOCH = 1_750_000_000.0


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


def trio_wall_clock() -> float:
    """Lease ages come from this clock, so the mock clock drives staleness too."""
    return EPOCH + trio.current_time()


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    """The production dispatch (apsw.aio worker threads) on the real clock."""
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        yield log


@pytest.fixture
def open_mocked(tmp_path: Path) -> Callable[..., EventLog]:
    """EventLogs for mock-clock tests: inline dispatch, wall clock = Trio clock.
    (A test using it also requests ``autojump_clock``: pytest-trio takes the clock
    only from the test's own arguments.)"""

    def make(**kw: Any) -> EventLog:
        kw.setdefault("dispatch", "inline")
        kw.setdefault("synchronous", "NORMAL")
        kw.setdefault("wall_clock", trio_wall_clock)
        return EventLog(tmp_path / "events.db", **kw)

    return make


async def take(watch: AsyncIterator[Entry], n: int) -> list[Entry]:
    got = []
    async for entry in watch:
        got.append(entry)
        if len(got) == n:
            break
    return got


# --- opening ------------------------------------------------------------------


async def test_no_database_file_exists_until_the_first_operation(tmp_path: Path) -> None:
    path = tmp_path / "state" / "streamd" / "events.db"
    with trio.fail_after(10):
        async with EventLog(path) as log:
            assert not path.parent.exists() and not log.opened
        assert not path.parent.exists()
        async with EventLog(path) as log:
            assert await log.latest_seq() == 0
            assert log.opened and path.exists()


async def test_database_file_and_its_directory_are_private_to_the_user(tmp_path: Path) -> None:
    path = tmp_path / "new" / "events.db"
    with trio.fail_after(10):
        async with EventLog(path) as log:
            await log.ping()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_default_path_is_under_xdg_state_home_with_fallback_and_overrides() -> None:
    home = Path.home()
    assert resolve_db_path(env={}) == home / ".local/state/streamd/events.db"
    assert resolve_db_path(env={"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/streamd/events.db")
    # The XDG spec says a relative value is invalid and must be ignored.
    assert resolve_db_path(env={"XDG_STATE_HOME": "rel"}) == home / ".local/state/streamd/events.db"
    env = {"XDG_STATE_HOME": "/x/state", "STREAMD_DB": "/y/e.db"}
    assert resolve_db_path(env=env) == Path("/y/e.db")
    assert resolve_db_path("/z/explicit.db", env=env) == Path("/z/explicit.db")


async def test_synchronous_is_full_by_default_and_normal_on_request(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with EventLog(tmp_path / "a.db") as log:
            assert await log.synchronous_level() == 2
        async with EventLog(tmp_path / "b.db", synchronous="NORMAL") as log:
            assert await log.synchronous_level() == 1


# --- appends --------------------------------------------------------------------


async def test_append_returns_seq_then_duplicate_on_identical_retry(log: EventLog) -> None:
    with trio.fail_after(10):
        first = await log.append("app", "u", "s", ev("e1", {"a": 1}), {"caller": "me"})
        again = await log.append("app", "u", "s", ev("e1", {"a": 1}), {"caller": "me"})
        assert (first.duplicate, again.duplicate, again.seq) == (False, True, first.seq)
        with pytest.raises(RpcError) as info:
            await log.append("app", "u", "s", ev("e1", {"a": 2}))
        assert info.value.code == EVENT_CONFLICT
        assert await log.latest_seq() == first.seq


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda log: log.append("", "u", "s", ev("e")), id="empty-app"),
        pytest.param(lambda log: log.append("a", "u", "s", ev("")), id="empty-event-id"),
        pytest.param(
            lambda log: log.append(
                "a",
                "u",
                "s",
                ev("e", timestamp=dt.datetime(2025, 1, 1)),
            ),
            id="naive-timestamp",
        ),
        pytest.param(lambda log: log.since(0, None, 10_001), id="limit-over-max"),
        pytest.param(lambda log: log.since(-1), id="negative-from-seq"),
        pytest.param(lambda log: log.since(0, Filter(session="")), id="empty-session-filter"),
        pytest.param(
            lambda log: log.acquire_lock(
                "a", "u", "s", nursery=None, stale_after_ms=1000, heartbeat_ms=1000
            ),
            id="heartbeat-not-below-stale",
        ),
        pytest.param(lambda log: log.since(2**63), id="from-seq-over-int64"),
    ],
)
async def test_python_api_rejects_what_the_wire_rejects(log: EventLog, call: Any) -> None:
    with trio.fail_after(10), pytest.raises(RpcError) as info:
        await call(log)
    assert info.value.code == INVALID_PARAMS
    assert not log.opened  # rejected before touching the database


async def test_concurrent_appends_share_commits_and_are_acknowledged_only_after_commit(
    log: EventLog, tmp_path: Path
) -> None:
    probe = apsw.Connection(str(tmp_path / "events.db"))  # sees only committed rows
    acknowledged: list[int] = []

    async def append(i: int) -> None:
        result = await log.append("app", "u", f"s{i % 3}", ev(f"e{i}", i))
        row = probe.execute("SELECT event_id FROM events WHERE seq = ?", (result.seq,)).fetchone()
        assert row == (f"e{i}",), "acknowledged before its commit was visible"
        acknowledged.append(result.seq)

    with trio.fail_after(20):
        await log.ping()  # open first, so all appends arrive together
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(append, i)
    probe.close()
    assert len(set(acknowledged)) == 200
    assert log.stats.appends == 200
    assert log.stats.batches < 200 and log.stats.largest_batch > 1


async def test_a_conflict_fails_only_its_own_append_in_a_shared_commit(log: EventLog) -> None:
    outcomes: dict[str, Any] = {}

    async def append(event_id: str, content: int) -> None:
        try:
            outcomes[event_id] = await log.append("app", "u", "s", ev(event_id, content))
        except RpcError as exc:
            outcomes[event_id] = exc

    with trio.fail_after(10):
        await log.append("app", "u", "s", ev("taken", 0))
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(append, f"e{i}", i)
            nursery.start_soon(append, "taken", 1)
        assert isinstance(outcomes["taken"], RpcError)
        assert outcomes["taken"].code == EVENT_CONFLICT
        assert all(not isinstance(outcomes[f"e{i}"], RpcError) for i in range(20))
        assert await log.latest_seq() == 21


# --- watch ----------------------------------------------------------------------


async def test_watch_replays_history_then_follows_live_in_seq_order(log: EventLog) -> None:
    with trio.fail_after(10):
        for i in range(3):
            await log.append("app", "u", "s", ev(f"old{i}"))
        async with log.watch(0) as w:
            got = await take(w, 3)
            await log.append("app", "u", "s", ev("new0"))
            await log.append("app", "u", "other", ev("new1"))
            got += await take(w, 2)
    assert [e.event.id for e in got] == ["old0", "old1", "old2", "new0", "new1"]
    assert [e.seq for e in got] == sorted(e.seq for e in got)
    assert w.last_seq == got[-1].seq


async def test_watch_from_a_seq_skips_what_came_before_and_honours_the_filter(
    log: EventLog,
) -> None:
    with trio.fail_after(10):
        seqs = [(await log.append("app", "u", f"s{i % 2}", ev(f"e{i}"))).seq for i in range(6)]
        async with log.watch(seqs[1], Filter(session="s0")) as w:
            got = await take(w, 2)
            await log.append("app", "u", "s1", ev("skip"))
            await log.append("app", "u", "s0", ev("live"))
            got += await take(w, 1)
    assert [e.event.id for e in got] == ["e2", "e4", "live"]


async def test_in_process_append_wakes_a_caught_up_watcher_with_no_time_passing(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A poll interval of an hour: only the writer's direct wake-up can deliver in
    # zero (mock) time.
    with trio.fail_after(7200):
        async with open_mocked(watch_interval=3600) as log:
            await log.append("app", "u", "s", ev("e0"))
            async with log.watch(0) as w:
                await take(w, 1)
                await trio.testing.wait_all_tasks_blocked()  # the watcher sleeps
                start = trio.current_time()
                await log.append("app", "u", "s", ev("e1"))
                (entry,) = await take(w, 1)
                assert entry.event.id == "e1"
                assert trio.current_time() == start


async def test_in_process_append_wakes_a_watcher_at_once_with_real_threads(
    tmp_path: Path,
) -> None:
    # The same claim on the production dispatch: with a 60 s poll interval, a
    # delivery inside the 5 s bound can only come from the direct wake-up.
    async with EventLog(tmp_path / "e.db", watch_interval=60, synchronous="NORMAL") as log:
        with trio.fail_after(5):
            await log.append("app", "u", "s", ev("e0"))
            async with log.watch(0) as w:
                await take(w, 1)
                for i in range(1, 4):
                    await log.append("app", "u", "s", ev(f"e{i}"))
                    (entry,) = await take(w, 1)
                    assert entry.event.id == f"e{i}"


async def test_other_connections_commits_are_noticed_by_data_version_within_the_interval(
    open_mocked: Callable[..., EventLog], autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_interval=0.2) as log:
            await log.ping()
            other = SqliteStore.open(str(tmp_path / "events.db"))  # like another process
            async with log.watch(0) as w:
                await trio.sleep(5)  # idle for 25 poll intervals
                start = trio.current_time()
                other.append(
                    AppendParams(app="app", user="u", session="s", event=ev("from-elsewhere")), 0
                )
                (entry,) = await take(w, 1)
                assert entry.event.id == "from-elsewhere"
                assert trio.current_time() - start <= 0.2 + 1e-9
            other.close()


async def test_an_idle_watcher_polls_data_version_and_does_not_requery(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    counts = {"since": 0, "change_counter": 0}
    with trio.fail_after(600):
        async with open_mocked(watch_interval=0.2) as log:
            await log.ping()
            reader = log._reader
            assert isinstance(reader, SqliteStore)
            for name in counts:
                real = getattr(reader, name)

                def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
                    counts[_name] += 1
                    return _real(*args)

                setattr(reader, name, counted)
            async with log.watch(0):
                await trio.sleep(10)  # 50 poll intervals with nothing committed
    assert counts["change_counter"] >= 45
    # The first query, plus one after the poller's baseline; never one per poll.
    assert counts["since"] <= 2


async def test_a_consumer_that_stops_reading_ends_the_watch_with_a_clear_error(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_buffer=5, watch_stall_timeout=30) as log:
            for i in range(50):
                await log.append("app", "u", "s", ev(f"e{i}"))
            w = log.watch(0)
            await trio.sleep(29)
            assert w.buffered == 5  # bounded, although 50 entries wait
            await trio.sleep(2)  # past the stall timeout
            got = [entry async for entry in _until_error(w)]
            assert [e.event.id for e in got] == [f"e{i}" for i in range(5)]
            err = w.error
            assert isinstance(err, RpcError) and err.code == BUDGET_EXCEEDED
            assert err.data["last_seq"] == got[-1].seq
            assert f"from_seq={got[-1].seq}" in err.message


async def test_a_watch_reads_ahead_at_most_its_byte_budget_whatever_the_entries_weigh(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_buffer_bytes=64 * 1024, watch_stall_timeout=30) as log:
            for i in range(50):
                await log.append("app", "u", "s", ev(f"e{i}", "x" * 16_000))
            w = log.watch(0)
            await trio.sleep(29)
            # Four entries of about 16.2 KB on the wire fit 64 KiB; a fifth would not.
            assert w.buffered == 4 and w.buffered_bytes <= 64 * 1024
            await trio.sleep(2)  # past the stall timeout
            got = [entry async for entry in _until_error(w)]
            assert [e.event.id for e in got] == ["e0", "e1", "e2", "e3"]
            assert got[0].event.content == "x" * 16_000  # decoded when handed out
            assert w.error is not None and w.error.data["last_seq"] == got[-1].seq


async def _until_error(w: Any) -> AsyncIterator[Entry]:
    try:
        async for entry in w:
            yield entry
    except RpcError as exc:
        assert exc is w.error


async def test_a_slow_consumer_that_keeps_reading_gets_everything_past_its_buffer(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(6000):
        async with open_mocked(watch_buffer=4, watch_stall_timeout=30) as log:
            for i in range(40):
                await log.append("app", "u", "s", ev(f"e{i}"))
            async with log.watch(0) as w:
                got = []
                async for entry in w:
                    got.append(entry.event.id)
                    assert w.buffered <= 4
                    if len(got) == 40:
                        break
                    await trio.sleep(20)  # slow, but under the stall timeout
    assert got == [f"e{i}" for i in range(40)]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    history=st.integers(0, 12),
    bursts=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    sessions=st.lists(st.sampled_from(["s1", "s2"]), min_size=40, max_size=40),
    only_s1=st.booleans(),
    buffer=st.integers(1, 8),
)
async def test_watch_from_zero_sees_every_entry_exactly_once_in_order_while_appends_race(
    tmp_path_factory: pytest.TempPathFactory,
    history: int,
    bursts: list[int],
    sessions: list[str],
    only_s1: bool,
    buffer: int,
) -> None:
    # Real threads on purpose: the replay query, the live wake-ups and the
    # concurrent commits interleave as they do in production.
    path = tmp_path_factory.mktemp("prop") / "events.db"
    flt = Filter(session="s1") if only_s1 else None
    acknowledged: list[tuple[int, str, str]] = []
    counter = iter(range(10_000))

    async def append() -> None:
        i = next(counter)
        session = sessions[i % len(sessions)]
        result = await log.append("app", "u", session, ev(f"e{i}"))
        acknowledged.append((result.seq, f"e{i}", session))

    with trio.fail_after(30):
        async with EventLog(path, synchronous="NORMAL", watch_buffer=buffer) as log:
            for _ in range(history):
                await append()
            received: list[Entry] = []
            target: list[int] = []
            complete = trio.Event()

            async def consume(w: Any) -> None:
                async for entry in w:
                    received.append(entry)
                    if target and len(received) >= target[0]:
                        complete.set()

            async with log.watch(0, flt) as w, trio.open_nursery() as nursery:
                nursery.start_soon(consume, w)
                for size in bursts:
                    async with trio.open_nursery() as burst:
                        for _ in range(size):
                            burst.start_soon(append)
                    await trio.sleep(0)
                expected = sorted(
                    (seq, eid) for seq, eid, s in acknowledged if flt is None or s == "s1"
                )
                target.append(len(expected))
                if len(received) >= len(expected):
                    complete.set()
                await complete.wait()
                nursery.cancel_scope.cancel()
    assert [(e.seq, e.event.id) for e in received] == expected


# --- leases -----------------------------------------------------------------------


async def test_a_fresh_lease_is_session_locked_with_holder_and_heartbeat_age(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            lease = await a.acquire_lock("app", "u", "s", nursery=nursery, heartbeat_ms=5000)
            assert lease.holder.split("/")[1] == str(os.getpid())
            assert len(lease.holder.split("/")[2]) == 8
            await trio.sleep(103)  # 20 heartbeats; the last one 3 s ago
            with pytest.raises(RpcError) as info:
                await b.acquire_lock("app", "u", "s", nursery=nursery)
            assert info.value.code == SESSION_LOCKED
            assert info.value.data == {"holder": lease.holder, "heartbeat_age_ms": 3000}
            assert lease.beats == 20 and not lease.lost.is_set()
            await lease.release()


def _pause_heartbeats(log: EventLog, monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Make ``log``'s heartbeats fail (as a wedged disk would) while the returned
    flag's ``paused`` is true: its leases then age although their holder lives."""
    writer = log._writer
    real = writer.heartbeat_lease
    state = {"paused": True}

    def heartbeat(*args: Any) -> bool:
        if state["paused"]:
            raise RpcError(SOURCE_UNAVAILABLE, "disk I/O error")
        return real(*args)

    monkeypatch.setattr(writer, "heartbeat_lease", heartbeat)
    return state


async def test_a_lease_whose_holder_stops_beating_is_stolen_after_its_own_window_and_the_holder_learns_it(  # noqa: E501
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost_calls: list[tuple[str, float]] = []

    async def on_lost(lease: Lease) -> None:
        lost_calls.append((lease.lock, trio.current_time()))

    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            t0 = trio.current_time()
            # A promises a beat within 30 s (it beats every 5 s), then stalls.
            old = await a.acquire_lock(
                "app", "u", "s", nursery=nursery, stale_after_ms=30_000, on_lost=on_lost
            )
            assert old.heartbeat_ms == 5000
            beats = _pause_heartbeats(a, monkeypatch)
            await trio.sleep(29)
            with pytest.raises(RpcError) as info:
                # Within A's window: B's own short window does not shorten A's.
                await b.acquire_lock("app", "u", "s", nursery=nursery, stale_after_ms=150)
            assert info.value.code == SESSION_LOCKED
            assert info.value.data["heartbeat_age_ms"] == 29_000
            await trio.sleep(2)  # 31 s without a beat: past A's own 30 s
            new = await b.acquire_lock("app", "u", "s", nursery=nursery)
            beats["paused"] = False
            await old.lost.wait()
            assert trio.current_time() - t0 == pytest.approx(35)  # A's next beat
            assert lost_calls == [(old.lock, trio.current_time())]
            # A's release must not delete B's lease.
            await old.release()
            (info_row,) = await b.list_locks()
            assert info_row.holder == new.holder and info_row.stale_after_ms == 30_000
            await trio.sleep(62)  # B beats at 36, 41, ... 96 (B acquired at 31)
            assert not new.lost.is_set() and new.beats == 13
            await new.release()
            assert await b.list_locks() == []


async def test_a_healthy_lease_is_never_taken_by_a_requester_with_a_tiny_window(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            held = await a.acquire_lock(
                "app", "u", "s", nursery=nursery, stale_after_ms=30_000, heartbeat_ms=5000
            )
            await trio.sleep(4)  # the holder's last beat (at acquire) is 4 s old
            with pytest.raises(RpcError) as info:
                await b.acquire_lock(
                    "app", "u", "s", nursery=nursery, stale_after_ms=150, heartbeat_ms=50
                )
            assert info.value.code == SESSION_LOCKED
            assert info.value.data == {"holder": held.holder, "heartbeat_age_ms": 4000}
            await trio.sleep(60)
            assert not held.lost.is_set() and held.beats == 12
            await held.release()


async def test_a_short_window_without_a_heartbeat_derives_one_instead_of_refusing(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as log, trio.open_nursery() as nursery:
            lease = await log.acquire_lock("app", "u", "s", nursery=nursery, stale_after_ms=800)
            assert lease.heartbeat_ms == 266  # a third of the window
            await trio.sleep(2.7)
            assert lease.beats == 10 and not lease.lost.is_set()
            await lease.release()
            lease = await log.acquire_lock("app", "u", "s", nursery=nursery, stale_after_ms=150)
            assert lease.heartbeat_ms == 50  # the floor, a third of the smallest window
            await lease.release()
            lease = await log.acquire_lock("app", "u", "s", nursery=nursery)
            assert lease.heartbeat_ms == 5000  # a third of 30 s, capped at 5 s
            await lease.release()


@pytest.mark.parametrize(
    ("window", "heartbeat", "message"),
    [
        (30_000, 49, "heartbeat_ms must be at least 50, not 49"),
        (149, None, "stale_after_ms must be at least 150, not 149"),
        (149, 50, "stale_after_ms must be at least 150, not 149"),
        (2, 1, "stale_after_ms must be at least 150, not 2"),
        (300, 151, "stale_after_ms (300) must be at least twice heartbeat_ms (151)"),
    ],
)
async def test_explicit_lease_values_below_the_floors_are_invalid_params_naming_the_floor(
    log: EventLog, window: int, heartbeat: int | None, message: str
) -> None:
    with trio.fail_after(10), pytest.raises(RpcError) as info:
        await log.acquire_lock(
            "app", "u", "s", nursery=None, stale_after_ms=window, heartbeat_ms=heartbeat
        )
    assert info.value.code == INVALID_PARAMS
    assert info.value.message == message
    assert not log.opened


async def test_a_heartbeat_that_hits_a_database_error_is_retried_not_reported_lost(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            lease = await a.acquire_lock("app", "u", "s", nursery=nursery, heartbeat_ms=5000)
            writer = a._writer
            real = writer.heartbeat_lease
            failures = {"left": 3}

            def flaky(*args: Any) -> bool:
                if failures["left"]:
                    failures["left"] -= 1
                    raise RpcError(SOURCE_UNAVAILABLE, "disk I/O error")
                return real(*args)

            monkeypatch.setattr(writer, "heartbeat_lease", flaky)
            await trio.sleep(16)  # three failing beats
            assert not lease.lost.is_set() and lease.beats == 0
            await trio.sleep(5)  # the fourth succeeds
            assert lease.beats == 1 and not lease.lost.is_set()
            with pytest.raises(RpcError) as info:
                await b.acquire_lock("app", "u", "s", nursery=nursery)
            assert info.value.code == SESSION_LOCKED
            await lease.release()


async def test_release_frees_the_session_at_once_and_is_idempotent(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            lease = await a.acquire_lock("app", "u", "s", nursery=nursery)
            await a.release_lock(lease.lock)
            await a.release_lock(lease.lock)
            await a.release_lock("no-such-lock")
            await lease.release()
            other = await b.acquire_lock("app", "u", "s", nursery=nursery)
            assert not lease.lost.is_set()
            await other.release()


async def test_leases_are_released_when_the_log_closes(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as b, trio.open_nursery() as nursery:
            async with open_mocked() as a:
                lease = await a.acquire_lock("app", "u", "s", nursery=nursery)
            # Closed: the heartbeat has stopped and the row is gone.
            other = await b.acquire_lock("app", "u", "s", nursery=nursery)
            await lease.release()  # after close: nothing to do, no error
            await trio.sleep(60)
            assert not other.lost.is_set()
            await other.release()


async def test_real_clock_steal_is_noticed_within_one_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One test on real time and real threads with the shortest intervals the
    # floors allow. A beats every 50 ms and promises 150 ms; its beats then fail
    # (a wedged disk), so its lease ages past its own window and B takes it;
    # A's next beat after the disk recovers must find the lease gone.
    path = tmp_path / "e.db"
    with trio.fail_after(10):
        async with (
            EventLog(path, synchronous="NORMAL") as a,
            EventLog(path, synchronous="NORMAL") as b,
            trio.open_nursery() as nursery,
        ):
            old = await a.acquire_lock(
                "app", "u", "s", nursery=nursery, heartbeat_ms=50, stale_after_ms=150
            )
            beats = _pause_heartbeats(a, monkeypatch)
            while True:
                try:
                    new = await b.acquire_lock(
                        "app", "u", "s", nursery=nursery, heartbeat_ms=50, stale_after_ms=150
                    )
                    break
                except RpcError as exc:
                    assert exc.code == SESSION_LOCKED
                    await trio.sleep(0.01)
            stolen_at = trio.current_time()
            beats["paused"] = False
            await old.lost.wait()
            assert trio.current_time() - stolen_at < 0.05 + 0.5
            assert not new.lost.is_set()
            await new.release()


# --- sessions and boots --------------------------------------------------------------


async def test_sessions_through_the_trio_api(log: EventLog) -> None:
    with trio.fail_after(10):
        created = await log.create_session("app", "u", state={"k": 1})
        await log.append("app", "u", created.session, ev("e1"))
        got = await log.get_session("app", "u", created.session)
        assert got.state == {"k": 1} and [e.event.id for e in got.events] == ["e1"]
        assert [s.session for s in await log.list_sessions("app")] == [created.session]
        await log.delete_session("app", "u", created.session)
        with pytest.raises(RpcError) as info:
            await log.get_session("app", "u", created.session)
        assert is_session_not_found(info.value)


async def test_boots_through_the_trio_api(log: EventLog) -> None:
    t = dt.datetime(2025, 5, 1, 12, tzinfo=dt.UTC)
    with trio.fail_after(10):
        first = await log.record_boot(t, ["s1", "s2"])
        second = await log.record_boot(t + dt.timedelta(minutes=1), [])
        await log.update_boot(first, ["s1"])
        boots = await log.recent_boots(t)
        assert [(b.id, b.attempted, b.boot_at) for b in boots] == [
            (first, ["s1"], t),
            (second, [], t + dt.timedelta(minutes=1)),
        ]
        with pytest.raises(RpcError) as info:
            await log.update_boot(second + 1, [])
        assert info.value.code == INVALID_PARAMS


# --- close ------------------------------------------------------------------------------

OPERATIONS: dict[str, Callable[[EventLog], Any]] = {
    "append": lambda log: log.append("app", "u", "s", ev("x")),
    "since": lambda log: log.since(0),
    "latest_seq": lambda log: log.latest_seq(),
    "branches": lambda log: log.branches(),
    "create_session": lambda log: log.create_session("app", "u"),
    "get_session": lambda log: log.get_session("app", "u", "s"),
    "list_sessions": lambda log: log.list_sessions("app"),
    "delete_session": lambda log: log.delete_session("app", "u", "s"),
    "acquire_lock": lambda log: log.acquire_lock("app", "u", "s", nursery=log._nursery),
    "release_lock": lambda log: log.release_lock("whatever"),
    "list_locks": lambda log: log.list_locks(),
    "record_boot": lambda log: log.record_boot(dt.datetime.now(dt.UTC), []),
    "update_boot": lambda log: log.update_boot(1, []),
    "recent_boots": lambda log: log.recent_boots(dt.datetime.now(dt.UTC)),
    "ping": lambda log: log.ping(),
}


@pytest.mark.parametrize("opened", [True, False], ids=["opened", "never-opened"])
@pytest.mark.parametrize("name", sorted(OPERATIONS))
async def test_every_operation_after_close_fails_promptly_with_closed(
    tmp_path: Path, name: str, opened: bool
) -> None:
    async with EventLog(tmp_path / "e.db", synchronous="NORMAL") as log:
        if opened:
            await log.ping()
        await log.aclose()
        with trio.fail_after(1), pytest.raises(RpcError) as info:
            await OPERATIONS[name](log)
        assert info.value.code == CLOSED and is_closed(info.value)
        with pytest.raises(RpcError) as info:
            log.watch(0)
        assert info.value.code == CLOSED


async def test_a_waiting_watcher_ends_with_closed_when_the_log_closes(log: EventLog) -> None:
    errors: list[RpcError] = []

    async def consume(w: Any) -> None:
        try:
            async for _ in w:
                pass
        except RpcError as exc:
            errors.append(exc)

    with trio.fail_after(5):
        await log.append("app", "u", "s", ev("e"))
        w = log.watch(0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, w)
            await log.since(0)
            await log.aclose()
    assert [e.code for e in errors] == [CLOSED]


async def test_close_does_not_wait_out_another_process_holding_the_write_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "e.db"
    outcome: list[Any] = []

    async def append(log: EventLog) -> None:
        try:
            outcome.append(await log.append("app", "u", "s", ev("blocked")))
        except RpcError as exc:
            outcome.append(exc)

    async with EventLog(path, synchronous="NORMAL", busy_timeout_ms=60_000) as log:
        await log.ping()
        other = apsw.Connection(str(path))
        other.execute("BEGIN IMMEDIATE")  # another process takes the write lock
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(append, log)
                await trio.sleep(0.2)  # the append is now waiting inside SQLite
                start = trio.current_time()
                with trio.fail_after(5):
                    await log.aclose()
                assert trio.current_time() - start < 2
        finally:
            other.execute("ROLLBACK")
            other.close()
    (err,) = outcome
    assert isinstance(err, RpcError) and err.code == CLOSED
    assert "not written" in err.message
    check = SqliteStore.open(str(path))
    assert check.latest_seq(None) == 0
    check.close()


async def test_an_error_inside_the_block_propagates_unwrapped(tmp_path: Path) -> None:
    with trio.fail_after(10), pytest.raises(RpcError) as info:
        async with EventLog(tmp_path / "e.db") as log:
            await log.get_session("app", "u", "nope")
    assert is_session_not_found(info.value)
