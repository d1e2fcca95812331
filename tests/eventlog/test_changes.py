"""FileChanges: a wake when the database may have changed, from inotify or a poll.

The filter and the recheck schedule are tested without a loop. The inotify
tests write real SQLite databases on the real clock (a thread or a process
commits), except where the autojump clock measures the recheck schedule: there
the writes are made synchronously, before the wait, so no thread runs while the
clock jumps. Every test is bounded by ``trio.fail_after``; ``move_on_after``
bounds only a wait that must *not* return.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import apsw
import pytest
import trio
import trio.testing

from streamd.eventlog.sqlite import changes
from streamd.eventlog.sqlite.changes import (
    IN_CREATE,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    FileChanges,
    Rechecks,
    judge,
    wakes,
    watched_names,
)

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")

IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_CLOSE_WRITE = 0x00000008
INTERVAL = 0.2
# How long a wait that must not return is given: many times the measured wake
# latency (about 1 ms), so a wrong wake has every chance to show.
QUIET = 0.3


@pytest.fixture(autouse=True)
def _inotify_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite may run with the variable set (say, on NFS); these tests choose.
    monkeypatch.delenv(changes.NO_INOTIFY_ENV, raising=False)
    monkeypatch.setattr(changes, "_announced", set())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every INotify made, kept alive: CPython closes a dropped FileIO itself,
    which would hide an fd the code forgot to close."""
    import inotify_simple

    instances: list[object] = []

    class Kept(inotify_simple.INotify):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            instances.append(self)

    monkeypatch.setattr(inotify_simple, "INotify", Kept)
    return instances


def make_db(path: Path) -> None:
    """A WAL database with a table, every connection closed (so setting it up
    leaves no event queued for a watch armed afterwards)."""
    db = apsw.Connection(str(path))
    db.pragma("journal_mode", "wal")
    db.execute("CREATE TABLE t(v)")
    db.close()


def commit_row(path: Path, value: object = 1) -> None:
    db = apsw.Connection(str(path))
    try:
        with db:
            db.execute("INSERT INTO t VALUES (?)", (value,))
    finally:
        db.close()


class Event:
    def __init__(self, mask: int, name: str) -> None:
        self.mask = mask
        self.name = name


# -- the filter, without a loop --

NAMES = watched_names("events.db")


def test_writes_to_the_database_and_its_wal_wake() -> None:
    for name in ("events.db", "events.db-wal"):
        for mask in (IN_MODIFY, IN_MOVED_TO, IN_CREATE):
            assert wakes(mask, name, NAMES), (mask, name)


def test_writes_to_other_names_do_not_wake() -> None:
    for name in ("events.db-shm", "events.db-journal", "other.db-wal", "events.db.bak", ""):
        assert not wakes(IN_MODIFY, name, NAMES), name


def test_events_outside_the_mask_do_not_wake_even_on_the_wal() -> None:
    # SQLite deletes a WAL only once checkpointed (a write to the db already woke
    # us); a close after writing follows the write's own event.
    for mask in (IN_DELETE, IN_CLOSE_WRITE):
        assert not wakes(mask, "events.db-wal", NAMES)


def test_an_overflow_wakes_whatever_its_name() -> None:
    assert wakes(IN_Q_OVERFLOW, "", NAMES)


def test_one_batch_is_one_verdict() -> None:
    batch = [Event(IN_MODIFY, "other"), Event(IN_MODIFY, "events.db-wal"), Event(IN_MODIFY, "x")]
    assert judge(batch, NAMES) == (True, False)
    assert judge([Event(IN_MODIFY, "other"), Event(IN_MODIFY, "events.db-shm")], NAMES) == (
        False,
        False,
    )
    assert judge([], NAMES) == (False, False)


def test_a_dropped_watch_is_lost_and_wakes() -> None:
    verdict = judge([Event(IN_DELETE_SELF, ""), Event(IN_IGNORED, "")], NAMES)
    assert verdict.lost and verdict.wake


# -- the recheck schedule, without a loop --


def schedule(r: Rechecks, start: float) -> list[float]:
    """The times rechecks come at, each handed out when due, until none is."""
    times = []
    while (due := r.due()) != math.inf:
        times.append(round(due - start, 6))
        r.fired(due)
    return times


def test_rechecks_double_from_the_first_up_to_the_cap_and_stop_at_the_horizon() -> None:
    r = Rechecks(first=0.001, cap=0.2, horizon=1.0)
    assert r.due() == math.inf  # nothing seen, nothing to settle
    r.saw_write(10.0)
    times = schedule(r, 10.0)
    gaps = [round(b - a, 6) for a, b in zip([0.0, *times], times, strict=False)]
    assert gaps[:8] == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128]
    assert set(gaps[8:]) == {0.2}
    assert times[-1] <= 1.0 < times[-1] + 0.2


def test_a_new_write_restarts_the_schedule() -> None:
    r = Rechecks(first=0.001, cap=0.2, horizon=1.0)
    r.saw_write(0.0)
    for _ in range(5):
        r.fired(r.due())
    r.saw_write(5.0)
    assert r.due() == pytest.approx(5.001)


# -- inotify, on real files --


@linux_only
async def test_a_commit_from_a_thread_wakes_a_parked_waiter(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    with trio.fail_after(10):
        async with FileChanges(db, fallback_interval=60) as fc:
            assert fc.mode == "inotify"
            woke = trio.Event()

            async def waiter() -> None:
                await fc.wait()
                woke.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                assert not woke.is_set()
                await trio.to_thread.run_sync(commit_row, db)
                await woke.wait()


@linux_only
async def test_a_commit_between_entry_and_the_first_wait_is_not_lost(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    with trio.fail_after(10):
        async with FileChanges(db, fallback_interval=60) as fc:
            await trio.to_thread.run_sync(commit_row, db)
            await fc.wait()


@linux_only
async def test_writes_to_other_files_in_the_directory_do_not_wake(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    other = tmp_path / "other.db"
    make_db(other)
    with trio.fail_after(10):
        async with FileChanges(db, fallback_interval=60) as fc:
            # Another database's commits (its WAL, its -shm), and plain files.
            await trio.to_thread.run_sync(commit_row, other)
            (tmp_path / "notes.txt").write_text("x")
            (tmp_path / "events.db.bak").write_text("x")
            with trio.move_on_after(QUIET):
                await fc.wait()
                pytest.fail("woke for a write to another file")
            # The watch was live all along: our own file still wakes it.
            await trio.to_thread.run_sync(commit_row, db)
            await fc.wait()


@linux_only
async def test_a_database_replaced_by_rename_wakes(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    restored = tmp_path / "restore.tmp"
    make_db(restored)
    with trio.fail_after(10):
        async with FileChanges(db, fallback_interval=60) as fc:
            restored.rename(db)
            await fc.wait()


@linux_only
async def test_a_symlinked_path_watches_the_directory_sqlite_writes_in(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").mkdir()
    make_db(tmp_path / "real" / "events.db")
    link = tmp_path / "link" / "events.db"
    link.symlink_to(tmp_path / "real" / "events.db")
    with trio.fail_after(10):
        async with FileChanges(link, fallback_interval=60) as fc:
            await trio.to_thread.run_sync(commit_row, link)
            await fc.wait()


WRITER = textwrap.dedent(
    """
    import sys, apsw
    db = apsw.Connection(sys.argv[1])
    db.pragma("journal_mode", "wal")
    db.pragma("synchronous", "FULL")
    with db:
        db.execute("INSERT INTO t VALUES (1)")
    # Stay connected: closing checkpoints and deletes the WAL, whose events
    # would come after the commit is visible and hide a wake that came early.
    sys.stdin.read()
    """
)


@linux_only
async def test_a_commit_from_another_process_wakes_a_waiter_once_it_is_readable(
    tmp_path: Path,
) -> None:
    # With synchronous=FULL the commit's last event comes before the fsync and
    # before the commit is published in -shm (mmap, no event), so a wait that
    # returned only on events would find nothing here and never return again.
    db = tmp_path / "events.db"
    make_db(db)
    reader = apsw.Connection(str(db))
    with trio.fail_after(20):
        async with FileChanges(db, fallback_interval=60) as fc:
            before = reader.pragma("data_version")  # after arming, as the log must
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-c", WRITER, str(db)], stdin=subprocess.PIPE
            )
            wakes_seen = 0
            while reader.pragma("data_version") == before:
                await fc.wait()
                wakes_seen += 1
            assert reader.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
            assert wakes_seen >= 1
            assert proc.stdin is not None
            await proc.stdin.aclose()
            assert await proc.wait() == 0
            assert fc.mode == "inotify"
    reader.close()


async def wake_times(fc: FileChanges) -> list[float]:
    """When each wait() returned, from now, until none has for well past the
    settle horizon (under the mock clock)."""
    start = trio.current_time()
    times = []
    with trio.move_on_after(changes.SETTLE_HORIZON + 30):
        while True:
            await fc.wait()
            times.append(round(trio.current_time() - start, 6))
    return times


@linux_only
async def test_a_commit_expected_without_an_event_is_rechecked_for(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Another process may have written its WAL frames before the watch was armed
    # and made them visible after (its fsync): no event comes for that commit, so
    # the caller asks for rechecks from entry. Without them the first wait would
    # last until a write or the caller's safety poll.
    db = tmp_path / "events.db"
    make_db(db)
    with trio.fail_after(60):
        async with FileChanges(db, fallback_interval=INTERVAL) as fc:
            fc.expect_commit()
            times = await wake_times(fc)
    assert times[:3] == [0.001, 0.003, 0.007]
    assert times[-1] <= changes.SETTLE_HORIZON


@linux_only
async def test_after_a_write_rechecks_follow_then_stop_at_the_horizon(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    with trio.fail_after(60):
        async with FileChanges(db, fallback_interval=INTERVAL) as fc:
            commit_row(db)  # synchronously: no thread runs while the clock jumps
            await fc.wait()  # the event
            times = await wake_times(fc)
    assert times[:4] == [0.001, 0.003, 0.007, 0.015]
    assert times[-1] <= changes.SETTLE_HORIZON
    assert times[-1] + INTERVAL > changes.SETTLE_HORIZON


@linux_only
async def test_the_fd_is_closed_on_exit(tmp_path: Path, made: list[object]) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    before = open_fds()
    with trio.fail_after(10):
        async with FileChanges(db, fallback_interval=60) as fc:
            assert fc.mode == "inotify"
            assert open_fds() == before + 1
    assert open_fds() == before
    assert len(made) == 1


@linux_only
async def test_the_fd_is_closed_when_a_waiter_is_cancelled(
    tmp_path: Path, made: list[object]
) -> None:
    db = tmp_path / "events.db"
    make_db(db)
    before = open_fds()

    async def watch(task_status: trio.TaskStatus[FileChanges]) -> None:
        async with FileChanges(db, fallback_interval=60) as fc:
            task_status.started(fc)
            await fc.wait()
            pytest.fail("nothing was written")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            fc = await nursery.start(watch)
            await trio.testing.wait_all_tasks_blocked()
            assert fc.mode == "inotify"
            assert open_fds() == before + 1
            nursery.cancel_scope.cancel()
    assert open_fds() == before
    assert len(made) == 1
    with pytest.raises(trio.ClosedResourceError):
        await fc.wait()


@linux_only
async def test_a_deleted_directory_turns_the_watch_into_polling(
    tmp_path: Path, made: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "state"
    d.mkdir()
    make_db(d / "events.db")
    before = open_fds()
    caplog.set_level(logging.INFO, logger=changes.__name__)
    with trio.fail_after(10):
        async with FileChanges(d / "events.db", fallback_interval=0.01) as fc:
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
            while fc.mode == "inotify":
                await fc.wait()
            assert open_fds() == before  # the dead watch's fd is not kept
            await fc.wait()  # and the poll still wakes
    assert "dropped the watch" in caplog.text
    assert len(made) == 1


# -- the fallback --


async def test_the_env_var_selects_polling_which_wakes_every_interval(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(changes.NO_INOTIFY_ENV, "1")
    caplog.set_level(logging.INFO, logger=changes.__name__)
    before = open_fds() if sys.platform == "linux" else 0
    with trio.fail_after(60):
        async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL) as fc:
            assert fc.mode == "poll"
            assert changes.NO_INOTIFY_ENV in fc.reason
            if sys.platform == "linux":
                assert open_fds() == before
            for _ in range(3):
                start = trio.current_time()
                await fc.wait()
                assert trio.current_time() - start == pytest.approx(INTERVAL)
    assert "polling" in caplog.text and changes.NO_INOTIFY_ENV in caplog.text


async def test_the_env_var_at_zero_leaves_inotify_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(changes.NO_INOTIFY_ENV, "0")
    with trio.fail_after(10):
        async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL) as fc:
            assert fc.mode == ("inotify" if sys.platform == "linux" else "poll")


async def test_the_fallback_is_logged_once_per_process(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(changes.NO_INOTIFY_ENV, "1")
    caplog.set_level(logging.INFO, logger=changes.__name__)
    with trio.fail_after(10):
        for _ in range(3):
            async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL):
                pass
    assert len([r for r in caplog.records if r.name == changes.__name__]) == 1


@linux_only
@pytest.mark.parametrize(("where", "code"), [("add_watch", errno.ENOSPC), ("init", errno.EMFILE)])
async def test_an_inotify_that_cannot_be_set_up_falls_back_without_leaking(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    made: list[object],
    where: str,
    code: int,
) -> None:
    import inotify_simple

    class Refusing(inotify_simple.INotify):
        def __init__(self, *args: object, **kwargs: object) -> None:
            if where == "init":
                raise OSError(code, os.strerror(code))
            super().__init__(*args, **kwargs)  # a real fd, which must not leak

        def add_watch(self, path: object, mask: int) -> int:
            raise OSError(code, os.strerror(code))

    monkeypatch.setattr(inotify_simple, "INotify", Refusing)
    make_db(tmp_path / "events.db")
    before = open_fds()
    with trio.fail_after(60):
        async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL) as fc:
            assert fc.mode == "poll"
            assert os.strerror(code) in fc.reason
            assert open_fds() == before
            start = trio.current_time()
            await fc.wait()
            assert trio.current_time() - start == pytest.approx(INTERVAL)
    assert open_fds() == before
    assert len(made) == (where == "add_watch")


async def test_without_inotify_simple_it_polls(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "inotify_simple", None)  # import raises ImportError
    with trio.fail_after(10):
        async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL) as fc:
            assert fc.mode == "poll"
            assert "inotify_simple" in fc.reason


async def test_off_linux_it_polls(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(changes.sys, "platform", "darwin")
    with trio.fail_after(10):
        async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL) as fc:
            assert fc.mode == "poll"
            assert "darwin" in fc.reason


# -- use --


async def test_it_is_entered_once_and_waited_on_only_inside(tmp_path: Path) -> None:
    fc = FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL)
    with pytest.raises(trio.ClosedResourceError):
        await fc.wait()
    async with fc:
        pass
    with pytest.raises(RuntimeError):
        async with fc:
            pass


def test_a_fallback_interval_must_be_positive(tmp_path: Path) -> None:
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError):
            FileChanges(tmp_path / "events.db", fallback_interval=bad)


async def test_an_import_of_inotify_simple_failing_for_want_of_descriptors_polls(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With every descriptor taken, the import's listing of a sys.path directory
    # fails with EMFILE (an OSError, not an ImportError): seen in a daemon whose
    # descriptors a flood of connections had taken as a watch started.
    class Exhausted:
        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            if name == "inotify_simple":
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(tmp_path))

    monkeypatch.delitem(sys.modules, "inotify_simple", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Exhausted(), *sys.meta_path])
    with trio.fail_after(10):
        async with FileChanges(tmp_path / "events.db", fallback_interval=INTERVAL) as fc:
            assert fc.mode == "poll"
            assert "Too many open files" in fc.reason
