"""Small reads on the event loop thread: a ping, a state, a session's newest
events run inline when the reader's worker is idle; a large read, a read
behind queued work, and reads after a slow inline one go to the worker
thread. Real threads and the real clock; every test is bounded by
``trio.fail_after``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import ev

from streamd.eventlog import EventLog, SqliteStore, inline
from streamd.eventlog.model import (
    Filter,
    LatestSeqParams,
    SessionGetParams,
    SinceParams,
    StateGetParams,
)


@pytest.fixture(autouse=True)
def never_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded test machine's slow read must not move reads off the inline
    path (that has a test of its own, below)."""
    monkeypatch.setattr(inline, "SLOW_READ_S", float("inf"))


def _record_threads(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """The threads ``SqliteStore.<name>`` runs on, in order."""
    seen: list[int] = []
    original: Callable[..., Any] = getattr(SqliteStore, name)

    def recorded(self: SqliteStore, *args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SqliteStore, name, recorded)
    return seen


async def test_small_reads_run_on_the_event_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    pings = _record_threads(monkeypatch, "ping")
    gets = _record_threads(monkeypatch, "get_session")
    states = _record_threads(monkeypatch, "get_state")
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            for i in range(5):
                await log.append("a", "u", "s", ev(f"e{i}", {"n": i}))
            await log.requests.ping()
            got = await log.requests.get_session(
                SessionGetParams(app="a", user="u", session="s", recent=2)
            )
            assert [e.event.id for e in got.events] == ["e3", "e4"]
            state = await log.requests.get_state(StateGetParams(app="a", user="u"))
            assert state.seq == 5
    assert pings == [loop_thread]
    assert gets == [loop_thread]
    assert states == [loop_thread]


async def test_unbounded_reads_run_on_the_readers_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    gets = _record_threads(monkeypatch, "get_session")
    sinces = _record_threads(monkeypatch, "since")
    latest = _record_threads(monkeypatch, "latest_seq")
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            got = await log.requests.get_session(SessionGetParams(app="a", user="u", session="s"))
            assert len(got.events) == 1
            await log.requests.get_session(
                SessionGetParams(app="a", user="u", session="s", recent=101)
            )
            page = await log.requests.since(SinceParams(from_seq=0))
            assert [e.seq for e in page.entries] == [1]
            # A filter may need a scan: not small.
            seq = await log.requests.latest_seq(LatestSeqParams(filter=Filter(author="x")))
            assert seq == 0
    assert gets and sinces and latest
    assert loop_thread not in gets + sinces + latest


async def test_a_small_read_behind_queued_work_waits_its_turn_on_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    pings = _record_threads(monkeypatch, "ping")
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))  # opens the log
            await log.requests.ping()  # inline
            release = threading.Event()
            started = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def held(store: Any) -> str:
                token.run_sync_soon(started.set)
                release.wait(10)
                return "held"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.connections.read, held)
                await started.wait()
                nursery.start_soon(log.requests.ping)
                # Every task now waits: the ping is queued behind the held
                # read, not run on the event loop ahead of it.
                await trio.testing.wait_all_tasks_blocked()
                assert len(pings) == 1
                release.set()
            assert len(pings) == 2
    assert pings[0] == loop_thread
    assert pings[1] != loop_thread


async def test_a_slow_inline_read_keeps_the_next_ones_on_the_worker_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline, "SLOW_READ_S", 0.0)  # every one "slow"
    monkeypatch.setattr(inline, "BACKOFF_S", 60.0)
    loop_thread = threading.get_ident()
    pings = _record_threads(monkeypatch, "ping")
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            await log.requests.ping()  # opens the log (on the worker)
            for _ in range(3):
                await log.requests.ping()
    assert pings.count(loop_thread) == 1


async def test_a_small_read_of_a_closed_log_says_closed(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            await log.requests.ping()
        with pytest.raises(Exception, match="closed"):
            await log.requests.ping()
