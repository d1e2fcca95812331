"""In-process clients of one file on one event loop share its connection
(:mod:`streamd.client.local_log`).

What sharing must keep: each client closes on its own and the file stays
open while any holds it (counted here as the process's descriptors open on
the database file: one connection holds one); a client dropped unclosed lets
go; different options get a connection of their own; a client's close waits
for what it handed the worker; and a file restored under the log is not
shared again, nor is the old write-ahead log applied to the restored file.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import os
import threading
import weakref
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import apsw
import pytest
from support.local_files import backup_of, descriptors_on, held, local_workers

from streamd import errors
from streamd.client.local import LocalClient
from streamd.client.local_log import OLD_FILE_OPEN, OLD_WAL_LEFT, OpenLog
from streamd.errors import RpcError
from streamd.eventlog.model import Event
from streamd.eventlog.sqlite import SqliteStore

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def ev(event_id: str) -> Event:
    return Event(id=event_id, author="agent", content=None, timestamp=T0)


def run(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(60):
            return await coro

    return asyncio.run(bounded())


async def event_ids(client: LocalClient) -> list[str]:
    got = await client.since(0)
    return [entry.event.id for entry in got.entries]


def test_clients_of_one_file_share_one_connection_until_the_last_closes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        first = await LocalClient.open(db)
        one = descriptors_on(db)
        assert one >= 1
        second = await LocalClient.open(db)
        assert descriptors_on(db) == one  # no second connection
        await first.append("app", "u", "s", ev("e1"))
        await first.aclose()
        with pytest.raises(RpcError) as closed:
            await first.ping()
        assert closed.value.code == errors.CLOSED
        # The other client is untouched by its sibling's close.
        assert descriptors_on(db) == one
        assert (await second.append("app", "u", "s", ev("e2"))).seq == 2
        assert await event_ids(second) == ["e1", "e2"]
        await second.aclose()
        assert descriptors_on(db) == 0

    run(scenario())


def test_clients_opening_at_once_share_one_connection(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        alone = await LocalClient.open(db)
        one = descriptors_on(db)
        await alone.aclose()
        clients = await asyncio.gather(*(LocalClient.open(db) for _ in range(4)))
        assert descriptors_on(db) == one
        for client in clients:
            await client.aclose()
        assert descriptors_on(db) == 0

    run(scenario())


def test_other_options_get_a_connection_of_their_own(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        full = await LocalClient.open(db, synchronous="FULL")
        one = descriptors_on(db)
        normal = await LocalClient.open(db, synchronous="NORMAL")
        assert descriptors_on(db) == 2 * one
        await normal.append("app", "u", "s", ev("e1"))
        assert await event_ids(full) == ["e1"]
        await full.aclose()
        await normal.aclose()
        assert descriptors_on(db) == 0

    run(scenario())


def test_a_client_dropped_unclosed_lets_go_of_the_file(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        dropped = await LocalClient.open(db)
        kept = await LocalClient.open(db)
        await dropped.append("app", "u", "s", ev("e1"))
        del dropped
        gc.collect()
        assert await event_ids(kept) == ["e1"]
        await kept.aclose()  # the last holder now: the file closes
        assert descriptors_on(db) == 0

    run(scenario())


def test_a_close_waits_for_the_calls_its_client_handed_the_worker(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        leaving = await LocalClient.open(db)
        staying = await LocalClient.open(db)
        await leaving.create_session("app", "u", "s")
        other = apsw.Connection(str(db))
        other.execute("BEGIN IMMEDIATE")  # another process's write lock
        append = asyncio.ensure_future(leaving.append("app", "u", "s", ev("e1")))
        while leaving.in_flight == 0:  # handed to the worker, waiting for the lock
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(leaving.aclose())
        for _ in range(3):
            await asyncio.sleep(0)
        assert not closing.done()  # the append it handed over has not run
        other.execute("COMMIT")
        other.close()
        await closing
        assert (await append).seq == 1
        assert await event_ids(staying) == ["e1"]
        await staying.aclose()

    run(scenario())


def test_a_restored_file_is_opened_anew_once_the_old_clients_close_without_the_old_wal(
    tmp_path: Path,
) -> None:
    """A restore (another file renamed over the path) under an open log: an
    open is refused while the old file's clients hold it, they fail naming
    the cause, and once they are closed the path opens as restored (the old
    -wal, still at the path, was emptied into the old file at their close,
    not applied to the new one)."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"

    async def scenario() -> None:
        old = await LocalClient.open(db)
        await old.append("app", "u", "s", ev("e1"))
        backup_of(db, backup)
        await old.append("app", "u", "s", ev("e2"))  # in the old -wal only
        os.replace(backup, db)
        with pytest.raises(RpcError) as refused:
            await LocalClient.open(db)
        assert refused.value.data["reason"] == OLD_FILE_OPEN
        assert "Close the services or clients still open on it" in refused.value.message
        with pytest.raises(RpcError) as stopped:
            await old.ping()
        assert stopped.value.data["reason"] == "database_file_replaced"
        await old.aclose()
        new = await LocalClient.open(db)
        assert await event_ids(new) == ["e1"]
        assert (await new.append("app", "u", "s", ev("e3"))).seq == 2
        await new.aclose()

    run(scenario())
    restored = apsw.Connection(str(db))
    assert restored.execute("SELECT event_id FROM events ORDER BY seq").fetchall() == [
        ("e1",), ("e3",)
    ]
    restored.close()


def test_an_open_cancelled_while_it_checks_a_replaced_file_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"
    checking, go_on = threading.Event(), threading.Event()
    monkeypatch.setattr(SqliteStore, "check_file",
                        held(SqliteStore.check_file, checking, go_on))

    async def scenario() -> None:
        old = await LocalClient.open(db)
        await old.append("app", "u", "s", ev("e1"))
        backup_of(db, backup)
        os.replace(backup, db)
        opening = asyncio.ensure_future(LocalClient.open(db))
        await asyncio.to_thread(checking.wait, 30)
        opening.cancel()
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await opening
        await old.aclose()
        assert descriptors_on(db) == 0

    run(scenario())
    assert local_workers() == []


def test_a_path_that_cannot_be_looked_up_fails_the_open_clearly_and_holds_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        first = await LocalClient.open(db)
        await first.ping()
        shm = Path(f"{db}-shm")
        shm.unlink()
        shm.symlink_to(shm.name)  # a link to itself: ELOOP for every look-up
        with pytest.raises(RpcError) as failed:
            await LocalClient.open(db)
        assert failed.value.code == errors.SOURCE_UNAVAILABLE
        assert "symbolic links" in failed.value.message
        await first.aclose()
        assert descriptors_on(db) == 0

    run(scenario())
    assert local_workers() == []


def test_opens_that_wait_for_one_another_do_not_keep_their_event_loop(tmp_path: Path) -> None:
    """A new file's first open migrates it on the worker; a second open
    waits for it, which binds its lock to the loop. The loop must still go
    with its run."""
    loops = []

    async def scenario(db: Path) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        clients = await asyncio.gather(LocalClient.open(db), LocalClient.open(db))
        for client in clients:
            await client.aclose()

    for i in range(3):
        run(scenario(tmp_path / f"events{i}.db"))
    assert local_workers() == []  # a closed file's worker holds its last work a moment
    gc.collect()
    assert [loop() for loop in loops] == [None, None, None]


def test_a_file_reached_through_a_linked_directory_is_the_same_file(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)

    async def scenario() -> None:
        direct = await LocalClient.open(real / "events.db")
        one = descriptors_on(real / "events.db")
        linked = await LocalClient.open(tmp_path / "link" / "events.db")
        assert descriptors_on(real / "events.db") == one
        await direct.aclose()
        await linked.aclose()

    run(scenario())


def test_a_restore_under_two_loops_logs_opens_anew_only_once_both_have_closed(
    tmp_path: Path,
) -> None:
    """Two event loops (ADK runs turns on loops of their own) with the file
    open, then a restore: an open on either is refused while the other
    loop's old log lives (a new connection would share the old -wal it
    writes into); once both are closed the restored file opens as restored
    and keeps what it acknowledges."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"
    first_loop, second_loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        a = first_loop.run_until_complete(LocalClient.open(db))
        b = second_loop.run_until_complete(LocalClient.open(db))
        first_loop.run_until_complete(a.append("app", "u", "s", ev("e1")))
        backup_of(db, backup)
        first_loop.run_until_complete(a.append("app", "u", "s", ev("e2")))
        os.replace(backup, db)
        with pytest.raises(RpcError) as refused:
            first_loop.run_until_complete(LocalClient.open(db))
        assert refused.value.data["reason"] == OLD_FILE_OPEN
        with pytest.raises(RpcError) as stopped:
            second_loop.run_until_complete(b.append("app", "u", "s", ev("e4")))
        assert stopped.value.data["reason"] == "database_file_replaced"
        first_loop.run_until_complete(a.aclose())
        with pytest.raises(RpcError) as still:
            first_loop.run_until_complete(LocalClient.open(db))
        assert still.value.data["reason"] == OLD_FILE_OPEN  # b still holds it
        second_loop.run_until_complete(b.aclose())
        renewed = first_loop.run_until_complete(LocalClient.open(db))
        assert first_loop.run_until_complete(renewed.append("app", "u", "s", ev("e3"))).seq == 2
        assert first_loop.run_until_complete(event_ids(renewed)) == ["e1", "e3"]
        first_loop.run_until_complete(renewed.aclose())
    finally:
        first_loop.close()
        second_loop.close()
    restored = apsw.Connection(str(db))
    assert restored.execute("SELECT event_id FROM events ORDER BY seq").fetchall() == [
        ("e1",), ("e3",)
    ]
    restored.close()


def test_an_open_after_a_restore_waits_for_the_old_logs_close_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADK's next turn on a new loop: the old loop's client is let go (its
    file's close queued on its worker), and the new loop opens at once. The
    open waits for that close, then serves the restored file as restored."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"
    closing, go_on = threading.Event(), threading.Event()
    old_loop, new_loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        old = old_loop.run_until_complete(LocalClient.open(db))
        old_loop.run_until_complete(old.append("app", "u", "s", ev("e1")))
        backup_of(db, backup)
        old_loop.run_until_complete(old.append("app", "u", "s", ev("e2")))
        os.replace(backup, db)
        monkeypatch.setattr(SqliteStore, "close", held(SqliteStore.close, closing, go_on))
        old.abandon()  # as the service does with an ended loop's client

        async def next_turn() -> list[str]:
            opening = asyncio.ensure_future(LocalClient.open(db))
            await asyncio.to_thread(closing.wait, 30)
            for _ in range(3):
                await asyncio.sleep(0)
            assert not opening.done()  # waiting for the old connection's close
            go_on.set()
            async with await opening as client:
                return await event_ids(client)

        assert new_loop.run_until_complete(next_turn()) == ["e1"]
    finally:
        old_loop.close()
        new_loop.close()


def test_a_restored_file_is_not_opened_while_the_old_wal_cannot_be_emptied(
    tmp_path: Path,
) -> None:
    """The old log's close cannot empty its -wal while another connection
    reads the old file from before the last write: until that -wal is gone
    from the path, an open is refused, saying so."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"

    async def scenario() -> None:
        old = await LocalClient.open(db)
        await old.append("app", "u", "s", ev("e1"))
        backup_of(db, backup)
        reader = apsw.Connection(str(db))  # another connection reading the old log
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM events").fetchall() == [(1,)]
        await old.append("app", "u", "s", ev("e2"))  # past the reader's snapshot
        os.replace(backup, db)
        await old.aclose()
        for _ in range(2):  # refused as long as the old -wal is there
            with pytest.raises(RpcError) as refused:
                await LocalClient.open(db)
            assert refused.value.code == errors.SOURCE_UNAVAILABLE
            assert refused.value.data["reason"] == OLD_WAL_LEFT
        reader.execute("COMMIT")
        reader.close()
        # What the refusal says to do (the reader's own close may have done it).
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        renewed = await LocalClient.open(db)
        assert await event_ids(renewed) == ["e1"]
        await renewed.aclose()

    run(scenario())


def test_a_change_gone_by_the_time_the_worker_looks_keeps_the_log_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file renamed away and back between the first look and the
    worker's check: the log is still the file's, and still shared."""
    db = tmp_path / "events.db"
    looks = []
    unchanged = SqliteStore.file_unchanged

    def first_look_sees_a_change(store: SqliteStore) -> bool:
        looks.append(store)
        return len(looks) > 1 and unchanged(store)

    monkeypatch.setattr(SqliteStore, "file_unchanged", first_look_sees_a_change)

    async def scenario() -> None:
        first = await LocalClient.open(db)
        one = descriptors_on(db)
        second = await LocalClient.open(db)
        assert descriptors_on(db) == one and len(looks) == 1
        assert (await first.append("app", "u", "s", ev("e1"))).seq == 1
        assert await event_ids(second) == ["e1"]
        await first.aclose()
        await second.aclose()

    run(scenario())


def test_a_client_collected_in_a_reference_cycle_lets_go_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its finalizer runs inside a collection, where a release could
    deadlock: the release is handed to a thread, which closes the file."""
    db = tmp_path / "events.db"
    released = threading.Event()
    release = OpenLog.release

    def noted(log: OpenLog) -> Any:
        closing = release(log)
        if closing is not None:
            closing.result(30)
            released.set()
        return closing

    monkeypatch.setattr(OpenLog, "release", noted)

    async def scenario() -> None:
        client = await LocalClient.open(db)
        await client.append("app", "u", "s", ev("e1"))
        cycle: list[Any] = [client]
        cycle.append(cycle)
        del client, cycle
        gc.collect()
        assert await asyncio.to_thread(released.wait, 30)
        assert descriptors_on(db) == 0

    run(scenario())


def test_an_open_cancelled_on_the_worker_keeps_a_replaced_file_from_opening_until_it_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open cancelled while the worker opens may still open: until that
    connection has closed, a replaced file is not opened beside it (its
    close would move the new connection's commits into the old file)."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"
    opened, go_on = threading.Event(), threading.Event()
    open_store = SqliteStore.open
    calls: list[str] = []

    def held_open(path: str, *args: Any, **kwargs: Any) -> SqliteStore:
        store = open_store(path, *args, **kwargs)
        calls.append(path)
        if len(calls) == 1:
            opened.set()
            go_on.wait(30)
        return store

    monkeypatch.setattr(SqliteStore, "try_open_without_waiting", lambda *a, **k: None)
    monkeypatch.setattr(SqliteStore, "open", held_open)

    async def scenario() -> None:
        opening = asyncio.ensure_future(LocalClient.open(db))
        await asyncio.to_thread(opened.wait, 30)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        backup_of(db, backup)
        os.replace(backup, db)
        with pytest.raises(RpcError) as refused:
            await LocalClient.open(db)
        assert refused.value.data["reason"] == OLD_FILE_OPEN
        go_on.set()
        assert await asyncio.to_thread(local_workers) == []  # the orphan has closed
        async with await LocalClient.open(db) as renewed:
            assert (await renewed.append("app", "u", "s", ev("e1"))).seq == 1

    run(scenario())


def test_an_old_wal_gone_from_the_path_stops_refusing_though_a_new_one_is_made(
    tmp_path: Path,
) -> None:
    """The restore kept the old file (renamed aside): once the old -wal is
    gone, a new -wal made by another process (which may get the old one's
    inode number, were it free) does not pass for it."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"

    async def scenario() -> None:
        old = await LocalClient.open(db)
        await old.append("app", "u", "s", ev("e1"))
        backup_of(db, backup)
        reader = apsw.Connection(str(db))
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchall()
        await old.append("app", "u", "s", ev("e2"))
        os.rename(db, tmp_path / "events.db.before-restore")
        os.rename(backup, db)
        await old.aclose()  # cannot empty its -wal past the reader
        with pytest.raises(RpcError) as refused:
            await LocalClient.open(db)
        assert refused.value.data["reason"] == OLD_WAL_LEFT
        reader.execute("COMMIT")
        reader.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        other = apsw.Connection(str(db))  # another process's new -wal
        other.pragma("journal_mode", "wal")
        other.execute("CREATE TABLE IF NOT EXISTS probe (x)")
        async with await LocalClient.open(db) as renewed:
            assert await event_ids(renewed) == ["e1"]
        other.close()

    run(scenario())


def test_a_path_that_cannot_be_looked_up_is_a_clear_error_on_another_loop_too(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    first_loop, second_loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first = first_loop.run_until_complete(LocalClient.open(db))
        first_loop.run_until_complete(first.ping())
        shm = Path(f"{db}-shm")
        shm.unlink()
        shm.symlink_to(shm.name)
        with pytest.raises(RpcError) as failed:
            second_loop.run_until_complete(LocalClient.open(db))
        assert failed.value.code == errors.SOURCE_UNAVAILABLE
        assert "symbolic links" in failed.value.message
        assert failed.value.data.get("reason") != OLD_FILE_OPEN
        first_loop.run_until_complete(first.aclose())
    finally:
        first_loop.close()
        second_loop.close()


def test_an_orphaned_open_that_leaves_the_old_wal_keeps_refusing_the_restored_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open cancelled on the worker, the file restored, and the orphan's
    close unable to empty the old -wal (a reader from before the last
    write): the restored file is refused as for an old log's close, not
    opened with the old -wal applied."""
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"
    opened, go_on = threading.Event(), threading.Event()
    open_store = SqliteStore.open

    def held_open(path: str, *args: Any, **kwargs: Any) -> SqliteStore:
        store = open_store(path, *args, **kwargs)
        opened.set()
        go_on.wait(30)
        return store

    async def scenario() -> None:
        async with await LocalClient.open(db) as first:
            await first.append("app", "u", "s", ev("e1"))
        backup_of(db, backup)
        with monkeypatch.context() as patched:
            patched.setattr(SqliteStore, "try_open_without_waiting", lambda *a, **k: None)
            patched.setattr(SqliteStore, "open", held_open)
            opening = asyncio.ensure_future(LocalClient.open(db))
            await asyncio.to_thread(opened.wait, 30)
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
        reader = apsw.Connection(str(db))
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchall()
        writer = apsw.Connection(str(db))  # a write past the reader's snapshot
        writer.execute("CREATE TABLE written_to_the_old_file (x)")
        writer.close()
        os.replace(backup, db)
        go_on.set()
        assert await asyncio.to_thread(local_workers) == []  # the orphan has closed
        with pytest.raises(RpcError) as refused:
            await LocalClient.open(db)
        assert refused.value.data["reason"] == OLD_WAL_LEFT
        reader.execute("COMMIT")
        reader.close()

    run(scenario())
