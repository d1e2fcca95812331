"""The Trio layer: lazy open, group commit, typed Python calls, sessions, boots, close.

Watches and leases have their own files (``eventlog/test_watch.py``,
``eventlog/test_lease.py``). Every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import datetime as dt
import re
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
import trio.testing
from support.eventlog import ev

from streamd.errors import (
    CLOSED,
    EVENT_CONFLICT,
    INVALID_PARAMS,
    RpcError,
    is_closed,
    is_session_not_found,
)
from streamd.eventlog import EventLog, Filter, SqliteStore, resolve_db_path


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    """The production dispatch (apsw.aio worker threads) on the real clock."""
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        yield log


# --- opening ------------------------------------------------------------------


@pytest.fixture
def default_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default database of a user whose state directory is empty."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("STREAMD_DB", raising=False)
    return tmp_path / "state" / "streamd" / "events.db"


async def test_no_database_file_exists_until_the_first_operation(default_location: Path) -> None:
    path = default_location
    with trio.fail_after(10):
        async with EventLog() as log:
            assert not path.parent.exists() and not log.opened
        assert not path.parent.exists()
        async with EventLog() as log:
            assert await log.latest_seq() == 0
            assert log.opened and path.exists()


async def test_database_file_and_its_directory_are_private_to_the_user(
    default_location: Path,
) -> None:
    path = default_location
    with trio.fail_after(10):
        async with EventLog() as log:
            await log.ping()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_a_log_made_through_a_dangling_symlink_is_private_too(tmp_path: Path) -> None:
    target = tmp_path / "real" / "events.db"
    target.parent.mkdir()
    link = tmp_path / "events.db"
    link.symlink_to(target)
    with trio.fail_after(10):
        async with EventLog(link) as log:
            await log.ping()
    assert link.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


async def test_a_symlink_into_a_missing_directory_is_refused_naming_the_log(
    tmp_path: Path,
) -> None:
    link = tmp_path / "events.db"
    link.symlink_to(tmp_path / "gone" / "events.db")
    target = tmp_path / "gone" / "events.db"
    said = re.escape(f"cannot create event log {link} (a symlink to {target}): No such")
    with trio.fail_after(10), pytest.raises(RpcError, match=said):
        async with EventLog(link) as log:
            await log.ping()


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
    "acquire_lock": lambda log: log.acquire_lock("app", "u", "s"),
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
                # The append is now with the writer's thread, which waits inside
                # SQLite for the lock (up to the 60 s busy timeout); close gives
                # it half a second, then interrupts it.
                await trio.testing.wait_all_tasks_blocked()
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


async def test_a_completion_callback_that_raises_leaves_the_batch_answered_and_the_writer_on(
    tmp_path: Path,
) -> None:
    from streamd.eventlog import AppendParams

    answered: list[Any] = []
    done = trio.Event()

    def bad(outcome: Any) -> None:
        raise RuntimeError("a reply that cannot be written")

    def good(outcome: Any) -> None:
        answered.append(outcome)
        if len(answered) == 3:
            done.set()

    def params(i: int) -> AppendParams:
        return AppendParams(app="app", user="u", session="s", event=ev(f"e{i}"))

    async with EventLog(tmp_path / "e.db", synchronous="NORMAL") as log:
        await log.ping()  # opened, so the three below share one batch
        with trio.fail_after(10):
            log.submit_append(params(0), good)
            log.submit_append(params(1), bad)
            log.submit_append(params(2), good)
            later = await log.append("app", "u", "s", ev("later"))
            log.submit_append(params(3), good)
            await done.wait()
    assert [a.seq for a in answered] == [1, 3, later.seq + 1]
    assert later.seq == 4
