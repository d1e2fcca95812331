"""Write-behind (``write_behind=True``) across the life of event loops: ADK's
``Runner.run`` runs each turn on a loop of its own, and ``asyncio.run`` cancels
what a turn's loop still runs when it ends; a service closed with events
queued; a service used from two loops at once; an event id reused.

Every case here lost acknowledged events, or a refusal, before: a send
cancelled by its loop's end dropped the run it was sending (and the next
turn's send died on its bookkeeping), ``close`` discarded the queue, two loops
at once raised asyncio's "attached to a different loop" or lost events, and a
reused id with other content was dropped without a word."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from support.adk import said, texts

from streamd.adk import EventConflictError, StreamdSessionService
from streamd.client.local import LocalClient


def stored(db: Path) -> list[str]:
    async def read() -> list[str]:
        fresh = StreamdSessionService(database=db)
        got = await fresh.get_session(app_name="app", user_id="u", session_id="s")
        await fresh.close()
        return [] if got is None else texts(got)

    return asyncio.run(read())


def hold_sends(monkeypatch: pytest.MonkeyPatch,
               hold: Callable[[int], Awaitable[object] | None]) -> list[int]:
    """Each ``eventlog/append_batch`` of an in-process client first awaits
    ``hold(n)`` (n counts them from 1) unless that is None; the counts, as
    they come."""
    real = LocalClient.call
    sends: list[int] = []

    async def held(self: LocalClient, call: Any) -> Any:
        if call.method == "eventlog/append_batch":
            sends.append(len(sends) + 1)
            waiting = hold(sends[-1])
            if waiting is not None:
                await waiting
        return await real(self, call)

    monkeypatch.setattr(LocalClient, "call", held)
    return sends


def forever() -> Awaitable[None]:
    """Until the loop ends and cancels it."""
    return asyncio.Event().wait()


def test_a_send_cut_short_by_its_loops_end_is_made_by_the_next_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "events.db"
    service = StreamdSessionService(database=db, write_behind=True)
    sends = hold_sends(monkeypatch, lambda n: forever() if n == 1 else None)

    async def turn(first: bool) -> Any:
        if first:
            s = await service.create_session(app_name="app", user_id="u", session_id="s")
        else:
            s = await service.get_session(app_name="app", user_id="u", session_id="s")
        for i in range(3):
            await service.append_event(s, said(f"{'one' if first else 'two'} {i}"))
        await asyncio.sleep(0)  # the send starts, and is stuck (the first)
        return s

    asyncio.run(turn(True))  # ends with its send cancelled
    second = asyncio.run(turn(False))
    assert texts(second) == [*(f"one {i}" for i in range(3)), *(f"two {i}" for i in range(3))]

    async def last() -> None:
        await service.flush()
        await service.close()

    asyncio.run(last())
    assert len(sends) >= 2
    assert stored(db) == [*(f"one {i}" for i in range(3)), *(f"two {i}" for i in range(3))]


def test_close_sends_what_is_queued(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        service = StreamdSessionService(database=db, write_behind=True)
        s = await service.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(30):
            await service.append_event(s, said(f"m{i}"))
        await service.close()

    asyncio.run(scenario())
    assert stored(db) == [f"m{i}" for i in range(30)]


def test_a_second_loop_at_once_is_refused_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "events.db"
    service = StreamdSessionService(database=db, write_behind=True)
    sending, release = threading.Event(), threading.Event()

    def held(n: int) -> Awaitable[object]:
        sending.set()
        return asyncio.to_thread(release.wait, 60)

    hold_sends(monkeypatch, held)

    async def first() -> None:
        s = await service.create_session(app_name="app", user_id="u", session_id="a")
        await service.append_event(s, said("from A"))
        await service.flush()  # waits for the held send

    thread = threading.Thread(target=asyncio.run, args=(first(),))
    thread.start()
    try:
        assert sending.wait(60)

        async def second() -> None:
            with pytest.raises(RuntimeError, match="two event loops at once"):
                await service.get_session(app_name="app", user_id="u", session_id="a")

        asyncio.run(second())
    finally:
        release.set()
        thread.join(60)
    assert not thread.is_alive()


def test_a_reused_event_id_with_other_content_is_refused_and_a_redelivery_is_not(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        service = StreamdSessionService(database=db, write_behind=True)
        s = await service.create_session(app_name="app", user_id="u", session_id="s")
        first = said("first")
        await service.append_event(s, first)
        assert await service.append_event(s, first) is first  # the same event again
        other = said("other")
        other.id = first.id
        with pytest.raises(EventConflictError):
            await service.append_event(s, other)
        await service.close()

    asyncio.run(scenario())
    assert stored(db) == ["first"]


def test_a_loop_closed_under_its_send_leaves_the_run_for_the_next_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run_until_complete and close, without asyncio.run's cancellation of
    # what the loop still ran: the send task never runs again, and the run
    # it had taken was held in its frame alone (every later call on any loop
    # then said "two event loops at once").
    db = tmp_path / "events.db"
    service = StreamdSessionService(database=db, write_behind=True)
    stuck = True
    hold_sends(monkeypatch, lambda n: forever() if stuck else None)

    async def turn() -> None:
        s = await service.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(3):
            await service.append_event(s, said(f"m{i}"))
        await asyncio.sleep(0)  # the send starts, and is stuck

    loop = asyncio.new_event_loop()
    loop.run_until_complete(turn())
    loop.close()
    stuck = False

    async def later() -> None:
        await service.flush()
        await service.close()

    asyncio.run(later())
    assert stored(db) == ["m0", "m1", "m2"]


def test_a_redelivery_leaves_no_copy_behind(tmp_path: Path) -> None:
    # A re-delivered event queues nothing, so the service keeps no token of
    # the copy for it (one per re-delivery, for the life of the service).
    async def scenario() -> None:
        service = StreamdSessionService(database=tmp_path / "events.db", write_behind=True)
        s = await service.create_session(app_name="app", user_id="u", session_id="s")
        first = said("first")
        await service.append_event(s, first)
        await service.flush()
        for _ in range(20):
            assert await service.append_event(s, first) is first
        assert not service._ledger.copies  # every copy's appends are stored: none is kept
        await service.close()

    asyncio.run(scenario())


class _CountedEvents(list[Event]):
    """A session's event list that counts the events iterated over."""

    seen = 0

    def __iter__(self) -> Any:
        for item in super().__iter__():
            _CountedEvents.seen += 1
            yield item


def test_an_append_does_not_scan_the_events_the_copy_holds(tmp_path: Path) -> None:
    # The re-delivery check scanned the copy's events for the id at every
    # append: a session's appends cost its length squared (at 20,000 events,
    # milliseconds an append, more than a durable commit). Counted, not timed.
    n = 300

    async def scenario() -> None:
        service = StreamdSessionService(database=tmp_path / "events.db", write_behind=True)
        s = await service.create_session(app_name="app", user_id="u", session_id="s")
        s.events = _CountedEvents()
        for i in range(n):
            await service.append_event(s, said(f"m{i}"))
        scanned = _CountedEvents.seen
        first = s.events[0]
        assert await service.append_event(s, first) is first  # still a re-delivery
        other = said("other")
        other.id = s.events[n // 2].id
        with pytest.raises(EventConflictError):  # and still a conflict
            await service.append_event(s, other)
        await service.close()
        assert scanned < 2 * n, f"{scanned} events scanned for {n} appends"

    asyncio.run(scenario())
    assert len(stored(tmp_path / "events.db")) == n


def test_a_refused_copy_is_not_kept_once_dropped(tmp_path: Path) -> None:
    # A refusal was kept as the exception raised, again, at each of the copy's
    # appends: its traceback held the frame that raised it, and so the stale
    # copy with all its events, for the life of the service.
    async def scenario() -> list[weakref.ref[Any]]:
        service = StreamdSessionService(database=tmp_path / "events.db", write_behind=True)
        await service.create_session(app_name="app", user_id="u", session_id="s")
        dropped: list[weakref.ref[Any]] = []
        for i in range(3):
            ahead = await service.get_session(app_name="app", user_id="u", session_id="s")
            stale = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert ahead is not None and stale is not None
            await service.append_event(ahead, said(f"ahead {i}"))
            await service.append_event(stale, said(f"stale {i}"))
            with pytest.raises(StaleSessionError) as flushed:
                await service.flush()
            for _ in range(2):  # raised at each append, as flush raised it
                with pytest.raises(StaleSessionError) as again:
                    await service.append_event(stale, said("more"))
                assert str(again.value) == str(flushed.value)
            dropped.append(weakref.ref(stale))
            del ahead, stale, flushed, again
        gc.collect()
        await service.close()
        return dropped

    assert [copy() for copy in asyncio.run(scenario())] == [None, None, None]
    assert stored(tmp_path / "events.db") == ["ahead 0", "ahead 1", "ahead 2"]
