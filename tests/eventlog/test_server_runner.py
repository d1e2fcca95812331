"""The Trio layer over a server backend's store (``eventlog.server_runner``):
a cancelled call inside the driver's connect (to a server that accepts and
never answers) is answered at once, one that a cut does not end within its
graces; either way the connection stays taken until that call has ended."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing

from streamd.errors import RpcError, is_closed
from streamd.eventlog.connections import Connections
from streamd.eventlog.server_runner import ServerRunner
from streamd.eventlog.store import Role, Runner
from streamd.eventlog.store.reconnecting import Backoff

GRACE_S = 2.0


class Store:
    """A store whose calls block until let go; its cancel reaches nothing and
    its cut is only noted."""

    def __init__(self, *, connecting: bool) -> None:
        self.connecting = connecting
        self.let_go = threading.Event()
        self.entered = threading.Event()
        self.started: list[str] = []
        self.severed = 0
        self.running = False
        self.attempts = Backoff(0.25, 5.0)

    def call(self, name: str) -> str:
        self.started.append(name)
        self.running = True
        self.entered.set()
        try:
            assert self.let_go.wait(10), "the test never let the call end"
        finally:
            self.running = False
        return name

    def cancel_running(self) -> None:
        pass  # no statement runs yet: nothing to cancel

    def sever(self) -> None:
        self.severed += 1

    def cut_if_connecting(self) -> bool:
        if self.connecting:
            self.severed += 1
        return self.connecting

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        self.started.append("close")


@pytest.mark.parametrize(("connecting", "graces"), [(True, 0), (False, 2)])
@pytest.mark.trio
async def test_a_cancelled_call_nothing_can_cut_answers_and_holds_the_connection(
        autojump_clock, connecting: bool, graces: int) -> None:
    store = Store(connecting=connecting)
    runner = ServerRunner(store, grace_s=GRACE_S)
    outcome: list[str] = []
    scope = trio.CancelScope()
    answered = trio.Event()

    async def first() -> None:
        with scope:
            await runner.run(lambda s: s.call("first"))
        outcome.append("cancelled" if scope.cancelled_caught else "answered")
        outcome.append("call still running" if store.running else "call ended")
        answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        assert await trio.to_thread.run_sync(store.entered.wait, 10)
        assert store.started == ["first"]
        start = trio.current_time()
        scope.cancel()
        await answered.wait()
        # Connecting: cut at once (nothing to cancel, nothing to wait for).
        # Otherwise both graces passed (the cancel's, then the cut's).
        # Either way, not the call.
        assert outcome == ["cancelled", "call still running"] and store.severed == 1
        assert trio.current_time() - start == pytest.approx(graces * GRACE_S, abs=0.1)
        assert not store.let_go.is_set()

        second: list[str] = []

        async def next_call() -> None:
            second.append(await runner.run(lambda s: s.call("second")))

        nursery.start_soon(next_call)
        await trio.testing.wait_all_tasks_blocked()
        assert store.started == ["first"]  # waits for the left call's thread
        store.let_go.set()
    assert second == ["second"] and store.started == ["first", "second"]
    await runner.aclose()
    assert store.started[-1] == "close"


@pytest.mark.trio
async def test_a_call_answered_before_its_cancel_gives_its_answer_and_the_connection_back(
        ) -> None:
    store = Store(connecting=False)
    store.let_go.set()
    runner = ServerRunner(store, grace_s=GRACE_S)
    with trio.fail_after(30):  # a connection never given back hangs the second
        assert await runner.run(lambda s: s.call("one")) == "one"
        assert await runner.run(lambda s: s.call("two")) == "two"
    assert store.severed == 0


class KillStore(Store):
    """A store whose cancel, like MySQL's KILL QUERY, goes out on a connection
    of its own and lands on whatever statement runs when it arrives; the call
    it was meant for ends meanwhile."""

    def __init__(self) -> None:
        super().__init__(connecting=False)
        self.kill_started = threading.Event()
        self.kill_lands = threading.Event()
        self.killed: list[str | None] = []
        self.current: str | None = None

    def call(self, name: str) -> str:
        self.current = name
        try:
            if name == "second":  # still running if it started before the kill landed
                self.started.append(name)
                assert self.kill_lands.wait(10), "the test never let the kill land"
                return name
            return super().call(name)
        finally:
            self.current = None

    def cancel_running(self) -> None:
        self.kill_started.set()
        self.let_go.set()  # the statement ends on its own before the kill lands
        assert self.kill_lands.wait(10), "the test never let the kill land"
        self.killed.append(self.current)


@pytest.mark.trio
async def test_a_cancel_on_its_way_never_lands_on_the_next_call() -> None:
    store = KillStore()
    runner = ServerRunner(store, grace_s=60.0)
    scope = trio.CancelScope()

    async def first() -> None:
        with scope:
            await runner.run(lambda s: s.call("first"))

    async def second() -> None:
        await runner.run(lambda s: s.call("second"))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            assert await trio.to_thread.run_sync(store.entered.wait, 10)
            scope.cancel()
            assert await trio.to_thread.run_sync(store.kill_started.wait, 10)
            nursery.start_soon(second)
            # The first call's statement has ended; the second would start now if
            # the connection were given back before the kill has landed.
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            store.kill_lands.set()
    assert store.killed == [None] and store.started == ["first", "second"]


@pytest.mark.trio
async def test_close_waits_the_grace_for_a_call_left_in_a_connect_not_the_connect(
        autojump_clock) -> None:
    # A connect with no timeout to a server that never answers: the call's
    # thread never returns on its own. Close takes one grace, not for ever.
    store = Store(connecting=True)
    runner = ServerRunner(store, grace_s=GRACE_S)
    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:

        async def left() -> None:
            with scope:
                await runner.run(lambda s: s.call("connecting"))

        nursery.start_soon(left)
        assert await trio.to_thread.run_sync(store.entered.wait, 10)
        scope.cancel()
    start = trio.current_time()
    # The clock jumps while a thread works, so only the grace is a bound;
    # waiting for the connect would never end (the deadline says so).
    with trio.fail_after(100 * GRACE_S):
        await runner.aclose()
    assert trio.current_time() - start >= GRACE_S
    assert store.started == ["connecting", "close"] and store.running
    store.let_go.set()


@pytest.mark.trio
async def test_close_waits_for_a_call_left_in_a_statement(autojump_clock) -> None:
    # Not connecting: the call holds a statement that the interrupt and the
    # cut end; close waits for it rather than close the connection under it.
    store = Store(connecting=False)
    runner = ServerRunner(store, grace_s=GRACE_S)
    scope = trio.CancelScope()
    closed = trio.Event()
    async with trio.open_nursery() as nursery:

        async def left() -> None:
            with scope:
                await runner.run(lambda s: s.call("statement"))

        async def close() -> None:
            await runner.aclose()
            closed.set()

        nursery.start_soon(left)
        assert await trio.to_thread.run_sync(store.entered.wait, 10)
        scope.cancel()
        nursery.start_soon(close)
        await trio.sleep(5 * GRACE_S)
        assert not closed.is_set() and store.started == ["statement"]
        store.let_go.set()
    assert closed.is_set() and store.started == ["statement", "close"]


@pytest.mark.trio
async def test_a_close_gives_every_busy_connection_one_deadline_not_a_grace_each(
        autojump_clock) -> None:
    # Both connections left in a connect (a server that accepts and never
    # answers): the close waited a grace for the reader's, then another for
    # the writer's.
    stores = {"reader": Store(connecting=True), "writer": Store(connecting=True)}

    async def open_backend(role: Role) -> Runner:
        return ServerRunner(stores[role], grace_s=GRACE_S)

    conns = Connections(open_backend, on_open=lambda nursery, writer: None,
                        after_write=lambda writer: None)
    async with trio.open_nursery() as nursery:
        conns.serve_in(nursery)

        async def busy(call: Any) -> None:
            with pytest.raises(RpcError) as info:
                await call(lambda s: s.call("connecting"))
            assert is_closed(info.value)

        nursery.start_soon(busy, conns.read)
        nursery.start_soon(busy, conns.write)
        for store in stores.values():
            assert await trio.to_thread.run_sync(store.entered.wait, 10)
        start = trio.current_time()
        conns.begin_close()
        await conns.aclose()
        took = trio.current_time() - start
    assert took == pytest.approx(GRACE_S)
    assert all(store.started == ["connecting", "close"] for store in stores.values())
    for store in stores.values():
        store.let_go.set()


@pytest.mark.trio
async def test_a_stop_gives_a_call_it_cancels_later_and_the_close_one_deadline(
        autojump_clock) -> None:
    # A stop says a close is coming, then cancels what is in flight (after
    # its requests had time to wrap up): the cancelled call is cut at the
    # stop's deadline, not a grace after its cancel, and the close that
    # follows has nothing left to give a grace to.
    store = Store(connecting=False)
    runner = ServerRunner(store, grace_s=GRACE_S)
    scope = trio.CancelScope()
    answered = trio.Event()
    async with trio.open_nursery() as nursery:

        async def call() -> None:
            with scope:
                await runner.run(lambda s: s.call("statement"))
            answered.set()

        nursery.start_soon(call)
        assert await trio.to_thread.run_sync(store.entered.wait, 10)
        start = trio.current_time()
        assert runner.expect_close() == start + GRACE_S
        await trio.sleep(GRACE_S / 4)
        scope.cancel()
        await answered.wait()
        # Cut once, at the deadline; the call (nothing ends it here) runs on.
        assert trio.current_time() - start == pytest.approx(GRACE_S)
        assert store.severed == 1 and store.running
        runner.interrupt()  # the close: past its deadline, nothing more to wait for
        store.let_go.set()
    await runner.aclose()
    assert trio.current_time() - start == pytest.approx(GRACE_S)
    assert store.started == ["statement", "close"]
