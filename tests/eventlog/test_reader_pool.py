"""A server backend's reader pool on its own, with runners that stand in for
connections (``eventlog/reader_pool.py``): reads held on events, never timed,
each test bounded by ``trio.fail_after``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.reader_pool import ReaderPool
from streamd.eventlog.store import Runner, closed_error


class HeldRunner:
    """Runs each op once ``gate`` is set; ``inside`` is set when one waits."""

    def __init__(self) -> None:
        self.inside = trio.Event()
        self.gate = trio.Event()
        self.running = 0
        self.wakes: list[Callable[[], object]] = []

    @property
    def busy(self) -> bool:
        return self.running > 0

    def on_free(self, wake: Callable[[], object]) -> None:
        self.wakes.append(wake)

    def free(self) -> None:
        """The thread of a call its caller left has ended."""
        self.running -= 1
        for wake in self.wakes:
            wake()

    async def run(self, op: Callable[[Any], Any]) -> Any:
        self.running += 1
        try:
            self.inside.set()
            await self.gate.wait()
            return op(None)
        finally:
            self.free()


def never(open_: Callable[[], Any]) -> None:
    raise AssertionError("the pool opened a connection")


def refused(error: RpcError) -> Callable[[], Any]:
    async def open_reader() -> Runner:
        raise error
    return open_reader


async def test_a_read_the_server_refuses_another_connection_waits_for_a_busy_one() -> None:
    # The server at its connection limit (or restarting) refused the pool a
    # second connection: the read failed source_unavailable, where with one
    # reader it waited for that reader, as it does now.
    first = HeldRunner()
    answers: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            pool = ReaderPool(first, refused(RpcError(SOURCE_UNAVAILABLE, "too many clients")),  # type: ignore[arg-type]
                              spawn=nursery.start_soon)

            async def read(name: str) -> None:
                answers.append(await pool.run(lambda _store: name))

            nursery.start_soon(read, "slow")
            await first.inside.wait()
            nursery.start_soon(read, "next")
            await trio.testing.wait_all_tasks_blocked()
            assert answers == []
            first.gate.set()
    assert sorted(answers) == ["next", "slow"]
    assert pool.runners == [first]


async def test_a_read_whose_log_closed_while_it_opened_a_connection_fails_closed() -> None:
    first = HeldRunner()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            pool = ReaderPool(first, refused(closed_error()), spawn=nursery.start_soon)  # type: ignore[arg-type]
            nursery.start_soon(pool.run, lambda _store: None)
            await first.inside.wait()
            with pytest.raises(RpcError) as caught:
                await pool.run(lambda _store: None)
            assert caught.value.code == closed_error().code
            first.gate.set()


async def test_a_read_refused_another_connection_waits_on_one_a_cancelled_call_still_holds(
) -> None:
    first = HeldRunner()
    first.running = 1  # a cancelled read's thread still holds it, returned to the pool
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            pool = ReaderPool(first, refused(RpcError(SOURCE_UNAVAILABLE, "too many clients")),  # type: ignore[arg-type]
                              spawn=nursery.start_soon)
            answers: list[str] = []

            async def read() -> None:
                answers.append(await pool.run(lambda _store: "read"))

            nursery.start_soon(read)
            await first.inside.wait()  # waiting on that one, not failed
            first.gate.set()
    assert answers == ["read"] and pool.runners == [first]


async def test_a_read_at_the_pools_size_waits_on_a_held_connection_without_opening_another(
) -> None:
    first = HeldRunner()
    first.running = 1
    opened: list[HeldRunner] = []

    async def open_reader() -> HeldRunner:
        opened.append(HeldRunner())
        return opened[-1]

    pool = ReaderPool(first, open_reader, spawn=never, size=1)  # type: ignore[arg-type]
    with trio.fail_after(10):
        first.gate.set()
        assert await pool.run(lambda _store: "read") == "read"
    assert opened == [] and pool.runners == [first]


async def test_a_read_takes_a_connection_given_back_while_another_is_still_opening(
        autojump_clock: trio.abc.Clock) -> None:
    # A server that accepts one more connection and never answers it: the
    # read that asked for it waited out the connect (shielded, for ever with
    # no connect timeout) though the busy connection came back at once.
    first = HeldRunner()
    opening, opened = trio.Event(), trio.Event()

    async def open_reader() -> Runner:
        opening.set()
        with trio.move_on_after(3600):  # the connect timeout, here an hour
            await trio.sleep_forever()
        opened.set()
        raise RpcError(SOURCE_UNAVAILABLE, "connection timeout expired")

    answered = trio.Event()
    with trio.fail_after(7200):
        async with trio.open_nursery() as nursery:
            pool = ReaderPool(first, open_reader, spawn=nursery.start_soon)  # type: ignore[arg-type]

            async def read() -> None:
                assert await pool.run(lambda _store: "next") == "next"
                answered.set()

            nursery.start_soon(pool.run, lambda _store: "slow")
            await first.inside.wait()
            nursery.start_soon(read)
            await opening.wait()
            first.gate.set()  # the slow read ends: its connection is free
            await answered.wait()
            assert not opened.is_set()  # answered while the other still opened
    assert pool.runners == [first]
