"""The watch hub's change poller, driven by hand: a fake reader that counts its
calls, a change source whose wakes the test fires, and commits of this
process's writer played through the hub as the group-commit writer makes them.

The claim: a wake that this process's own writer covers (a commit of it began
after the wake and reached the fan-out) costs no confirmation read; a wake
while the writer is idle is confirmed at once, as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from streamd.eventlog.model import WatchParams
from streamd.eventlog.store import CommitOutcome, Committed
from streamd.eventlog.watch_hub import WatchHub, change_state

_T = TypeVar("_T")


class Store:
    """What the hub and a watch ask of a backend, counted."""

    def __init__(self) -> None:
        self.newest = 0
        self.version = 0
        self.confirmations = 0
        self.pages = 0

    def change_counter(self) -> int:
        self.confirmations += 1
        return self.version

    def newest_seq(self) -> int:
        return self.newest

    def since_committed(
        self, from_seq: int, flt: Any, limit: int, max_bytes: int
    ) -> tuple[list[Committed], bool]:
        self.pages += 1
        return [], True


class Reader:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def run(self, op: Callable[[Any], _T]) -> _T:
        await trio.lowlevel.checkpoint()
        return op(self.store)

    def interrupt(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class Changes:
    """A change source whose wakes the test fires; ``waits`` counts the
    poller's returns from it."""

    def __init__(self) -> None:
        self._woken = trio.Event()
        self.waits = 0

    def wake(self) -> None:
        self._woken.set()

    def expect_commit(self) -> None:
        pass

    async def wait(self) -> None:
        await self._woken.wait()
        self._woken = trio.Event()
        self.waits += 1


class World:
    def __init__(self) -> None:
        self.store = Store()
        self.changes = Changes()
        reader = Reader(self.store)

        async def get_reader() -> Any:
            return reader.run

        @asynccontextmanager
        async def open_changes() -> AsyncIterator[Changes]:
            yield self.changes

        self.hub = WatchHub(
            reader=get_reader,
            read_change_state=lambda: reader.run(change_state),
            open_changes=open_changes,
            watch_interval=0.2,
            capacity=100,
            budget_bytes=1 << 20,
            total_bytes=256 << 20,
            stall_timeout=30,
            log_closed=lambda: False,
        )

    async def commit(self, seconds: float, during: Callable[[], None] | None = None) -> None:
        """One commit of this process's writer: begun, ``seconds`` in the
        database (``during`` is called halfway), then its outcome fanned out."""
        with self.hub.committing():
            await trio.sleep(seconds / 2)
            if during is not None:
                during()
            await trio.sleep(seconds / 2)
            before, self.store.newest = self.store.newest, self.store.newest + 1
            self.store.version += 1
            entry = Committed(self.store.newest, "app", "u", "s", "", "agent", b"{}")
            self.hub.committed(
                CommitOutcome(results=[], before_seq=before, after_seq=before + 1, entries=[entry])
            )


@pytest.fixture
def world() -> World:
    return World()


@asynccontextmanager
async def watching(world: World) -> AsyncIterator[None]:
    """One watch open on the hub (so its poller runs), for the block."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            world.hub.watch(WatchParams(from_seq=0), nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert world.store.confirmations == 1  # the poller's baseline
            yield
            nursery.cancel_scope.cancel()


async def test_a_wake_covered_by_the_writers_next_commit_costs_no_confirmation_read(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    async with watching(world):
        # Back to back, as under load: each commit begins in the step the
        # previous one ends in. A wake during the second is covered by the
        # third, which began after it.
        for n in range(5):
            await world.commit(0.1, world.changes.wake if n == 1 else None)
        await trio.testing.wait_all_tasks_blocked()
        assert world.store.confirmations == 1


async def test_a_wake_during_the_writers_last_commit_is_confirmed_once_it_is_idle(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    async with watching(world):
        await world.commit(0.1)
        await world.commit(0.1, world.changes.wake)  # nothing follows it
        await trio.testing.wait_all_tasks_blocked()
        assert world.store.confirmations == 2


async def test_a_wake_while_the_writer_is_idle_is_confirmed_at_once(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    async with watching(world):
        world.changes.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert world.store.confirmations == 2


async def test_another_processs_commit_seen_by_our_next_commit_sends_watches_to_the_store(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    # The wake for another process's commit is covered by our writer's next
    # commit, whose before_seq shows it: the watch then reads the store, which
    # holds it, without the poller having read anything.
    async with watching(world):
        await world.commit(0.1)
        await trio.testing.wait_all_tasks_blocked()
        pages = world.store.pages

        def foreign_commit() -> None:
            world.store.newest += 1
            world.store.version += 1
            world.changes.wake()

        await world.commit(0.1, foreign_commit)
        await world.commit(0.1)
        await trio.testing.wait_all_tasks_blocked()
        assert world.store.confirmations == 1
        assert world.store.pages > pages


async def test_a_steady_writer_wakes_the_poller_once_not_once_a_commit(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    # Each of our commits writes the WAL and so wakes the change source, as
    # inotify does: while the writer keeps committing, the poller follows it
    # without looking again, and confirms once when the writer is idle.
    async with watching(world):
        for _ in range(20):
            await world.commit(0.1, world.changes.wake)
        await trio.testing.wait_all_tasks_blocked()
        assert world.changes.waits == 1
        assert world.store.confirmations == 1
        world.hub.writer_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert world.changes.waits == 2  # what the last commits left waiting
        assert world.store.confirmations == 2


async def test_another_processs_commit_after_our_writer_went_idle_is_confirmed(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    async with watching(world):
        for _ in range(3):
            await world.commit(0.1, world.changes.wake)
        world.hub.writer_idle()
        await trio.testing.wait_all_tasks_blocked()
        confirmations, pages = world.store.confirmations, world.store.pages
        world.store.newest += 1
        world.store.version += 1
        world.changes.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert world.store.confirmations == confirmations + 1
        assert world.store.pages > pages  # the watch reads it from the store


async def test_a_poller_ended_while_it_followed_the_writer_leaves_the_next_one_working(
    world: World, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(60):
        for round_ in range(2):
            async with trio.open_nursery() as nursery:
                world.hub.watch(WatchParams(from_seq=0), nursery)
                await trio.testing.wait_all_tasks_blocked()
                for _ in range(3):
                    await world.commit(0.1, world.changes.wake)
                await trio.testing.wait_all_tasks_blocked()
                if round_:
                    confirmations = world.store.confirmations
                    world.hub.writer_idle()
                    await trio.testing.wait_all_tasks_blocked()
                    assert world.store.confirmations == confirmations + 1
                # The watch leaves while its poller follows the writer.
                nursery.cancel_scope.cancel()
