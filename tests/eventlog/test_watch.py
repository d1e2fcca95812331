"""Watches: replay then follow, each entry once and in order, within a byte budget.

A few tests use the real dispatch (apsw.aio worker threads) and the real clock on
purpose; each says why. Every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.eventlog import ev, mocked, take

from streamd.errors import BUDGET_EXCEEDED, RpcError
from streamd.eventlog import AppendParams, Entry, EventLog, Filter, SqliteStore
from streamd.eventlog.log import SAFETY_POLL
from streamd.eventlog.sqlite.changes import NO_INOTIFY_ENV, SETTLE_HORIZON


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    """The production dispatch (apsw.aio worker threads) on the real clock."""
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        yield log


@pytest.fixture
def open_mocked(tmp_path: Path) -> Callable[..., EventLog]:
    return functools.partial(mocked, tmp_path / "events.db")


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


def _count_reader_calls(log: EventLog, counts: dict[str, int]) -> None:
    reader = log.connections.reader
    assert isinstance(reader, SqliteStore)
    for name in counts:
        real = getattr(reader, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            counts[_name] += 1
            return _real(*args)

        setattr(reader, name, counted)


async def test_without_inotify_an_idle_watcher_polls_data_version_and_does_not_requery(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(NO_INOTIFY_ENV, "1")
    counts = {"since_committed": 0, "change_counter": 0}
    with trio.fail_after(600):
        async with open_mocked(watch_interval=0.2) as log:
            await log.ping()
            _count_reader_calls(log, counts)
            async with log.watch(0):
                await trio.sleep(10)  # 50 poll intervals with nothing committed
    assert counts["change_counter"] >= 45
    # The first query, plus one after the poller's baseline; never one per poll.
    assert counts["since_committed"] <= 2


async def test_with_inotify_an_idle_watcher_only_checks_for_changes_now_and_then(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NO_INOTIFY_ENV, raising=False)
    counts = {"since_committed": 0, "change_counter": 0}
    with trio.fail_after(600):
        async with open_mocked(watch_interval=0.2) as log:
            await log.append("app", "u", "s", ev("e0"))
            _count_reader_calls(log, counts)
            async with log.watch(0) as w:
                await take(w, 1)
                # Past the rechecks of the append's own WAL writes.
                await trio.sleep(SETTLE_HORIZON + 1)
                before = dict(counts)
                await trio.sleep(60)  # 300 poll intervals, had it polled
    assert counts["since_committed"] == before["since_committed"]
    # Only the slow safety check, not one per interval.
    assert counts["change_counter"] - before["change_counter"] <= 60 / SAFETY_POLL + 1
    assert before["change_counter"] >= 1  # the baseline


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



@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    history=st.integers(0, 10),
    rounds=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=6
    ),  # (local appends racing, foreign appends) per round
    watchers=st.lists(
        st.tuples(
            st.sampled_from(["all", "s1", "tree"]),
            st.integers(0, 12),  # from_seq
            st.integers(1, 6),  # buffer
            st.booleans(),  # reads slowly
        ),
        min_size=1,
        max_size=4,
    ),
)
async def test_many_watchers_see_many_writers_and_another_process_exactly_once_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    history: int,
    rounds: list[tuple[int, int]],
    watchers: list[tuple[str, int, int, bool]],
) -> None:
    # Real threads and a real second connection on purpose: the fan-out, the
    # replays, the drops to the store and the other "process's" commits (seen
    # by the change watcher or by our next commit's before_seq) interleave as
    # in production.
    path = tmp_path_factory.mktemp("many") / "events.db"
    filters = {
        "all": None,
        "s1": Filter(session="s1"),
        "tree": Filter(branch_prefixes=["root.a"]),
    }
    acknowledged: list[tuple[int, str, str, str]] = []  # seq, id, session, branch
    counter = iter(range(100_000))

    def params(i: int) -> AppendParams:
        return AppendParams(
            app="app", user="u", session=f"s{i % 3}",
            event=ev(f"e{i}", {"i": i}, branch=("root.a.x", "root.b", "")[i % 3 - 1]),
        )

    def record(i: int, seq: int) -> None:
        p = params(i)
        acknowledged.append((seq, p.event.id, p.session, p.event.branch))

    async def local() -> None:
        i = next(counter)
        record(i, (await log.requests.append(params(i))).seq)

    def foreign(store: SqliteStore, n: int) -> list[tuple[int, int]]:
        done = []
        for _ in range(n):
            i = next(counter)
            done.append((i, store.append(params(i), 0).seq))
        return done

    def wanted(kind: str, from_seq: int) -> list[tuple[int, str]]:
        return sorted(
            (seq, eid)
            for seq, eid, session, branch in acknowledged
            if seq > from_seq
            and (kind == "all" or (kind == "s1" and session == "s1")
                 or (kind == "tree" and branch.startswith("root.a")))
        )

    with trio.fail_after(60):
        async with EventLog(path, synchronous="NORMAL", watch_interval=0.05) as log:
            for _ in range(history):
                await local()
            other = await trio.to_thread.run_sync(SqliteStore.open, str(path))
            received: list[list[tuple[int, str]]] = [[] for _ in watchers]
            progressed = trio.Event()

            async def consume(w: Any, k: int, slow: bool) -> None:
                nonlocal progressed
                async for entry in w:
                    received[k].append((entry.seq, entry.event.id))
                    progressed.set()
                    progressed = trio.Event()
                    if slow:
                        await trio.sleep(0.001)

            try:
                async with trio.open_nursery() as nursery:
                    opened = []
                    for k, (kind, from_seq, buffer, slow) in enumerate(watchers):
                        w = log.watch(from_seq, filters[kind], buffer_bytes=buffer * 300)
                        opened.append(w)
                        nursery.start_soon(consume, w, k, slow)
                    for n_local, n_foreign in rounds:
                        async with trio.open_nursery() as burst:
                            for _ in range(n_local):
                                burst.start_soon(local)
                            if n_foreign:
                                for i, seq in await trio.to_thread.run_sync(
                                    foreign, other, n_foreign
                                ):
                                    record(i, seq)
                        await trio.sleep(0)
                    expected = [wanted(kind, f) for kind, f, _, _ in watchers]
                    while any(len(r) < len(e) for r, e in zip(received, expected, strict=True)):
                        await progressed.wait()
                    for w in opened:
                        await w.aclose()
                    nursery.cancel_scope.cancel()
            finally:
                other.close()
    assert received == expected
