"""Many leases at once: a close, or a connection's end, releases them a
thousand a store call; a connection, and a log, hold a bounded number.

Under the mock clock with the store on the event loop (``mocked``): a store
call takes no time, so what is asserted is how many calls reach the writer,
never how long they take. Each test bounded by ``trio.fail_after``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import mocked, writer_calls
from support.service import Daemonish

from streamd.errors import RpcError
from streamd.eventlog import service
from streamd.eventlog.lease_budget import MAX_LEASES_PER_CONNECTION

# Long enough that no heartbeat runs while the test does (mock time barely moves).
HOURLY = {"heartbeat_ms": 3_600_000, "stale_after_ms": 10_800_000}


async def test_a_close_releases_thousands_of_held_leases_a_thousand_a_store_call(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One write a lease: 2,500 calls, some 150 of which fit the close's
    # half-second grace on a real disk; the rest stayed locked until stale.
    with trio.fail_after(600):
        log = mocked(tmp_path / "events.db", retention_interval=0)
        async with log:
            for i in range(2500):
                await log.acquire_lock("app", "u", f"s{i}", **HOURLY)
            calls = writer_calls(log, monkeypatch)
        assert len(calls) == 3
        async with mocked(tmp_path / "events.db", retention_interval=0) as again:
            assert await again.list_locks() == []


async def test_a_connection_that_ends_releases_its_leases_in_one_store_call_not_one_each(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(600):
        async with (
            mocked(tmp_path / "events.db", retention_interval=0) as log,
            trio.open_nursery() as nursery,
        ):
            daemon = Daemonish.serving(log, nursery)
            holder, other = await daemon.connect(), await daemon.connect()
            for i in range(800):
                await holder.result(
                    "eventlog/lock.acquire", {"app": "app", "user": "u", "session": f"s{i}",
                                              **HOURLY},
                )
            kept = await other.result(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "kept", **HOURLY}
            )
            calls = writer_calls(log, monkeypatch)
            await holder.hang_up()  # gone without releasing
            assert len(calls) == 1
            assert [info.session for info in await log.list_locks()] == ["kept"]
            assert await other.result("eventlog/lock.release", {"lock": kept["lock"]}) == {}
            nursery.cancel_scope.cancel()


async def test_a_lease_stolen_before_its_connection_ends_stays_its_thiefs(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with (
            mocked(tmp_path / "events.db", retention_interval=0) as log,
            trio.open_nursery() as nursery,
        ):
            daemon = Daemonish.serving(log, nursery)
            holder = await daemon.connect()
            short = {"heartbeat_ms": 50, "stale_after_ms": 150}
            taken = [
                await holder.result(
                    "eventlog/lock.acquire", {"app": "app", "user": "u", "session": session,
                                              **short},
                )
                for session in ("a", "b")
            ]
            # b's holder stops beating (its row left as it is), and a thief
            # takes it once stale: the holder's end must not delete the thief's.
            lease = log.lease(taken[1]["lock"])
            assert lease is not None
            lease.stop_heartbeat()
            await trio.sleep(1)
            thief = await log.acquire_lock("app", "u", "b", **HOURLY)
            await holder.hang_up()
            assert [(i.session, i.holder) for i in await log.list_locks()] == [
                ("b", thief.holder)
            ]
            await thief.release()
            nursery.cancel_scope.cancel()


async def test_a_connection_past_its_lease_bound_is_refused_budget_exceeded_and_others_are_not(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with (
            mocked(tmp_path / "events.db", retention_interval=0) as log,
            trio.open_nursery() as nursery,
        ):
            daemon = Daemonish.serving(log, nursery)
            holder, other = await daemon.connect(), await daemon.connect()
            taken = [
                await holder.result("eventlog/lock.acquire", _key(f"s{i}"))
                for i in range(MAX_LEASES_PER_CONNECTION)
            ]
            err = await holder.error("eventlog/lock.acquire", _key("one-more"))
            assert err["code"] == -32006
            assert err["data"] == {
                "reason": "too_many_leases", "limit": MAX_LEASES_PER_CONNECTION,
                "scope": "connection",
            }
            assert "this connection holds 1000 leases" in err["message"]
            # Nothing was written for it, and another client takes it.
            assert await other.result("eventlog/lock.acquire", _key("one-more"))
            # A release makes room again.
            await holder.result("eventlog/lock.release", {"lock": taken[0]["lock"]})
            assert await holder.result("eventlog/lock.acquire", _key("again"))
            nursery.cancel_scope.cancel()


async def test_acquires_in_flight_count_against_a_connections_lease_bound(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(600):
        async with (
            mocked(tmp_path / "events.db", retention_interval=0) as log,
            trio.open_nursery() as nursery,
        ):
            monkeypatch.setattr(service, "MAX_LEASES_PER_CONNECTION", 3)
            daemon = Daemonish.serving(log, nursery)
            holder = await daemon.connect()
            # The writer held up: the acquires that reach it wait there, in
            # flight, none held yet.
            await log.synchronous_level()  # the writer's connection opened
            runner = log.connections.writer
            assert runner is not None
            real, gate = runner.run, trio.Event()

            async def held_up(op: Any) -> Any:
                await gate.wait()
                return await real(op)

            monkeypatch.setattr(runner, "run", held_up)
            ids = [await holder.start("eventlog/lock.acquire", _key(f"s{i}")) for i in range(5)]
            # Counted with only what was held, all five reached the writer,
            # and none was answered until it went on. Which two are refused is
            # the scheduler's choice: the requests run as tasks.
            refused = await holder.first_responses(ids, 2)
            assert [r["error"]["data"]["reason"] for r in refused.values()] == [
                "too_many_leases"] * 2
            gate.set()
            for taken in (i for i in ids if i not in refused):
                assert "result" in await holder.response(taken)
            assert len(await log.list_locks()) == 3
            nursery.cancel_scope.cancel()


async def test_a_log_past_its_lease_bound_refuses_one_more_before_writing_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(600):
        async with mocked(tmp_path / "events.db", retention_interval=0, max_leases=3) as log:
            held = [await log.acquire_lock("app", "u", f"s{i}", **HOURLY) for i in range(3)]
            calls = writer_calls(log, monkeypatch)
            with pytest.raises(RpcError) as caught:
                await log.acquire_lock("app", "u", "one-more", **HOURLY)
            assert caught.value.code == -32006
            assert caught.value.data == {"reason": "too_many_leases", "limit": 3, "scope": "log"}
            assert calls == []
            await held[0].release()
            assert (await log.acquire_lock("app", "u", "one-more", **HOURLY)).session == "one-more"


def _key(session: str) -> dict[str, object]:
    return {"app": "app", "user": "u", "session": session, **HOURLY}


async def test_acquires_whose_orphan_rows_could_not_be_deleted_do_not_use_up_the_logs_bound(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An acquire cancelled in flight leaves a row that may have committed; a
    # failed delete of it (the database away a moment) kept it among the
    # unanswered until close, and each counted against --max-leases for
    # good: after enough cancelled retries in an outage, every acquire was
    # refused too_many_leases by a log that held none. Such a row has no
    # heartbeat, no task, and goes stale: it is no lease to bound.
    from streamd.errors import SOURCE_UNAVAILABLE

    with trio.fail_after(600):
        async with mocked(tmp_path / "events.db", retention_interval=0, max_leases=1) as log:
            await log.synchronous_level()  # the writer's connection opened
            runner = log.connections.writer
            assert runner is not None
            real, entered = runner.run, trio.Event()

            async def away(op: Any) -> Any:
                if not entered.is_set():
                    entered.set()
                    await trio.sleep_forever()  # the acquire, cancelled here
                raise RpcError(SOURCE_UNAVAILABLE, "the database is away")

            monkeypatch.setattr(runner, "run", away)
            with trio.move_on_after(1):
                await log.acquire_lock("app", "u", "s0", **HOURLY)
            await trio.testing.wait_all_tasks_blocked()  # its orphan's delete failed
            monkeypatch.setattr(runner, "run", real)
            lease = await log.acquire_lock("app", "u", "s1", **HOURLY)
            assert lease.session == "s1"
            await lease.release()
