"""The database file deleted or replaced under a running log.

A connection holds its files by descriptor, so without a check a log whose
files were deleted goes on acknowledging appends into nameless files (all lost
at exit), and one whose file was replaced by a restore leaves its old ``-wal``
beside the restored file, where the next opener applies it. Every test here
failed before the guard of :mod:`streamd.eventlog.sqlite.file_identity`.

In-process tests drive :class:`EventLog` (its default dispatch, ``apsw.aio``);
the process tests run ``python -m streamd`` on stdio and ``streamd daemon`` on
its socket, and look at what a user looks at: the answers, the daemon's log,
``streamd status``, and the files left on disk after SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
from support.resident import World, make_world

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.model import Event, SinceParams
from streamd.eventlog.sqlite import SqliteStore
from streamd.eventlog.sqlite.connection import BusyWait
from streamd.eventlog.sqlite.file_identity import FAULT_REASON
from streamd.eventlog.sqlite.store import GUARD_WAIT_S

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
STOPPED = "EVENT LOG STOPPED"


def ev(i: int | str) -> Event:
    return Event(id=f"e{i}", author="agent", content=f"content {i}")


def remove_all(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink()


def make_restorable(path: Path, n: int) -> None:
    """A closed, checkpointed log of ``n`` events: what a backup is."""
    store = SqliteStore.open(str(path))
    store.append_batch([_params(f"r{i}") for i in range(n)], 1_700_000_000_000_000)
    store.close()
    assert not Path(f"{path}-wal").exists()


def _params(event_id: str) -> Any:
    from streamd.eventlog.model import AppendParams, checked

    return checked(
        AppendParams,
        app="app",
        user="u",
        session="restored",
        event=Event(id=event_id, author="agent", content=event_id),
    )


def event_ids(path: Path) -> list[str]:
    store = SqliteStore.open(str(path), migrate=False)
    try:
        assert store.connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return [e.event.id for e in store.since(SinceParams(from_seq=0, limit=10_000)).entries]
    finally:
        store.close()


def assert_fault(exc: RpcError, cause: str) -> None:
    assert exc.code == SOURCE_UNAVAILABLE
    assert cause in exc.message and "restart" in exc.message
    assert isinstance(exc.data, dict) and exc.data["reason"] == FAULT_REASON


def stopped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if STOPPED in r.getMessage()]


# --- in process ----------------------------------------------------------------------


async def test_after_the_files_are_deleted_no_append_is_acknowledged_and_nothing_is_recreated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "ev.db"
    caplog.set_level(logging.ERROR)
    with trio.fail_after(60):
        async with EventLog(db) as log:
            assert (await log.append("app", "u", "s", ev(0))).seq == 1
            remove_all(db)
            for i in range(1, 4):
                with pytest.raises(RpcError) as raised:
                    await log.append("app", "u", "s", ev(i))
                assert_fault(raised.value, f"database file {db} was deleted")
            for read in (log.since, log.latest_seq, log.ping):
                with pytest.raises(RpcError) as raised:
                    await read()
                assert_fault(raised.value, "was deleted")
            assert log.fault is not None and "was deleted" in log.fault
    assert len(stopped_lines(caplog)) == 1
    assert not any(Path(f"{db}{s}").exists() for s in ("", "-wal", "-shm"))


@pytest.mark.parametrize("call_after", [True, False], ids=["append-after", "close-at-once"])
async def test_a_file_restored_by_rename_under_the_log_keeps_all_its_events(
    tmp_path: Path, call_after: bool
) -> None:
    db, backup = tmp_path / "ev.db", tmp_path / "backup.db"
    make_restorable(backup, 300)
    with trio.fail_after(60):
        async with EventLog(db) as log:
            for i in range(10):
                await log.append("app", "u", "s", ev(i))
            os.rename(backup, db)
            if call_after:
                with pytest.raises(RpcError) as raised:
                    await log.append("app", "u", "s", ev("late"))
                assert_fault(raised.value, "was replaced by another file")
                with pytest.raises(RpcError):
                    await log.since()
    # The log closed (as at SIGTERM); whoever opens the path next sees the
    # restored file, whole, and not the old log's write-ahead log.
    assert event_ids(db) == [f"r{i}" for i in range(300)]
    assert event_ids(db) == [f"r{i}" for i in range(300)]  # and again, after that open


async def test_the_old_file_moved_aside_keeps_what_was_committed_to_it(tmp_path: Path) -> None:
    db, aside, backup = tmp_path / "ev.db", tmp_path / "ev.old.db", tmp_path / "backup.db"
    make_restorable(backup, 5)
    with trio.fail_after(60):
        async with EventLog(db) as log:
            for i in range(10):
                await log.append("app", "u", "s", ev(i))
            os.rename(db, aside)
            os.rename(backup, db)
            with pytest.raises(RpcError):
                await log.append("app", "u", "s", ev("late"))
    assert event_ids(db) == [f"r{i}" for i in range(5)]
    # What the old log acknowledged is in the old file, where the user put it;
    # the append that got the error was refused before its work (the guard
    # compares before a call as well as after it), so it is in neither.
    assert event_ids(aside) == [f"e{i}" for i in range(10)]


async def test_an_old_wal_a_reader_holds_is_said_once_and_never_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process reading the file keeps the old -wal from being emptied
    # after a move; each later call tries again, without waiting for the
    # reader (the busy timeout held the first errors back 10 s and 5 s, and
    # every call queued behind them). A client that retries used to write an
    # error line per call (megabytes a minute), burying the stop.
    db, aside = tmp_path / "ev.db", tmp_path / "ev.old.db"
    caplog.set_level(logging.WARNING)
    waited: list[float] = []
    real = BusyWait.__call__

    def spied(self: BusyWait, prior_calls: int) -> bool:
        waited.append(self.timeout if self.waits else 0.0)
        return real(self, prior_calls)

    monkeypatch.setattr(BusyWait, "__call__", spied)
    with trio.fail_after(60):
        async with EventLog(db, busy_timeout_ms=5000) as log:
            for i in range(10):
                await log.append("app", "u", "s", ev(i))
            reader = apsw.Connection(str(db))
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM events").fetchall()
            os.rename(db, aside)
            for i in range(20):
                with pytest.raises(RpcError):
                    await log.append("app", "u", "s", ev(f"late{i}"))
            # Met the reader, and waited a moment for it, not the busy timeout.
            assert waited and max(waited) <= GUARD_WAIT_S
            reader.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(stopped_lines(caplog)) == 1
    assert sum("could not be emptied" in m for m in said) == 1, said
    assert event_ids(aside) == [f"e{i}" for i in range(10)]


async def test_a_deleted_write_ahead_log_stops_the_log_too(tmp_path: Path) -> None:
    db = tmp_path / "ev.db"
    with trio.fail_after(60):
        async with EventLog(db) as log:
            await log.append("app", "u", "s", ev(0))
            Path(f"{db}-wal").unlink()
            with pytest.raises(RpcError) as raised:
                await log.append("app", "u", "s", ev(1))
            assert_fault(raised.value, f"write-ahead log {db}-wal was deleted")
            assert "same event id is safe" in raised.value.message
    assert not Path(f"{db}-wal").exists()  # not recreated by the close
    # What the deleted -wal held was acknowledged: emptied into the database
    # through the open descriptors, not lost with the file.
    assert event_ids(db) == ["e0"]


async def test_both_side_files_deleted_keep_what_was_acknowledged(tmp_path: Path) -> None:
    # ``rm events.db-wal events.db-shm``: the usual way to "clean up" SQLite's
    # files. Nobody made a new index, so ours empties the deleted -wal into
    # the database, whose schema was in that -wal too.
    db = tmp_path / "ev.db"
    with trio.fail_after(60):
        async with EventLog(db) as log:
            for i in range(5):
                await log.append("app", "u", "s", ev(i))
            Path(f"{db}-wal").unlink()
            Path(f"{db}-shm").unlink()
            with pytest.raises(RpcError) as raised:
                await log.append("app", "u", "s", ev("late"))
            assert "what was acknowledged before is kept" in raised.value.message
    assert event_ids(db) == [f"e{i}" for i in range(5)]


# Another process appending to the file, as a second daemon or an agent's
# in-process log would: its own connection, so its own -shm when ours is gone.
_OTHER_PROCESS = """
import sys
from streamd.eventlog.model import AppendParams, Event, checked
from streamd.eventlog.sqlite import SqliteStore
store = SqliteStore.open(sys.argv[1])
for i in range(int(sys.argv[2])):
    store.append_batch([checked(AppendParams, app="app", user="u", session="other",
                                event=Event(id=f"o{i}", author="agent", content="x"))],
                       1_700_000_000_000_000)
store.close()
"""


async def test_a_deleted_shm_is_never_written_through_once_another_process_made_its_own(
    tmp_path: Path,
) -> None:
    # Our index of the -wal is in the deleted -shm; a process that opens the
    # path now builds a new one and appends where ours says the -wal ends. A
    # write of ours after that overwrote its acknowledged appends (all of them
    # lost, or the file no longer a database).
    db = tmp_path / "ev.db"
    with trio.fail_after(120):
        async with EventLog(db) as log:
            for i in range(5):
                await log.append("app", "u", "s", ev(i))
            Path(f"{db}-shm").unlink()
            other = await trio.run_process(
                [sys.executable, "-c", _OTHER_PROCESS, str(db), "20"], capture_stderr=True,
                check=False)
            assert other.returncode == 0, other.stderr
            with pytest.raises(RpcError) as raised:
                await log.append("app", "u", "s", ev("late"))
            assert_fault(raised.value, f"shared-memory index {db}-shm")
            assert "same event id is safe" in raised.value.message
    assert event_ids(db) == [f"e{i}" for i in range(5)] + [f"o{i}" for i in range(20)]


async def test_a_live_watch_ends_with_the_cause(tmp_path: Path) -> None:
    db = tmp_path / "ev.db"
    with trio.fail_after(60):
        async with EventLog(db) as log:
            await log.append("app", "u", "s", ev(0))
            async with log.watch(0) as watch:
                first = await watch.__anext__()
                assert first.seq == 1
                remove_all(db)
                with pytest.raises(RpcError):
                    await log.append("app", "u", "s", ev(1))
                with pytest.raises(RpcError) as raised:
                    await watch.__anext__()
                assert_fault(raised.value, "was deleted")


# --- the real processes -----------------------------------------------------------------


def _append(i: int | str) -> dict[str, Any]:
    return {
        "app": "app",
        "user": "u",
        "session": "s",
        "event": {"id": f"e{i}", "author": "agent", "content": f"c{i}"},
    }


class Stdio:
    """``python -m streamd --db DB`` on stdio, one request at a time."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "-v", "--db", str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO / "src"))},
        )
        self.ids = iter(range(1, 10**6))

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request_id = next(self.ids)
        line = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(line).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            frame = json.loads(self.proc.stdout.readline())
            if frame.get("id") == request_id:
                return frame

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return err.decode()


def test_the_stdio_daemon_refuses_to_acknowledge_appends_into_deleted_files(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ev.db"
    daemon = Stdio(db)
    try:
        for i in range(10):
            assert "result" in daemon.call("eventlog/append", _append(i))
        remove_all(db)
        for i in range(10, 20):
            reply = daemon.call("eventlog/append", _append(i))
            assert reply["error"]["code"] == -32000, reply
            assert f"{db} was deleted" in reply["error"]["message"]
        for method, params in (("eventlog/since", {"from_seq": 0}), ("eventlog/ping", {})):
            reply = daemon.call(method, params)
            assert reply["error"]["code"] == -32000 and "was deleted" in reply["error"]["message"]
    finally:
        err = daemon.stop()
    assert err.count(STOPPED) == 1, err
    assert not any(Path(f"{db}{s}").exists() for s in ("", "-wal", "-shm"))


def test_the_stdio_daemon_leaves_a_file_restored_under_it_whole_after_sigterm(
    tmp_path: Path,
) -> None:
    db, backup = tmp_path / "ev.db", tmp_path / "backup.db"
    make_restorable(backup, 300)
    daemon = Stdio(db)
    try:
        for i in range(10):
            assert "result" in daemon.call("eventlog/append", _append(i))
        os.rename(backup, db)
        reply = daemon.call("eventlog/append", _append("late"))
        assert reply["error"]["code"] == -32000
        assert "was replaced by another file" in reply["error"]["message"]
    finally:
        daemon.stop()
    assert event_ids(db) == [f"r{i}" for i in range(300)]


@pytest.fixture
def world():
    yield from make_world()


def test_the_resident_daemon_shows_a_deleted_log_in_status(world: World) -> None:
    proc = world.start_daemon()
    db = world.state / "streamd" / "events.db"
    with world.connect() as conn:
        assert "result" in conn.call("eventlog/append", **_append(0))
        remove_all(db)
        reply = conn.call("eventlog/append", **_append(1))
        assert reply["error"]["code"] == -32000 and "was deleted" in reply["error"]["message"]
        reply = conn.call("eventlog/since", from_seq=0)
        assert reply["error"]["code"] == -32000
        status = world.run("status")
        assert status.returncode == 0, status.stderr
        assert "EVENT LOG FAULT" in status.stdout and f"{db} was deleted" in status.stdout
        info = json.loads(world.run("status", "--json").stdout)
        assert "was deleted" in info["db_fault"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert world.log.read_text().count(STOPPED) == 1
    assert not db.exists()


def test_status_of_a_healthy_log_has_no_fault(world: World) -> None:
    world.start_daemon()
    with world.connect() as conn:
        assert "result" in conn.call("eventlog/append", **_append(0))
        assert conn.result("streamd/status")["db_fault"] is None
    assert STOPPED not in world.run("status").stdout


def test_no_new_connection_opens_a_path_whose_file_was_replaced(tmp_path: Path) -> None:
    """A second connection would open the restored file with the old -wal
    beside it: the guard the connections share refuses before opening."""
    from streamd.eventlog.sqlite.file_identity import DatabaseFile

    db, backup = tmp_path / "ev.db", tmp_path / "backup.db"
    make_restorable(backup, 300)
    guard = DatabaseFile(str(db))
    first = SqliteStore.open(str(db), guard=guard)
    first.append(_params("mine"), 1_700_000_000_000_000)
    os.rename(backup, db)
    with pytest.raises(RpcError) as raised:
        SqliteStore.open(str(db), guard=guard)
    assert_fault(raised.value, "was replaced by another file")
    with pytest.raises(RpcError):
        first.since(SinceParams(from_seq=0, limit=10))  # the first connection has heard it too
    first.close()
    assert event_ids(db) == [f"r{i}" for i in range(300)]


async def test_a_symlinked_path_is_checked_where_sqlite_keeps_its_files(tmp_path: Path) -> None:
    real = tmp_path / "data" / "ev.db"
    real.parent.mkdir()
    link = tmp_path / "ev.db"
    link.symlink_to(real)
    with trio.fail_after(60):
        async with EventLog(link) as log:
            await log.append("app", "u", "s", ev(0))
            await log.append("app", "u", "s", ev(1))  # no false alarm on a symlink
            Path(f"{real}-wal").unlink()  # beside the real file, not the link
            with pytest.raises(RpcError) as raised:
                await log.append("app", "u", "s", ev(2))
            assert_fault(raised.value, f"write-ahead log {real}-wal was deleted")


async def test_every_eventlog_method_answers_the_cause_over_json_rpc(daemon: Any) -> None:
    """Through the RPC layer (the daemon fixture: one log, memory connections):
    a watch running when the file goes, and every kind of call after."""
    db = Path(str(daemon.log.path))
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(30):
        c = await daemon.connect()
        await c.result("eventlog/append", _append(0))
        watch_id = await c.start("eventlog/watch", {"from_seq": 0})
        assert (await c.notification())["params"]["entry"]["seq"] == 1
        remove_all(db)
        calls = [
            ("eventlog/append", _append(1)),
            ("eventlog/append_batch", {"appends": [_append(2)]}),
            ("eventlog/since", {"from_seq": 0}),
            ("eventlog/latest_seq", {}),
            ("eventlog/branches", {}),
            ("eventlog/sessions.get", key),
            ("eventlog/sessions.list", {"app": "app"}),
            ("eventlog/sessions.create", {"app": "app", "user": "u"}),
            ("eventlog/sessions.delete", key),
            ("eventlog/lock.acquire", key),
            ("eventlog/state.get", {"app": "app"}),
            ("eventlog/boot.record", {"at": "2026-01-01T00:00:00Z", "attempted": []}),
            ("eventlog/ping", {}),
        ]
        for method, params in calls:
            err = await c.error(method, params)
            assert err["code"] == -32000 and "was deleted" in err["message"], (method, err)
            assert err["data"]["reason"] == FAULT_REASON
        reply = await c.response(watch_id)  # the running watch ended with it too
        assert reply["error"]["code"] == -32000 and "was deleted" in reply["error"]["message"]
        # Saying where a watcher resumes, as every end of a watch does.
        assert reply["error"]["data"]["last_seq"] == 1
        assert reply["error"]["message"].endswith("resume with from_seq=1")
        late_watch = await c.start("eventlog/watch", {"from_seq": 0})
        assert (await c.response(late_watch))["error"]["code"] == -32000
