"""What a connect to a server that never answers costs the rest of the
process: it shows (``EventLog.connecting_s``, what ``streamd status`` says
before any attempt has failed), and a log closed while it waits leaves it a
thread of its own, never one of Trio's default limiter's 40, and a bounded
number of them (:mod:`streamd.eventlog.handoff`).

Every wait is on a socket the test holds or a thread handshake; the held
connections are let go past each test's bound (``bounded``), so a connect
nothing ends fails the test rather than hangs it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing
from support.black_hole import TIMEOUTS, BlackHole, bounded, hole_url, ping_into

from streamd.errors import SOURCE_UNAVAILABLE, RpcError, is_closed
from streamd.eventlog import EventLog, handoff

backends = pytest.mark.parametrize("backend", ["postgres", "mysql"])
timeouts = pytest.mark.parametrize("timeout", list(TIMEOUTS))

OPENS = 41
"""One more than Trio's default thread limiter holds."""


@pytest.fixture
def left_running(monkeypatch: pytest.MonkeyPatch) -> handoff.LeftRunning:
    """A count of connects left running of this test's own: other tests'
    connects, which end when their sockets close, do not count in it."""
    fresh = handoff.LeftRunning()
    monkeypatch.setattr(handoff, "left_running", fresh)
    return fresh


@backends
async def test_a_connect_under_way_shows_how_long_calls_have_waited_for_it(
        backend: str, mock_clock: trio.testing.MockClock) -> None:
    with BlackHole() as hole, bounded(hole):
        async with EventLog(hole_url(backend, hole.port, TIMEOUTS["none"])) as log:
            assert log.connecting_s is None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.ping)
                await hole.wait_held(1)
                assert log.connecting_s == 0
                mock_clock.jump(12)
                # Before: nothing said so: no attempt had failed (none ends).
                assert log.connecting_s == 12
                assert log.fault is None
                nursery.cancel_scope.cancel()
            assert log.connecting_s == 12  # the connect goes on: the log still waits
            await log.aclose()
            assert log.connecting_s is None


async def _open_and_close(url: str, hole: BlackHole) -> RpcError | None:
    """A log opened, a call sent, and the log closed once the server holds its
    connect (or once the call was refused): the call's error, if not ``closed``."""
    async with EventLog(url) as log:
        answers: list[RpcError] = []
        held = hole.held

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping_into, log, answers)
            await trio.testing.wait_all_tasks_blocked()
            if log.connecting_s is not None:
                # Not before: a connect whose caller left before its thread
                # began is never made.
                await hole.wait_held(held + 1)
                await log.aclose()
    assert len(answers) == 1
    return None if is_closed(answers[0]) else answers[0]


@backends
@timeouts
async def test_logs_closed_while_their_connects_go_unanswered_take_no_thread_of_the_process(
        backend: str, timeout: str, left_running: handoff.LeftRunning) -> None:
    default = trio.to_thread.current_default_thread_limiter()
    with BlackHole() as hole, bounded(hole):
        url = hole_url(backend, hole.port, TIMEOUTS[timeout])
        for _ in range(OPENS):
            await _open_and_close(url, hole)
            # Before: one token more each time, and the 41st open, like every
            # trio.to_thread.run_sync of the process after it, waited for ever.
            assert default.borrowed_tokens == 0
        assert await trio.to_thread.run_sync(lambda: "a thread") == "a thread"


@backends
@timeouts
async def test_past_the_bound_of_connects_left_running_an_open_is_refused_at_once_by_name(
        backend: str, timeout: str, left_running: handoff.LeftRunning) -> None:
    with BlackHole() as hole, bounded(hole):
        url = hole_url(backend, hole.port, TIMEOUTS[timeout])
        for _ in range(handoff.MAX_LEFT):
            assert await _open_and_close(url, hole) is None
        await hole.wait_held(handoff.MAX_LEFT)
        refused = await _open_and_close(url, hole)
        # Before: one more thread stacked on the others, waiting as long.
        assert refused is not None and refused.code == SOURCE_UNAVAILABLE
        assert f"127.0.0.1:{hole.port}" in refused.message
        assert f"{handoff.MAX_LEFT} connects" in refused.message
        assert hole.held == left_running.count == handoff.MAX_LEFT
    # The sockets closed, the connects fail and their threads end.


async def test_a_connect_cancelled_while_it_waits_for_a_thread_is_not_counted_left_running(
        left_running: handoff.LeftRunning) -> None:
    # Every thread for connects taken by connects a frozen server holds; one
    # more is cancelled while it waits for a thread, so it never began.
    # Before: it was counted as left running, and never counted out (no
    # thread was ever to end it): sixteen such and every later open in the
    # process was refused for good.
    inside = threading.Semaphore(0)
    thawed = threading.Event()

    def connect() -> str:
        inside.release()
        thawed.wait(30)
        return "connection"

    own = trio.CapacityLimiter(1)  # the test's waits take no thread for connects
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(handoff.CONNECTS):
                    nursery.start_soon(handoff.made_on_thread, connect, lambda c: None, "frozen")
                for _ in range(handoff.CONNECTS):
                    assert await trio.to_thread.run_sync(inside.acquire, True, 30, limiter=own)
                with trio.CancelScope() as waiting:
                    waiting.cancel()  # while it waits for a thread: none is free
                    await handoff.made_on_thread(connect, lambda c: None, "frozen")
                assert waiting.cancelled_caught
                thawed.set()
        assert left_running.count == 0
    finally:
        thawed.set()


class _Signalled(handoff.LeftRunning):
    """A count that says when a connect is counted out."""

    def __init__(self) -> None:
        super().__init__()
        self.counted_out = threading.Event()

    def finish(self, where: str, counted: bool) -> None:
        super().finish(where, counted)
        if counted:
            self.counted_out.set()


async def test_a_connect_left_running_is_counted_out_even_when_closing_what_it_made_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the close's error skipped the count-out, and the connect stayed
    # counted for good; sixteen such and every later open was refused.
    left = _Signalled()
    monkeypatch.setattr(handoff, "left_running", left)
    began, thawed, closed = threading.Event(), threading.Event(), threading.Event()

    def connect() -> str:
        began.set()
        assert thawed.wait(30)
        return "connection"

    def close(conn: str) -> None:
        closed.set()
        raise OSError("the socket went away under the close")

    own = trio.CapacityLimiter(1)  # the test's waits take no thread for connects
    try:
        with trio.fail_after(30):
            with trio.CancelScope() as caller:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(handoff.made_on_thread, connect, close, "frozen")
                    assert await trio.to_thread.run_sync(began.wait, 30, limiter=own)
                    caller.cancel()
            assert left.count == 1  # left while its connect runs
            thawed.set()
            assert await trio.to_thread.run_sync(closed.wait, 30, limiter=own)
            assert await trio.to_thread.run_sync(left.counted_out.wait, 10, limiter=own)
        assert left.count == 0
    finally:
        thawed.set()


async def test_a_connect_whose_caller_left_before_its_thread_began_never_connects(
        left_running: handoff.LeftRunning, monkeypatch: pytest.MonkeyPatch) -> None:
    # A connect's thread may begin late (a loaded machine, a new thread to
    # start), after its caller was cancelled. Before: it connected all the
    # same, to close the connection at once, and counted itself left running
    # meanwhile: against a frozen server, one more thread held for the whole
    # connect timeout, for nobody.
    original = trio.to_thread.run_sync
    queued, go, over = threading.Event(), threading.Event(), threading.Event()
    connected: list[str] = []
    closed: list[str] = []

    async def begins_late(fn: Any, *args: Any, **kwargs: Any) -> Any:
        def late() -> Any:
            queued.set()
            try:
                assert go.wait(30)
                return fn(*args)
            finally:
                over.set()

        return await original(late, **kwargs)

    def connect() -> str:
        connected.append("connection")
        return "connection"

    monkeypatch.setattr(trio.to_thread, "run_sync", begins_late)
    own = trio.CapacityLimiter(1)  # the test's waits take no thread for connects
    try:
        with trio.fail_after(30):
            with trio.CancelScope() as caller:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(handoff.made_on_thread, connect, closed.append, "frozen")
                    assert await original(queued.wait, 30, limiter=own)
                    caller.cancel()
            assert caller.cancelled_caught
            go.set()  # the thread begins now, its caller gone
            assert await original(over.wait, 30, limiter=own)
        assert connected == [] and closed == []
        assert left_running.count == 0
    finally:
        go.set()


class _Frozen:
    """Connects to a server that never answers them, until thawed; counted
    as they begin (a thread handshake)."""

    def __init__(self) -> None:
        self.inside = threading.Semaphore(0)
        self.thawed = threading.Event()
        self._count = threading.Lock()
        self.entered = 0  # connects that reached it

    def connect(self) -> str:
        with self._count:
            self.entered += 1
        self.inside.release()
        assert self.thawed.wait(30)
        return "connection"

    async def until_inside(self, count: int, own: trio.CapacityLimiter) -> None:
        for _ in range(count):
            assert await trio.to_thread.run_sync(self.inside.acquire, True, 30, limiter=own)


async def test_connects_abandoned_together_to_a_frozen_server_leave_at_most_max_left_threads(
        left_running: handoff.LeftRunning, monkeypatch: pytest.MonkeyPatch) -> None:
    # Forty connects at once (as many as the old limiter lent), all left
    # unanswered, then all their callers gone at once (a daemon's stop).
    # Before: each had its thread, all forty stayed on the server, counted
    # left running, though MAX_LEFT (16) was the bound the docs gave.
    original = trio.to_thread.run_sync
    limiters: set[trio.CapacityLimiter] = set()

    async def noting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        limiters.add(kwargs["limiter"])  # the connects' limiter, as the code chose it
        return await original(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", noting)
    server, own = _Frozen(), trio.CapacityLimiter(1)
    try:
        with trio.fail_after(30):
            with trio.CancelScope() as callers:
                async with trio.open_nursery() as nursery:
                    for _ in range(40):
                        nursery.start_soon(handoff.made_on_thread, server.connect,
                                           lambda c: None, "frozen")
                    await trio.testing.wait_all_tasks_blocked()
                    (limiter,) = limiters
                    started = int(limiter.borrowed_tokens)  # threads started, each to connect
                    await server.until_inside(started, own)
                    callers.cancel()
            assert left_running.count == started
            assert left_running.count <= handoff.MAX_LEFT
            # And what the server saw, whatever lent the threads.
            assert server.entered == started
    finally:
        server.thawed.set()


async def test_connects_left_by_an_earlier_trio_run_count_against_the_bound_of_a_later_one(
        left_running: handoff.LeftRunning) -> None:
    # A process that runs Trio more than once (one run after another, or
    # several at once on threads) has a limiter of connects per run. Before:
    # a run that found fewer than MAX_LEFT connects left running started as
    # many as its own limiter lent, whatever the earlier runs had left.
    server, own = _Frozen(), trio.CapacityLimiter(1)
    earlier = 10

    async def leave(count: int) -> None:
        with trio.CancelScope() as callers:
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(handoff.made_on_thread, server.connect,
                                       lambda c: None, "frozen")
                await server.until_inside(count, trio.CapacityLimiter(1))
                callers.cancel()

    refused: list[RpcError] = []
    all_refused = trio.Event()

    async def connect() -> None:
        try:
            await handoff.made_on_thread(server.connect, lambda c: None, "frozen")
        except RpcError as exc:
            refused.append(exc)
            if len(refused) == earlier:
                all_refused.set()

    try:
        with trio.fail_after(30):
            await trio.to_thread.run_sync(trio.run, leave, earlier, limiter=own)
            assert left_running.count == earlier
            with trio.CancelScope() as callers:
                async with trio.open_nursery() as nursery:
                    for _ in range(handoff.MAX_LEFT):
                        nursery.start_soon(connect)
                    await server.until_inside(handoff.MAX_LEFT - earlier, own)
                    await all_refused.wait()  # the rest: before, they connected too
                    callers.cancel()
            assert left_running.count <= handoff.MAX_LEFT
            assert all(e.data and e.data.get("reason") == "connects_left_running" for e in refused)
    finally:
        server.thawed.set()
