"""The SQLite writer's runner: a worker thread of its own, and a lone append
committed inline on the event loop thread, which never waits for another
connection's lock there. Real threads and the real clock; every test is
bounded by ``trio.fail_after``."""

from __future__ import annotations

import threading
from pathlib import Path

import apsw
import pytest
import trio
from support.eventlog import ev

from streamd.eventlog import EventLog, SqliteStore, inline
from streamd.eventlog.model import AppendParams
from streamd.eventlog.sqlite import SqliteOptions
from streamd.eventlog.sqlite.runner import NOT_RUN, ConnectionRunner


@pytest.fixture(autouse=True)
def never_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded test machine's slow fsync must not move appends off the inline
    path (that has a test of its own, below)."""
    monkeypatch.setattr(inline, "SLOW_WRITE_S", float("inf"))


def _count(path: Path) -> int:
    db = apsw.Connection(str(path))
    try:
        return db.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        db.close()


async def test_a_lone_append_commits_inline_and_is_durable_at_once(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with EventLog(db) as log:
            for i in range(3):
                await log.append("a", "u", "s", ev(f"e{i}", {"n": i}))
                # Acknowledged means committed: another connection sees it.
                assert _count(db) == i + 1
            assert log.stats.inline_commits == 3
            assert log.stats.batches == 3


async def test_appends_that_arrive_together_still_share_one_commit_on_the_worker(
    tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("first"))
            inline = log.stats.inline_commits
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(log.append, "a", "u", "s", ev(f"e{i}"))
            assert await log.latest_seq() == 51
            assert log.stats.largest_batch > 1
            # A batch of many is never committed on the event loop thread.
            assert log.stats.inline_commits - inline < log.stats.batches - 1


async def test_an_inline_append_never_waits_on_the_event_loop_for_another_connections_lock(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(30):
        async with EventLog(db, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("before"))
            other = apsw.Connection(str(db))
            other.execute("BEGIN IMMEDIATE")  # another process's write lock
            done = trio.Event()

            async def append() -> None:
                await log.append("a", "u", "s", ev("blocked"))
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(append)
                # The event loop keeps turning while the append waits for the
                # lock (on the worker thread, in its busy handler).
                turns = 0
                with trio.move_on_after(0.3):
                    while True:
                        await trio.sleep(0.01)
                        turns += 1
                assert turns >= 10 and not done.is_set()
                other.execute("COMMIT")
                other.close()
            assert done.is_set()
            assert await log.latest_seq() == 2
            assert log.stats.inline_commits == 1  # "before" only


async def test_an_inline_attempt_on_a_locked_database_writes_nothing_and_says_so(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(30):
        runner = await ConnectionRunner.open(str(db), SqliteOptions())
        try:
            other = apsw.Connection(str(db))
            other.execute("BEGIN IMMEDIATE")
            params = AppendParams(app="a", user="u", session="s", event=ev("x"))
            started = trio.current_time()
            assert runner.try_inline(lambda s: s.append(params, 1)) is NOT_RUN
            assert trio.current_time() - started < 0.5  # refused, not waited for
            other.execute("ROLLBACK")
            other.close()
            assert _count(db) == 0
            seq = runner.try_inline(lambda s: s.append(params, 1)).seq
            assert seq == 1 and _count(db) == 1
        finally:
            await runner.aclose()


async def test_nothing_runs_inline_while_the_worker_has_a_call(tmp_path: Path) -> None:
    with trio.fail_after(30):
        runner = await ConnectionRunner.open(str(tmp_path / "events.db"), SqliteOptions())
        try:
            release = threading.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(runner.run, lambda s: release.wait(20))
                await trio.sleep(0.05)
                assert not runner.idle
                assert runner.try_inline(lambda s: "ran") is NOT_RUN
                release.set()
            assert runner.idle
            assert runner.try_inline(lambda s: "ran") == "ran"
        finally:
            await runner.aclose()


async def test_a_cancelled_call_is_interrupted_on_the_worker_and_the_next_one_runs(
    tmp_path: Path,
) -> None:
    count = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000)"
        " SELECT count(*) FROM c"
    )

    def endless(store: SqliteStore) -> int:
        return store.connection.execute(count).fetchone()[0]

    with trio.fail_after(30):
        runner = await ConnectionRunner.open(str(tmp_path / "events.db"), SqliteOptions())
        try:
            with trio.move_on_after(0.2) as scope:
                await runner.run(endless)
            assert scope.cancelled_caught
            # A billion rows would take minutes: the statement was interrupted.
            with trio.fail_after(5):
                assert await runner.run(lambda s: s.latest_seq(None)) == 0
        finally:
            await runner.aclose()


async def test_a_slow_inline_commit_keeps_the_next_ones_on_the_worker_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline, "SLOW_WRITE_S", 0.0)  # every commit is "slow"
    monkeypatch.setattr(inline, "BACKOFF_S", 60.0)
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            for i in range(5):
                await log.append("a", "u", "s", ev(f"e{i}"))
            assert log.stats.inline_commits == 1
            assert await log.latest_seq() == 5


async def test_the_wal_is_checkpointed_beside_the_writes_and_stays_bounded(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    body = {"text": "x" * 3000}  # a page or more of WAL per append
    with trio.fail_after(120):
        async with EventLog(db, synchronous="NORMAL") as log:
            for i in range(1500):
                await log.append("a", "u", "s", ev(f"e{i}", body))
            while log.checkpoints.running:  # the last one may still run
                await trio.sleep(0.01)
            assert log.stats.checkpoints >= 1
            assert log.stats.inline_commits > 1400  # not while the writer catches up
            # Never started over, the WAL of these 1,500 appends would hold
            # over 60 MB; it holds the 1,000 pages that call for a checkpoint
            # and what was appended while it ran.
            assert Path(f"{db}-wal").stat().st_size < 16 << 20
        assert _count(db) == 1500


async def test_the_writer_makes_no_checkpoint_of_its_own(tmp_path: Path) -> None:
    with trio.fail_after(60):
        runner = await ConnectionRunner.open(str(tmp_path / "events.db"), SqliteOptions("NORMAL"))
        try:
            for i in range(300):
                params = AppendParams(app="a", user="u", session="s",
                                      event=ev(f"e{i}", {"text": "x" * 3000}))
                runner.try_inline(lambda s, p=params: s.append(p, 1))
            assert runner.wal_pages > 1000  # SQLite's own would have reset it
        finally:
            await runner.aclose()


async def test_writes_that_are_not_appends_keep_the_wal_bounded_too(tmp_path: Path) -> None:
    # Sessions created with a few KB of state each: a page or more of WAL per write,
    # and never an append to trigger the checkpoint that follows a batch.
    db = tmp_path / "events.db"
    state = {"blob": "y" * 3000}
    with trio.fail_after(120):
        async with EventLog(db, synchronous="NORMAL") as log:
            for i in range(1500):
                await log.create_session("a", "u", f"s{i}", state=state)
            while log.stats.checkpoints == 0 or log.checkpoints.running:
                await trio.sleep(0.01)
            # Never checkpointed, the WAL of these writes would hold over 60 MB.
            assert Path(f"{db}-wal").stat().st_size < 16 << 20
