"""A log's heartbeats: every lease of one interval refreshed by one store call
a tick, each lease answered for itself, each interval on its own cadence; and
what the nursery a lease was taken with still sees.

Under the mock clock (``support.eventlog.mocked``); every test is bounded by
``trio.fail_after``. Store calls are counted on the writer's runner, where
every heartbeat and every other write of the log passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
import trio.testing
from support.eventlog import ev, mocked, trio_wall_clock, writer_calls

from streamd.eventlog import EventLog, Lease, SqliteStore
from streamd.eventlog.heartbeats import cadence_ms


@pytest.fixture
def open_mocked(tmp_path: Path) -> Callable[..., EventLog]:
    # No retention task: its writes would be counted among the heartbeats'.
    return functools.partial(mocked, tmp_path / "events.db", retention_interval=0)


def shrink_window(db: Path, session: str) -> None:
    """The holder of ``session``'s lease promises nothing more (its window is
    made 0 by hand): another holder may take it at once."""
    conn = apsw.Connection(str(db))
    try:
        conn.execute("UPDATE leases SET stale_after_ms = 0 WHERE session_id = ?", (session,))
    finally:
        conn.close()


async def test_the_beats_of_many_leases_reach_the_writer_as_one_store_call_a_tick(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fifty leases taken one after the other, each in a phase of its own.
    # Each beat a store call of its own: 500 calls in 10 s, each a
    # transaction that every other client's appends queued behind.
    with trio.fail_after(600):
        async with open_mocked() as log, trio.open_nursery() as nursery:
            leases: list[Lease] = []
            for i in range(50):
                leases.append(await log.acquire_lock(
                    "app", "u", f"s{i}", nursery=nursery, heartbeat_ms=1000, stale_after_ms=3000
                ))
                await trio.sleep(0.017)
            calls = writer_calls(log, monkeypatch)
            before = [lease.beats for lease in leases]
            await trio.sleep(10)
            assert [lease.beats - b for lease, b in zip(leases, before, strict=True)] == [10] * 50
            assert len(calls) == 10
            assert not any(lease.lost.is_set() for lease in leases)
            for lease in leases:
                await lease.release()


async def test_a_lease_stolen_among_many_is_the_only_one_lost_and_the_rest_beat_on(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    told: list[str] = []

    async def on_lost(lease: Lease) -> None:
        told.append(lease.session)

    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            leases = [
                await a.acquire_lock(
                    "app", "u", f"s{i}", nursery=nursery, heartbeat_ms=1000,
                    stale_after_ms=3000, on_lost=on_lost,
                )
                for i in range(20)
            ]
            shrink_window(tmp_path / "events.db", "s7")
            thief = await b.acquire_lock("app", "u", "s7", nursery=nursery)
            calls = writer_calls(a, monkeypatch)
            await trio.sleep(1.5)  # A's next tick
            assert told == ["s7"] and len(calls) == 1
            assert [lease.session for lease in leases if lease.lost.is_set()] == ["s7"]
            assert a.lease(leases[7].lock) is None
            await trio.sleep(5)
            assert told == ["s7"] and len(calls) == 6
            assert {lease.beats for lease in leases if lease.session != "s7"} == {6}
            assert not thief.lost.is_set()
            holders = {x.session: x.holder for x in await b.list_locks()}
            assert holders["s7"] == thief.holder
            for lease in [*leases, thief]:
                await lease.release()


async def test_leases_with_different_heartbeats_each_keep_their_own_cadence(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Four leases each at 1 s, 1.5 s and 2.5 s, taken in turn 50 ms apart.
    # Each beats at its own interval, never staler than it, and the writer
    # gets one call a tick of each interval: 30 + 20 + 12 in 30 s (one a
    # beat, 248, before).
    intervals = [1000, 1500, 2500]
    with trio.fail_after(600):
        async with open_mocked() as log, trio.open_nursery() as nursery:
            leases: list[Lease] = []
            for i in range(12):
                ms = intervals[i % 3]
                leases.append(await log.acquire_lock(
                    "app", "u", f"s{i}", nursery=nursery, heartbeat_ms=ms, stale_after_ms=3 * ms
                ))
                await trio.sleep(0.05)
            calls = writer_calls(log, monkeypatch)
            before = [lease.beats for lease in leases]
            interval_of = {lease.session: lease.heartbeat_ms / 1000 for lease in leases}
            for _ in range(300):
                await trio.sleep(0.1)
                for row in await log.list_locks():
                    assert row.heartbeat_at is not None
                    age = trio_wall_clock() - row.heartbeat_at.timestamp()
                    assert age <= interval_of[row.session] + 1e-6, row.session
            beaten = [lease.beats - b for lease, b in zip(leases, before, strict=True)]
            assert beaten == [30, 20, 12] * 4
            assert len(calls) == 30 + 20 + 12
            for lease in leases:
                await lease.release()


async def test_leases_of_nearly_equal_heartbeats_share_one_call_a_tick_and_none_beats_late(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ten leases at 1,000 to 1,009 ms (a client deriving each from its own
    # window): each interval was a cadence of its own, ten calls a second.
    # They beat together at 1,000 ms, never staler than their own interval.
    with trio.fail_after(600):
        async with open_mocked() as log, trio.open_nursery() as nursery:
            leases = [
                await log.acquire_lock(
                    "app", "u", f"s{i}", nursery=nursery, heartbeat_ms=1000 + i,
                    stale_after_ms=3000,
                )
                for i in range(10)
            ]
            calls = writer_calls(log, monkeypatch)
            before = [lease.beats for lease in leases]
            interval_of = {lease.session: lease.heartbeat_ms / 1000 for lease in leases}
            for _ in range(105):  # ten ticks, and half an interval
                await trio.sleep(0.1)
                for row in await log.list_locks():
                    assert row.heartbeat_at is not None
                    age = trio_wall_clock() - row.heartbeat_at.timestamp()
                    assert age <= interval_of[row.session] + 1e-6, row.session
            assert [lease.beats - b for lease, b in zip(leases, before, strict=True)] == [10] * 10
            assert len(calls) == 10
            for lease in leases:
                await lease.release()


def test_a_cadence_is_the_heartbeat_to_two_digits_never_longer() -> None:
    assert [cadence_ms(ms) for ms in (50, 99, 100, 109, 150, 999, 1000, 1099, 3333, 30_000)] == [
        50, 99, 100, 100, 150, 990, 1000, 1000, 3300, 30_000,
    ]


class _Named:
    """Stands in for the store to learn how many leases a heartbeat call names."""

    def __init__(self) -> None:
        self.leases = 0

    def heartbeat_leases(self, beats: list[Any], now_us: int) -> list[bool]:
        self.leases = len(beats)
        return [True] * len(beats)


def slow_per_lease(log: EventLog, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make every heartbeat call of ``log`` take ``seconds`` a lease it names
    (a database that refreshes rows slowly), on the mock clock."""
    runner = log.connections.writer
    assert runner is not None
    real = runner.run

    async def run(op: Any) -> Any:
        named = _Named()
        try:
            op(named)
        except AttributeError:
            pass  # not a heartbeat
        await trio.sleep(seconds * named.leases)
        return await real(op)

    monkeypatch.setattr(runner, "run", run)


async def test_a_cadence_one_tick_cannot_beat_whole_beats_in_parts_and_starves_no_lease(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Thirty leases at 1 s on a database that takes 40 ms a lease: their one
    # call took 1.2 s, was cut at the next tick every tick (and rolled back),
    # and none landed. In calls of ten (0.4 s each) a tick lands two and the
    # third is cut; beaten in a fixed order, the last ten never were, and went
    # stale under their healthy holder. Stalest first, each lease is beaten
    # at least twice every three ticks.
    monkeypatch.setattr("streamd.eventlog.heartbeats.LEASES_A_CALL", 10)
    with trio.fail_after(600):
        async with open_mocked() as log, trio.open_nursery() as nursery:
            leases = [
                await log.acquire_lock(
                    "app", "u", f"s{i}", nursery=nursery, heartbeat_ms=1000, stale_after_ms=3000
                )
                for i in range(30)
            ]
            slow_per_lease(log, monkeypatch, 0.04)
            oldest = 0.0
            for _ in range(40):  # 20 s
                await trio.sleep(0.5)
                for row in await log.list_locks():
                    assert row.heartbeat_at is not None
                    oldest = max(oldest, trio_wall_clock() - row.heartbeat_at.timestamp())
            assert oldest < 2.5  # two ticks and a call at most: inside the 3 s window
            assert min(lease.beats for lease in leases) >= 12
            assert not any(lease.lost.is_set() for lease in leases)
            monkeypatch.undo()
            for lease in leases:
                await lease.release()


async def test_an_on_lost_that_raises_reaches_the_nursery_the_lease_was_taken_with(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
) -> None:
    async def on_lost(lease: Lease) -> None:
        raise RuntimeError(f"told that {lease.session} was lost")

    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b:
            with pytest.raises(ExceptionGroup) as info:
                async with trio.open_nursery() as nursery:
                    await a.acquire_lock(
                        "app", "u", "s", nursery=nursery, heartbeat_ms=1000,
                        stale_after_ms=3000, on_lost=on_lost,
                    )
                    shrink_window(tmp_path / "events.db", "s")
                    await b.acquire_lock("app", "u", "s")
                    await trio.sleep_forever()  # until on_lost raises here
            (error,) = info.value.exceptions
            assert isinstance(error, RuntimeError) and str(error) == "told that s was lost"
            assert await a.latest_seq() == 0  # the log serves on


async def test_a_lease_whose_nursery_is_cancelled_stops_beating_and_close_releases_it(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as b:
            async with open_mocked() as a:
                other = await a.acquire_lock(
                    "app", "u", "t", heartbeat_ms=1000, stale_after_ms=30_000
                )
                async with trio.open_nursery() as nursery:
                    lease = await a.acquire_lock(
                        "app", "u", "s", nursery=nursery, heartbeat_ms=1000,
                        stale_after_ms=30_000,
                    )
                    await trio.sleep(2.5)
                    assert lease.beats == 2
                    nursery.cancel_scope.cancel()
                await trio.sleep(5)
                # Its heartbeat ended with the nursery; the other of its cadence
                # beats on, and the log still holds both.
                assert lease.beats == 2 and not lease.lost.is_set()
                assert other.beats == 7
                assert a.lease(lease.lock) is lease
            # Closed: both rows deleted, long before the 30 s window ran out.
            taken = await b.acquire_lock("app", "u", "s")
            await taken.release()


async def test_a_beat_that_raises_what_no_store_call_should_is_retried_and_the_log_serves_on(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: the error left the cadence's task, which runs in the log's
    # nursery, and took the log down with it: every client's calls failed.
    with trio.fail_after(600):
        async with open_mocked() as log:
            leases = [
                await log.acquire_lock("app", "u", f"s{i}", heartbeat_ms=1000,
                                       stale_after_ms=3000)
                for i in range(2)
            ]
            beat = SqliteStore.heartbeat_leases

            def broken_once(self: SqliteStore, *args: Any) -> list[bool]:
                monkeypatch.setattr(SqliteStore, "heartbeat_leases", beat)  # the first alone
                raise ValueError("a fault no store call should raise")

            monkeypatch.setattr(SqliteStore, "heartbeat_leases", broken_once)
            await trio.sleep(1.5)  # the first tick: the beat raises
            assert [lease.beats for lease in leases] == [0, 0]
            assert "heartbeat failed for 2 lease(s)" in caplog.text
            await trio.sleep(1)  # the next tick beats both
            assert [lease.beats for lease in leases] == [1, 1]
            assert not any(lease.lost.is_set() for lease in leases)
            await log.append("app", "u", "other", ev("served"))
            for lease in leases:
                await lease.release()
