"""What is the in-process ADK service's own (``database=``): its arguments,
and the connections of event loops that have ended.

Everything else it shares with the daemon's service: test_session_service.py
and ADK's own contract (test_contract.py) run on both.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

pytest.importorskip("google.adk")

from google.adk.events.event import Event
from support.adk import said
from support.faulty_disk import FaultyVFS
from support.local_files import backup_of, descriptors_on, local_workers

from streamd.adk import StreamdSessionService
from streamd.client.local import LocalClient


def test_a_service_used_on_loop_after_loop_keeps_one_connection(tmp_path: Path) -> None:
    # ADK's Runner.run runs each turn on an event loop of its own.
    db = tmp_path / "events.db"
    service = StreamdSessionService(database=db)
    asyncio.run(service.create_session(app_name="app", user_id="u", session_id="s"))
    for _ in range(40):
        got = asyncio.run(service.get_session(app_name="app", user_id="u", session_id="s"))
        assert got is not None
    gc.collect()
    assert descriptors_on(db) <= 1  # the last loop's; each earlier one's was closed


def test_a_client_dropped_unclosed_closes_its_file(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        client = await LocalClient.open(db)
        await client.ping()
        assert descriptors_on(db) == 1
        del client

    asyncio.run(scenario())
    gc.collect()
    assert local_workers() == []  # the file closes on its worker, which ends once it has
    assert descriptors_on(db) == 0


def test_its_arguments_say_which_log_they_are_for(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        StreamdSessionService(object(), database=tmp_path / "x.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="synchronous"):
        StreamdSessionService(synchronous="NORMAL")


def test_a_full_disk_fails_append_event_and_the_session_goes_on_when_space_returns(
    tmp_path: Path, faulty_disk: FaultyVFS
) -> None:
    """The event that found the disk full is refused, the session object is
    left as it was (ADK adds an event only once it is stored), nothing stored
    is lost, and the next append after space returns continues the session."""
    from streamd.errors import RpcError

    async def main() -> None:
        service = StreamdSessionService(database=tmp_path / "events.db")
        try:
            s = await service.create_session(app_name="app", user_id="u", session_id="s")
            await service.append_event(s, said("before"))
            faulty_disk.full = True
            with pytest.raises(RpcError, match="database or disk is full"):
                await service.append_event(s, said("on a full disk"))
            assert [e.content.parts[0].text for e in s.events] == ["before"]  # type: ignore[union-attr,index]
            faulty_disk.full = False
            await service.append_event(s, said("after"))
            fresh = StreamdSessionService(database=tmp_path / "events.db")
            try:
                got = await fresh.get_session(app_name="app", user_id="u", session_id="s")
            finally:
                await fresh.close()
            assert got is not None
            assert [e.content.parts[0].text for e in got.events  # type: ignore[union-attr,index]
                    ] == ["before", "after"]
        finally:
            faulty_disk.full = False
            await service.close()

    asyncio.run(main())


def test_a_log_restored_under_a_long_lived_service_is_read_as_restored(tmp_path: Path) -> None:
    # The service caches built events by seq; the restored file gives the
    # seqs after its own events to new ones, which must not be answered with
    # the old file's events cached under the same seqs. The restore comes
    # between two turns, each on an event loop of its own (ADK's Runner.run):
    # the next turn's first call lets go of the old file and opens the
    # restored one.
    db, backup = tmp_path / "events.db", tmp_path / "backup.db"
    service = StreamdSessionService(database=db)

    async def before_the_restore() -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(3):
            await service.append_event(session, said(f"kept {i}"))
        backup_of(db, backup)
        for i in range(3):
            await service.append_event(session, said(f"old {i}"))
        loaded = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert loaded is not None and len(loaded.events) == 6  # all six cached

    async def scenario() -> None:
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert session is not None
        for i in range(3):
            await service.append_event(session, said(f"new {i}"))
        for got in (await service.get_session(app_name="app", user_id="u", session_id="s"),
                    await StreamdSessionService(database=db).get_session(
                        app_name="app", user_id="u", session_id="s")):
            assert got is not None
            assert [e.content.parts[0].text for e in got.events  # type: ignore[union-attr,index]
                    ] == [
                *(f"kept {i}" for i in range(3)), *(f"new {i}" for i in range(3))]
        await service.close()

    asyncio.run(before_the_restore())
    backup.rename(db)
    asyncio.run(scenario())


@pytest.mark.parametrize("when", [float("nan"), float("inf"), float("-inf")])
def test_an_event_whose_timestamp_is_not_a_number_is_refused_and_the_session_reads_on(
        tmp_path: Path, when: float) -> None:
    # ADK's JSON writes such a timestamp as null, which no read could take
    # back: the session, its earlier events included, could no longer be read.
    async def main() -> None:
        service = StreamdSessionService(database=tmp_path / "events.db")
        try:
            s = await service.create_session(app_name="app", user_id="u", session_id="s")
            await service.append_event(s, Event(author="user", invocation_id="i"))
            bad = Event(author="user", invocation_id="i", timestamp=when)
            with pytest.raises(ValueError, match="timestamp must be a finite number"):
                await service.append_event(s, bad)
            again = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert again is not None and len(again.events) == 1
        finally:
            await service.close()

    asyncio.run(main())
