"""Leases: exclusive per session, judged by the holder's own window, kept by a
heartbeat that notices a steal and survives a failing disk.

Timing runs under the mock clock (``support.eventlog.mocked``), except one
test on real time and real threads, which says why. Every test is bounded by
``trio.fail_after``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import mocked, trio_wall_clock

from streamd.errors import INVALID_PARAMS, SESSION_LOCKED, SOURCE_UNAVAILABLE, RpcError, is_closed
from streamd.eventlog import EventLog, Lease


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    """The production dispatch (apsw.aio worker threads) on the real clock."""
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        yield log


@pytest.fixture
def open_mocked(tmp_path: Path) -> Callable[..., EventLog]:
    return functools.partial(mocked, tmp_path / "events.db")


Run = Callable[[Any], Awaitable[Any]]
"""A runner's ``run``: one store operation on the log's writer."""


async def through_the_writer_once(
    log: EventLog, monkeypatch: pytest.MonkeyPatch, wrap: Callable[[Run, Any], Awaitable[Any]]
) -> None:
    """The log's next call on its writer (an acquire, in these tests) runs as
    ``wrap(real_run, op)``; the calls after it as before."""
    await log.latest_seq()  # opened (on the reader), so the writer exists
    next_write_through(log, monkeypatch, wrap)


def next_write_through(
    log: EventLog, monkeypatch: pytest.MonkeyPatch, wrap: Callable[[Run, Any], Awaitable[Any]]
) -> None:
    """:func:`through_the_writer_once` on a log already open, without an
    await: a call already started (not yet run) is the one it catches."""
    runner = log.connections.writer
    assert runner is not None
    real = runner.run

    async def once(op: Any) -> Any:
        monkeypatch.setattr(runner, "run", real)
        return await wrap(real, op)

    monkeypatch.setattr(runner, "run", once)


async def answered_late(real: Run, op: Any) -> Any:
    """The operation runs (its transaction commits); its answer comes 10 s later."""
    result = await real(op)
    await trio.sleep(10)
    return result


async def closed_after_the_acquire_committed(
    open_mocked: Callable[..., EventLog],
    monkeypatch: pytest.MonkeyPatch,
    wrap: Callable[[Run, Any], Awaitable[Any]],
) -> None:
    """Log A closes while its acquire, run as ``wrap(real_run, op)``, has
    committed and not been answered; the acquire must raise ``closed``, and log
    B must then take the session's lease at once (no row of A's left to lock it)."""
    async with open_mocked() as b, trio.open_nursery() as nursery:
        async with open_mocked() as a:
            await through_the_writer_once(a, monkeypatch, wrap)

            async def acquire() -> None:
                with pytest.raises(RpcError) as info:
                    await a.acquire_lock("app", "u", "s", nursery=nursery)
                assert is_closed(info.value)

            nursery.start_soon(acquire)
            await trio.sleep(1)  # committed, not answered
        lease = await b.acquire_lock("app", "u", "s", nursery=nursery)
        await lease.release()


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
    runner = log.connections.writer
    writer = getattr(runner, "store", runner)  # the store under its runner
    real = writer.heartbeat_leases
    state = {"paused": True}

    def heartbeats(*args: Any) -> list[bool]:
        if state["paused"]:
            raise RpcError(SOURCE_UNAVAILABLE, "disk I/O error")
        return real(*args)

    monkeypatch.setattr(writer, "heartbeat_leases", heartbeats)
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
            writer = a.connections.writer
            real = writer.heartbeat_leases
            failures = {"left": 3}

            def flaky(*args: Any) -> list[bool]:
                if failures["left"]:
                    failures["left"] -= 1
                    raise RpcError(SOURCE_UNAVAILABLE, "disk I/O error")
                return real(*args)

            monkeypatch.setattr(writer, "heartbeat_leases", flaky)
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
            while True:  # each attempt is a real transaction: no sleep needed
                try:
                    new = await b.acquire_lock(
                        "app", "u", "s", nursery=nursery, heartbeat_ms=50, stale_after_ms=150
                    )
                    break
                except RpcError as exc:
                    assert exc.code == SESSION_LOCKED
            stolen_at = trio.current_time()
            beats["paused"] = False
            await old.lost.wait()
            assert trio.current_time() - stolen_at < 0.05 + 0.5
            assert not new.lost.is_set()
            await new.release()


async def test_a_lease_taken_without_a_nursery_beats_in_the_logs_until_released(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with open_mocked() as log:
            lease = await log.acquire_lock("app", "u", "s", heartbeat_ms=5000)
            await trio.sleep(21)
            assert lease.beats == 4 and log.lease(lease.lock) is lease
            await lease.release()
            # A heartbeat still running would find the row gone and call it lost.
            await trio.sleep(60)
            assert lease.beats == 4 and not lease.lost.is_set()
            assert log.lease(lease.lock) is None and await log.list_locks() == []


async def test_an_on_lost_that_raises_in_the_logs_nursery_leaves_the_log_serving(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def on_lost(lease: Lease) -> None:
        raise RuntimeError("a bug in the caller's callback")

    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b:
            old = await a.acquire_lock("app", "u", "s", on_lost=on_lost)
            beats = _pause_heartbeats(a, monkeypatch)
            await trio.sleep(31)  # past its 30 s window without a beat
            new = await b.acquire_lock("app", "u", "s")
            beats["paused"] = False
            await old.lost.wait()
            await trio.testing.wait_all_tasks_blocked()  # on_lost has raised by now
            assert await a.latest_seq() == 0  # the log still serves
            await new.release()


def _slow_writes(log: EventLog, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make every write of ``log`` take ``seconds`` (a slow database that still
    answers), on the mock clock."""
    runner = log.connections.writer
    assert runner is not None
    real = runner.run

    async def run(op: Any) -> Any:
        await trio.sleep(seconds)
        return await real(op)

    monkeypatch.setattr(runner, "run", run)


async def test_a_holder_whose_beats_the_database_slows_within_the_interval_is_never_stale(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A beats every 5 s and promises 10 s (the floor allows twice the beat).
    # Its database then takes 4 s for each beat, inside the beat's bound: every
    # beat succeeds. Counted from the end of the previous beat, the beats
    # started 9 s apart and each landed 4 s later, so the lease was 13 s old
    # before a beat landed and B took it from a healthy holder.
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            held = await a.acquire_lock(
                "app", "u", "s", nursery=nursery, stale_after_ms=10_000, heartbeat_ms=5000
            )
            _slow_writes(a, monkeypatch, 4)
            await trio.sleep(0.5)
            for _ in range(24):  # every second and a half, for 36 s
                await trio.sleep(1.5)
                with pytest.raises(RpcError) as info:
                    await b.acquire_lock("app", "u", "s", nursery=nursery)
                assert info.value.code == SESSION_LOCKED
                assert info.value.data["heartbeat_age_ms"] < 10_000
            assert not held.lost.is_set() and held.beats >= 6
            await held.release()


async def test_a_beat_the_stalled_database_timed_out_is_retried_as_soon_as_it_times_out(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A promises 15 s and beats every 5 s (a third). Its database stalls for
    # 5.5 s from the beat at 5 s, which times out at 10 s. The database answers
    # again at 10.5 s; waiting a whole interval after the timed-out beat, the
    # next beat came only at 15 s, when the lease had already gone stale.
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            t0 = trio.current_time()
            held = await a.acquire_lock("app", "u", "s", nursery=nursery, stale_after_ms=15_000)
            runner = a.connections.writer
            assert runner is not None
            real = runner.run

            async def stalled(op: Any) -> Any:
                await trio.sleep_until(t0 + 10.5)
                return await real(op)

            monkeypatch.setattr(runner, "run", stalled)
            await trio.sleep_until(t0 + 11)
            monkeypatch.setattr(runner, "run", real)
            (row,) = await b.list_locks()
            assert row.heartbeat_at is not None
            # The retry began when the stalled beat timed out, at 10 s, and was
            # written when the database answered, at 10.5 s.
            assert trio_wall_clock() - row.heartbeat_at.timestamp() == pytest.approx(0.5)
            assert held.beats == 1 and not held.lost.is_set()
            await held.release()


async def test_an_acquire_cancelled_after_its_row_was_written_leaves_no_lease_behind(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The acquire's transaction commits, then its caller is cancelled before
    # the answer comes back (a deadline, a client's cancel; with a server, the
    # cancel request reaching it after the COMMIT). The row was left with a
    # holder nobody knew and no heartbeat: every acquire, the caller's retry
    # included, was session_locked until it went stale (30 s by default).
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            await through_the_writer_once(a, monkeypatch, answered_late)
            with trio.move_on_after(1) as cancelled:
                await a.acquire_lock("app", "u", "s", nursery=nursery)
            assert cancelled.cancelled_caught
            await trio.testing.wait_all_tasks_blocked()
            lease = await b.acquire_lock("app", "u", "s", nursery=nursery)
            await lease.release()


async def test_a_lease_that_waited_for_the_database_is_stamped_when_it_is_written(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A promises 6 s and beats every 2 s; its acquire waits 4.5 s for the
    # log's writer (queued behind its other writes: a big batch, a retention
    # step).
    # Stamped with the time it was asked for, the new lease was 4.5 s old when
    # written, and stale before its first beat (2 s after the acquire returned):
    # B took it at 6.2 s from its healthy holder.
    with trio.fail_after(600):
        async with open_mocked() as a, open_mocked() as b, trio.open_nursery() as nursery:
            async def waited(real: Run, op: Any) -> Any:
                await trio.sleep(4.5)
                return await real(op)

            await through_the_writer_once(a, monkeypatch, waited)
            t0 = trio.current_time()
            held = await a.acquire_lock(
                "app", "u", "s", nursery=nursery, stale_after_ms=6000, heartbeat_ms=2000
            )
            await trio.sleep_until(t0 + 6.2)
            with pytest.raises(RpcError) as info:
                await b.acquire_lock("app", "u", "s", nursery=nursery)
            assert info.value.code == SESSION_LOCKED
            assert info.value.data["heartbeat_age_ms"] == 1700
            await trio.sleep(10)
            assert not held.lost.is_set()
            await held.release()


async def test_an_acquire_the_close_cut_short_after_its_commit_leaves_no_lease_behind(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The log closed (the daemon stopping) after an acquire's transaction
    # committed and before its answer: the acquire raised "closed", and the
    # row, of a holder nobody knew, locked the session for its whole window
    # after the restart (the close released only the leases it knew).
    with trio.fail_after(600):
        await closed_after_the_acquire_committed(open_mocked, monkeypatch, answered_late)


async def test_a_lease_whose_log_file_was_replaced_is_lost_once_not_beaten_for_ever(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The row went with the old file, and a daemon started on the restored
    # one may grant the session to another: the holder must stop. Before, the
    # heartbeat warned every interval and the holder never heard.
    db = tmp_path / "events.db"
    with trio.fail_after(600):
        async with open_mocked() as a, trio.open_nursery() as nursery:
            told: list[Lease] = []

            async def on_lost(lease: Lease) -> None:
                told.append(lease)

            lease = await a.acquire_lock(
                "app", "u", "s", nursery=nursery, heartbeat_ms=5000, on_lost=on_lost
            )
            restored = tmp_path / "restored.db"
            restored.write_bytes(db.read_bytes())
            os.replace(restored, db)
            await trio.sleep(6)
            assert lease.lost.is_set() and told == [lease]
            await trio.sleep(60)  # no more beats, so no more warnings
            beats_failed = [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
            assert beats_failed == []
            await lease.release()


async def test_an_acquire_whose_cancel_the_close_waits_out_leaves_no_lease_behind(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As a PostgreSQL or MariaDB runner does: a call the close cancels after
    # its commit waits (shielded) for the server to answer the cancel, and
    # only then raises. The close had by then found no unanswered acquire and
    # gone on: the row, of a holder nobody knew, locked the session for its
    # whole window after the restart.
    async def cancel_waited_out(real: Run, op: Any) -> Any:
        result = await real(op)
        try:
            await trio.sleep(10)  # the answer on its way back
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await trio.sleep(0.2)  # the cancel's round trip
            raise
        return result

    with trio.fail_after(600):
        await closed_after_the_acquire_committed(open_mocked, monkeypatch, cancel_waited_out)


async def test_an_unanswered_acquire_whose_release_failed_is_released_at_close(
    open_mocked: Callable[..., EventLog],
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The release of an acquire cancelled after its commit failed (the disk
    # for a moment): the row was then forgotten, and the close left it to lock
    # the session for its whole window after the restart.
    with trio.fail_after(600):
        async with open_mocked() as b, trio.open_nursery() as nursery:
            async with open_mocked() as a:
                await through_the_writer_once(a, monkeypatch, answered_late)
                with trio.move_on_after(1) as cancelled:
                    await a.acquire_lock("app", "u", "s", nursery=nursery)
                assert cancelled.cancelled_caught
                tried: list[Any] = []

                async def failing(real: Run, op: Any) -> Any:
                    tried.append(op)
                    raise RpcError(SOURCE_UNAVAILABLE, "disk I/O error")

                # No await since the cancel: the release, started by it, has
                # not run yet, and is the next call on the writer.
                next_write_through(a, monkeypatch, failing)
                await trio.testing.wait_all_tasks_blocked()
                assert len(tried) == 1  # the release was tried, and failed
            lease = await b.acquire_lock("app", "u", "s", nursery=nursery)
            await lease.release()
