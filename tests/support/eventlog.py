"""Helpers shared by the tests of the event log's Trio layer (no tests here).

Timing logic runs under Trio's MockClock with ``dispatch="inline"`` (the store on
the event loop thread): with a real worker thread the autojump clock would jump
while SQLite works. Those logs also read the lease clock from the Trio clock, so
"30 seconds later" is exact and instant (:func:`mocked`).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from streamd.eventlog import Entry, Event, EventLog

EPOCH = 1_750_000_000.0


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


def trio_wall_clock() -> float:
    """Lease ages come from this clock, so the mock clock drives staleness too."""
    return EPOCH + trio.current_time()


def mocked(path: Path, **kw: Any) -> EventLog:
    """An EventLog for mock-clock tests: inline dispatch, wall clock = Trio clock.
    (A test using it also requests ``autojump_clock``: pytest-trio takes the clock
    only from the test's own arguments.)"""
    kw.setdefault("dispatch", "inline")
    kw.setdefault("synchronous", "NORMAL")
    kw.setdefault("wall_clock", trio_wall_clock)
    return EventLog(path, **kw)


async def take(watch: AsyncIterator[Entry], n: int) -> list[Entry]:
    got = []
    async for entry in watch:
        got.append(entry)
        if len(got) == n:
            break
    return got


async def thread_event(event: threading.Event) -> None:
    """Until another thread (the writer's, a test's handshake) sets ``event``."""
    await trio.to_thread.run_sync(event.wait, abandon_on_cancel=True)


def writer_calls(log: EventLog, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times (mock clock) of every store call given to ``log``'s writer
    from now on."""
    runner = log.connections.writer
    assert runner is not None
    real = runner.run
    calls: list[float] = []

    async def run(op: Any) -> Any:
        calls.append(trio.current_time())
        return await real(op)

    monkeypatch.setattr(runner, "run", run)
    return calls
