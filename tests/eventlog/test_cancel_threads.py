"""What requests to cancel a statement on a server that does not answer them
cost the rest of the process (:mod:`streamd.eventlog.cancels`): never a thread
of Trio's default limiter, which every ``trio.to_thread.run_sync`` of the
process shares, and a bounded number of threads left waiting on the server.

The server here is a store whose statement and cancel request both wait until
the test lets them go (a frozen server holds both for as long as it stays
frozen): nothing ends on a timer. Waits on threads are handshakes, on a
limiter of the test's own so that the default one's tokens are the code's
alone.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
import trio.testing

from streamd.eventlog import cancels
from streamd.eventlog.handoff import LeftRunning
from streamd.eventlog.server_runner import ServerRunner
from streamd.eventlog.store.reconnecting import Backoff

BOUND_S = 20.0


class Frozen:
    """What the stores of one frozen server share: the statements and cancel
    requests under way, until :meth:`thaw`."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.calls = 0
        self.cancels = 0  # cancel requests under way
        self.cancels_sent = 0
        self.severed = 0  # connections cut
        self.thawed = threading.Event()

    def enter(self, kind: str) -> None:
        with self._changed:
            setattr(self, kind, getattr(self, kind) + 1)
            if kind == "cancels":
                self.cancels_sent += 1
            self._changed.notify_all()
        assert self.thawed.wait(BOUND_S), "the test never thawed the server"
        if kind == "cancels":
            with self._changed:
                self.cancels -= 1

    def thaw(self) -> None:
        self.thawed.set()

    def sever(self) -> None:
        with self._changed:
            self.severed += 1
            self._changed.notify_all()

    async def until(self, condition: Callable[[Frozen], bool]) -> None:
        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(lambda: condition(self), BOUND_S)

        # A limiter of the test's own: the default one's tokens are what is tested.
        assert await trio.to_thread.run_sync(wait, limiter=trio.CapacityLimiter(1))


class Store:
    """A store on the frozen server: its statement and its cancel wait."""

    def __init__(self, server: Frozen) -> None:
        self.server = server
        self.severed = 0
        self.attempts = Backoff(0.25, 5.0)

    def call(self) -> str:
        self.server.enter("calls")
        return "answered"

    def cancel_running(self) -> None:
        self.server.enter("cancels")

    def sever(self) -> None:
        self.severed += 1
        self.server.sever()

    def cut_if_connecting(self) -> bool:
        return False

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


@contextmanager
def frozen() -> Iterator[Frozen]:
    """A frozen server, thawed when the block ends and at the latest
    :data:`BOUND_S` after it began: a wait the code never ends then fails
    the test rather than hangs it."""
    server = Frozen()
    watchdog = threading.Timer(BOUND_S, server.thaw)
    watchdog.start()
    try:
        yield server
    finally:
        watchdog.cancel()
        server.thaw()


@pytest.fixture
def left_running(monkeypatch: pytest.MonkeyPatch) -> LeftRunning:
    """A count of cancels left running of this test's own."""
    fresh = LeftRunning(cancels.MAX_LEFT)
    monkeypatch.setattr(cancels, "left_running", fresh)
    return fresh


async def _cancelled(runner: ServerRunner, scope: trio.CancelScope) -> None:
    with scope:
        await runner.run(lambda store: store.call())


@asynccontextmanager
async def _cancelled_together(
        server: Frozen, count: int) -> AsyncIterator[tuple[list[Store], list[trio.CancelScope]]]:
    """``count`` calls on ``server``, each with a long grace, cancelled all
    at once when the server holds them; the block runs as their cancels go
    out, and the calls end with it. Their stores and cancel scopes."""
    stores = [Store(server) for _ in range(count)]
    runners = [ServerRunner(s, grace_s=600.0) for s in stores]
    scopes = [trio.CancelScope() for _ in runners]
    async with trio.open_nursery() as nursery:
        for runner, scope in zip(runners, scopes, strict=True):
            nursery.start_soon(_cancelled, runner, scope)
        await server.until(lambda s: s.calls == count)
        for scope in scopes:
            scope.cancel()
        yield stores, scopes


async def test_calls_cancelled_at_once_on_a_frozen_server_leave_the_process_its_threads(
        left_running: LeftRunning) -> None:
    default = trio.to_thread.current_default_thread_limiter()
    count = int(default.total_tokens)  # as many cancels as it has threads to lend
    with frozen() as server, trio.fail_after(BOUND_S):
        async with _cancelled_together(server, count) as (stores, scopes):
            # As many as the process sends at once; the rest wait for them.
            sent = min(count, cancels.MAX_LEFT)
            await server.until(lambda s: s.cancels == sent)
            # Before: the cancels held every token of the default limiter,
            # and this waited until the server answered one of them.
            assert await trio.to_thread.run_sync(lambda: server.cancels) == sent
            assert default.borrowed_tokens == 0
            server.thaw()
    assert all(scope.cancelled_caught for scope in scopes)
    assert not any(s.severed for s in stores)  # each cancel reached its call in time


async def test_calls_cancelled_together_on_a_frozen_server_hold_at_most_max_left_threads_on_it(
        left_running: LeftRunning, monkeypatch: pytest.MonkeyPatch) -> None:
    # Forty calls cancelled at once (a daemon's stop, clients' deadlines
    # passing together), their graces long. Before: forty cancel requests
    # went out, one thread each, all held by the frozen server and all left
    # when the graces ran out, though MAX_LEFT (16) was the bound the docs gave.
    original = trio.to_thread.run_sync
    limiters: set[trio.CapacityLimiter] = set()

    async def noting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        limiters.add(kwargs["limiter"])  # each runner's own, and the cancels'
        return await original(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", noting)
    count = 40
    with frozen() as server, trio.fail_after(BOUND_S):
        async with _cancelled_together(server, count):
            try:
                await server.until(lambda s: s.cancels >= cancels.MAX_LEFT)
                await trio.testing.wait_all_tasks_blocked()
                (sending,) = [lim for lim in limiters if lim.total_tokens > 1]
                assert sending.borrowed_tokens <= cancels.MAX_LEFT  # threads started to send
                # And what the server saw, whatever lent the threads.
                assert server.cancels_sent <= cancels.MAX_LEFT
            finally:
                server.thaw()  # the calls, and the cancels, end


async def test_past_the_bound_of_cancels_left_running_a_call_is_cut_with_none_sent(
        left_running: LeftRunning, mock_clock: trio.testing.MockClock) -> None:
    grace = 2.0
    # The mock clock's, moved by hand: each call's grace runs out when the
    # test says, once its cancel is under way (or refused).
    with frozen() as server, trio.fail_after(4 * grace * (cancels.MAX_LEFT + 1)):
        for sent in range(cancels.MAX_LEFT + 1):
            store = Store(server)
            runner = ServerRunner(store, grace_s=grace, where="frozen server")
            scope = trio.CancelScope()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancelled, runner, scope)
                await server.until(lambda s, sent=sent: s.calls == sent + 1)
                scope.cancel()
                if sent < cancels.MAX_LEFT:
                    await server.until(lambda s, sent=sent: s.cancels == sent + 1)
                else:
                    await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(grace)  # no answer to the cancel: the call is cut...
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(grace)  # ...and left to its thread, which the cut did not end
            assert scope.cancelled_caught and store.severed == 1
            # Its cancel's thread left waiting on the server, counted.
            assert left_running.count == min(sent + 1, cancels.MAX_LEFT)
        # Before: a 17th thread, and as many more as calls were cancelled.
        assert server.cancels_sent == cancels.MAX_LEFT


async def test_a_closes_cancel_is_counted_while_it_waits_and_none_is_sent_past_the_bound(
        left_running: LeftRunning) -> None:
    # A close sends its cancels from threads nobody waits for: one each, with
    # no bound, before.
    with frozen() as server, trio.fail_after(BOUND_S):
        for _ in range(cancels.MAX_LEFT - 1):
            left_running.add("another server")
        stores = [Store(server) for _ in range(2)]
        runners = [ServerRunner(s, grace_s=0.2) for s in stores]
        async with trio.open_nursery() as nursery:
            for runner in runners:
                nursery.start_soon(runner.run, lambda store: store.call())
            await server.until(lambda s: s.calls == 2)
            runners[0].interrupt()
            await server.until(lambda s: s.cancels == 1)
            assert left_running.count == cancels.MAX_LEFT
            runners[1].interrupt()  # none sent: the close's cut is all it gets
            await server.until(lambda s: s.severed == 2)  # both cut at the close's deadline
            assert server.cancels_sent == 1
            server.thaw()
