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
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import apsw
import pytest

from streamd import errors
from streamd.client.local import LocalClient
from streamd.errors import RpcError
from streamd.eventlog.model import Event
from streamd.eventlog.sqlite.backup import snapshot

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def ev(event_id: str) -> Event:
    return Event(id=event_id, author="agent", content=None, timestamp=T0)


def run(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(60):
            return await coro

    return asyncio.run(bounded())


def descriptors_on(path: Path) -> int:
    """This process's open descriptors on ``path`` itself (not its -wal)."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                count += 1
        except OSError:
            continue  # closed while listed
    return count


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


def test_a_file_restored_under_shared_clients_is_opened_anew_without_the_old_wal(
    tmp_path: Path,
) -> None:
    """A restore (another file renamed over the path) under an open log: a
    client opened after it serves the restored file, as restored (the old
    connection's -wal, still at the path, is emptied into the old file
    first, not applied to the new one); the old clients fail naming the
    cause."""
    db = tmp_path / "events.db"

    async def scenario() -> None:
        old = await LocalClient.open(db)
        await old.append("app", "u", "s", ev("e1"))
        backup = tmp_path / "backup.db"
        source = apsw.Connection(str(db))
        snapshot(source, backup)  # as `streamd log backup` makes one
        source.close()
        await old.append("app", "u", "s", ev("e2"))  # in the old -wal only
        os.replace(backup, db)
        new = await LocalClient.open(db)
        assert await event_ids(new) == ["e1"]
        assert (await new.append("app", "u", "s", ev("e3"))).seq == 2
        with pytest.raises(RpcError) as stopped:
            await old.ping()
        assert stopped.value.data["reason"] == "database_file_replaced"
        await old.aclose()
        await new.aclose()

    run(scenario())
    restored = apsw.Connection(str(db))
    assert restored.execute("SELECT event_id FROM events ORDER BY seq").fetchall() == [
        ("e1",), ("e3",)
    ]
    restored.close()
