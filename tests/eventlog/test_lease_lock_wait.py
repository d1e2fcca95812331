"""Leases on SQLite while another process holds the write lock: a lease row
is stamped with the time its transaction got the lock, never with the time
its wait for the lock began.

Real threads and a real second connection (the wait is SQLite's busy
handler, on the writer's thread), and a wall clock in the test's hand: it
moves only while the writer waits, so the time a row holds tells when it
was read. Every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw
import pytest
import trio
from support.eventlog import EPOCH, ev, thread_event

from streamd.errors import SESSION_LOCKED, RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.model import from_us

T0_US = int(EPOCH * 1_000_000)
WAIT_S = 5
"""How long the lock is held against the writer: the busy timeout's length."""


class HandClock:
    """The logs' wall clock, moved by the test alone."""

    def __init__(self) -> None:
        self.us = T0_US

    def __call__(self) -> float:
        return self.us / 1_000_000


def waiting_for_the_lock(log: EventLog) -> threading.Event:
    """Set once the log's writer waits for another connection's lock: from
    then on, whatever its operation read before its transaction has been read.
    (SQLite's busy handler, replaced for the test by one that waits up to
    10 s, 1 ms a try: the writer's own cannot be told apart from outside.)"""
    store = getattr(log.connections.writer, "store", None)
    assert store is not None
    waiting = threading.Event()

    def busy(tries: int) -> bool:
        waiting.set()
        time.sleep(0.001)
        return tries < 10_000

    store.connection.set_busy_handler(busy)
    return waiting


@contextmanager
def write_lock_held(path: Path) -> Iterator[Callable[[], None]]:
    """Another process's connection holding the file's write lock until the
    function given is called (or the block ends)."""
    other = apsw.Connection(str(path))
    other.execute("BEGIN IMMEDIATE")

    def release() -> None:
        if not other.get_autocommit():
            other.execute("ROLLBACK")

    try:
        yield release
    finally:
        release()
        other.close()


async def test_an_acquire_that_waited_for_another_writers_lock_is_stamped_when_it_got_it(
    tmp_path: Path,
) -> None:
    # Another process holds SQLite's write lock; A's acquire waits for it
    # (up to the busy timeout, 5 s), and 5 s pass. Stamped with the time read
    # before that wait, A's lease was 5 s old as it was written: with a 3 s
    # window, B took it at once from its healthy holder, before its first beat.
    path, clock = tmp_path / "events.db", HandClock()
    with trio.fail_after(30):
        async with (
            EventLog(path, synchronous="NORMAL", wall_clock=clock) as a,
            EventLog(path, synchronous="NORMAL", wall_clock=clock) as b,
        ):
            await a.latest_seq()  # opened: the writer exists
            waiting = waiting_for_the_lock(a)
            leases = []
            with write_lock_held(path) as release:
                async with trio.open_nursery() as nursery:

                    async def acquire() -> None:
                        leases.append(await a.acquire_lock(
                            "app", "u", "s", stale_after_ms=3000, heartbeat_ms=1500))

                    nursery.start_soon(acquire)
                    await thread_event(waiting)
                    clock.us += WAIT_S * 1_000_000  # the wait for the lock
                    release()
            leases[0].stop_heartbeat()  # what the row says is the acquire's
            with pytest.raises(RpcError) as info:
                await b.acquire_lock("app", "u", "s", stale_after_ms=3000)
            assert info.value.code == SESSION_LOCKED
            assert info.value.data["heartbeat_age_ms"] == 0
            [row] = await a.list_locks()
            assert row.acquired_at == row.heartbeat_at == from_us(T0_US + WAIT_S * 1_000_000)


async def test_a_beat_that_waited_for_another_writers_lock_is_stamped_when_it_got_it(
    tmp_path: Path,
) -> None:
    # As an acquire: a beat stamped before its 5 s wait for the lock left the
    # lease 5 s old as it was written, stealable under a 4 s window though
    # its holder had just beaten.
    path, clock = tmp_path / "events.db", HandClock()
    with trio.fail_after(30):
        async with (
            EventLog(path, synchronous="NORMAL", wall_clock=clock) as a,
            EventLog(path, synchronous="NORMAL", wall_clock=clock) as b,
        ):
            # A beat is cut at the next tick: 2 s leave a loaded machine room
            # for the handshake below (the window stays under the 5 s wait).
            lease = await a.acquire_lock("app", "u", "s", stale_after_ms=4000, heartbeat_ms=2000)
            waiting = waiting_for_the_lock(a)
            with write_lock_held(path) as release:
                await thread_event(waiting)  # the first beat, 2 s after the acquire
                clock.us += WAIT_S * 1_000_000  # the wait for the lock
                release()
            # The writer runs one call at a time: an append queued after the
            # beat is answered once the beat has committed.
            await a.append("app", "u", "other", ev("after the beat"))
            assert lease.beats >= 1  # a later beat stamps the same hand-held time
            lease.stop_heartbeat()  # what the row says is that beat's
            with pytest.raises(RpcError) as info:
                await b.acquire_lock("app", "u", "s", stale_after_ms=3000)
            assert info.value.code == SESSION_LOCKED
            [row] = await a.list_locks()
            assert row.acquired_at == from_us(T0_US)
            assert row.heartbeat_at == from_us(T0_US + WAIT_S * 1_000_000)
