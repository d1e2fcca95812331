"""Write-behind whose send the log fails to store, without refusing what it
was sent: a full disk, an I/O error, another process's write lock held past
the busy timeout. None of these says anything of the events: the queue is
kept, ``flush`` raises the log's error, and once the log can store again the
next ``flush`` stores all of it, in order, through the same session object.

Before, such an error was taken for a refusal of the run: everything the
session object had queued was dropped (events ``append_event`` had
acknowledged), and every later append through that object raised the disk's
error again, as if it were stale."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from support.adk import run, said, texts
from support.faulty_disk import FaultyVFS

from streamd import errors
from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient
from streamd.errors import RpcError


async def _stored(db: Path) -> list[str]:
    fresh = StreamdSessionService(database=db)
    try:
        got = await fresh.get_session(app_name="a", user_id="u", session_id="s")
    finally:
        await fresh.close()
    assert got is not None
    return texts(got)


def test_a_full_disk_under_write_behind_keeps_the_queue_for_the_next_flush(
    tmp_path: Path, faulty_disk: FaultyVFS
) -> None:
    db = tmp_path / "events.db"

    async def main() -> None:
        async with asyncio.timeout(60):
            service = StreamdSessionService(database=db, write_behind=True)
            try:
                s = await service.create_session(app_name="a", user_id="u", session_id="s")
                await service.append_event(s, said("before"))
                await service.flush()
                faulty_disk.full = True
                for i in range(3):
                    await service.append_event(s, said(f"queued {i}"))
                with pytest.raises(RpcError) as info:
                    await service.flush()
                assert info.value.code == errors.SOURCE_UNAVAILABLE
                assert "database or disk is full" in info.value.message, info.value.message
                # Not a refusal: the object queues on, and nothing was dropped.
                await service.append_event(s, said("queued while full"))
                faulty_disk.full = False
                await service.flush()
                await service.append_event(s, said("after"))
                await service.flush()
                want = ["before", "queued 0", "queued 1", "queued 2", "queued while full", "after"]
                assert texts(s) == want
                assert await _stored(db) == want
                got = await service.get_session(app_name="a", user_id="u", session_id="s")
                assert got == s  # the object is current: its marker is the last seq
            finally:
                faulty_disk.full = False
                await service.close()

    asyncio.run(main())


def test_a_database_error_from_the_daemon_keeps_the_queue_for_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemon answers when its disk is full (-32000, the store's
    words), for one run: the run is sent again by the next flush."""
    db = tmp_path / "events.db"
    real = AsyncClient.call
    failed: list[bool] = []

    async def disk_full_once(self: AsyncClient, call: Any, *args: Any, **kw: Any) -> Any:
        if call.method == "eventlog/append_batch" and not failed:
            failed.append(True)
            raise RpcError(errors.SOURCE_UNAVAILABLE,
                           "event log database error: database or disk is full",
                           {"sqlite_error": "FullError"})
        return await real(self, call, *args, **kw)

    async def main() -> None:
        async with asyncio.timeout(60):
            client = await AsyncClient.spawn(["--db", str(db), "--synchronous", "NORMAL"])
            service = StreamdSessionService(client, write_behind=True)
            try:
                s = await service.create_session(app_name="a", user_id="u", session_id="s")
                monkeypatch.setattr(AsyncClient, "call", disk_full_once)
                await service.append_event(s, said("one"))
                await service.append_event(s, said("two"))
                with pytest.raises(RpcError, match="database or disk is full"):
                    await service.flush()
                await service.append_event(s, said("three"))
                await service.flush()
                assert texts(s) == ["one", "two", "three"]
                got = await service.get_session(app_name="a", user_id="u", session_id="s")
                assert got is not None and texts(got) == ["one", "two", "three"]
                assert got == s
            finally:
                await service.close()
                await client.aclose()

    asyncio.run(main())


def test_a_run_the_client_refuses_whole_is_a_refusal_not_a_queue_kept_for_ever(
    tmp_path: Path,
) -> None:
    """An event over the daemon's frame limit (an inline file in its content)
    is refused by the client before it is sent (-32600), every time: a
    refusal of that copy, as the log's own refusals are. Kept as a queue the
    log could not store now, it was sent again by every drain: every flush and
    every read of the service (get_session waits for the queues) raised it,
    and the session's later events, through a reloaded copy too, were never
    stored."""
    async def body(service: StreamdSessionService) -> None:
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        await service.append_event(s, said("x" * (9 << 20)))
        with pytest.raises(RpcError) as info:
            await service.flush()
        assert info.value.code == errors.INVALID_REQUEST
        assert "frame limit" in info.value.message, info.value.message
        await service.flush()  # said once, as a refusal is
        fresh = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert fresh is not None and texts(fresh) == []
        await service.append_event(fresh, said("after"))
        await service.flush()
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None and texts(got) == ["after"]
        await service.close()

    run(tmp_path, body, write_behind=True)  # through a daemon: the client's frame limit
