"""The Trio client's own ways (what every client does is in
``client/test_contract.py``), against the real RPC server and event log in this process
(over memory streams), and against a ``streamd`` it spawns on stdio.

The in-process server also serves ``test/hang``, a method that waits forever
and records how it ended, so "cancelling a call cancels it on the daemon" is
seen from the daemon's side.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.client_pairs import Hang
from support.eventlog import mocked

from streamd.client import TrioClient
from streamd.client.protocol import Call
from streamd.errors import (
    BUDGET_EXCEEDED,
    CLOSED,
    RpcError,
)
from streamd.eventlog import EventLog
from streamd.eventlog.model import (
    Empty,
    Entry,
    Event,
    PingParams,
)
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, Server


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


@dataclass
class InProcess:
    log: EventLog
    hang: Hang
    server: Server
    nursery: trio.Nursery

    def stream(self) -> trio.abc.Stream:
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.serve, server_end, server_end)
        return client_end


def _serve(log: EventLog, nursery: trio.Nursery) -> InProcess:
    hang = Hang()
    methods = [*eventlog_methods(lambda: log), Method("test/hang", PingParams, hang.handler)]
    server = Server(lambda conn: {m.name: m for m in methods})
    return InProcess(log, hang, server, nursery)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with (
        EventLog(tmp_path / "events.db", synchronous="NORMAL", watch_interval=60) as log,
        trio.open_nursery() as nursery,
    ):
        yield _serve(log, nursery)
        nursery.cancel_scope.cancel()


async def test_a_watch_whose_consumer_falls_behind_ends_with_where_to_resume(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(30):
        # Inline dispatch: once every task is blocked, the daemon has sent all
        # it could and the client has read it.
        async with mocked(tmp_path / "events.db") as log, trio.open_nursery() as nursery:
            daemon = _serve(log, nursery)
            async with TrioClient.over(daemon.stream()) as c:
                for i in range(20):
                    await c.append("app", "u", "s", ev(f"e{i}", "x" * 1000))
                async with c.watch(0, budget=5000) as w:
                    await trio.testing.wait_all_tasks_blocked()
                    taken = [entry.seq async for entry in _until_error(w)]
                    assert taken == list(range(1, len(taken) + 1)) and 2 <= len(taken) < 20
                    assert isinstance(w.error, RpcError) and w.error.code == BUDGET_EXCEEDED
                    assert w.error.data["last_seq"] == taken[-1]
                    assert (await c.latest_seq()).seq == 20  # the connection serves on
            nursery.cancel_scope.cancel()


async def _until_error(w: Any) -> AsyncIterator[Entry]:
    try:
        async for entry in w:
            yield entry
    except RpcError as exc:
        w.error = exc


async def test_leaving_the_block_fails_what_is_in_flight_and_loses_the_leases(
    daemon: InProcess,
) -> None:
    with trio.fail_after(10):
        failures: list[RpcError] = []
        async with trio.open_nursery() as nursery:
            async with TrioClient.over(daemon.stream()) as c:
                lease = await c.acquire_lock("app", "u", "s")

                async def hang() -> None:
                    try:
                        await c.call(Call("test/hang", PingParams(), Empty))
                    except RpcError as exc:
                        failures.append(exc)

                nursery.start_soon(hang)
                await daemon.hang.started.wait()
            assert lease.lost.is_set()
        assert [f.code for f in failures] in ([CLOSED], [-32007])
        with pytest.raises(RpcError) as info:
            await c.ping()
        assert info.value.code == CLOSED
        # The daemon released the lease with the connection.
        async with TrioClient.over(daemon.stream()) as again:
            await again.acquire_lock("app", "u", "s")


async def test_a_spawned_stdio_daemon_serves_and_exits_when_the_client_leaves(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(30):
        async with TrioClient.spawn(["--db", str(db), "--synchronous", "NORMAL"]) as c:
            r = await c.append("app", "u", "s", ev("e1"))
            assert r.seq == 1
        # The process closed the log cleanly: no WAL left behind.
        assert db.exists() and not Path(str(db) + "-wal").exists()


async def test_a_call_from_another_trio_run_is_refused_and_the_client_goes_on(
    daemon: InProcess,
) -> None:
    # It put its frame in this run's channel and woke this run's writer from
    # another thread: the caller got a bare AssertionError from Trio, and every
    # later call of the client waited for ever.
    with trio.fail_after(30):
        async with TrioClient.over(daemon.stream()) as c:
            async def elsewhere() -> None:
                with pytest.raises(RuntimeError, match="Trio run that opened it"):
                    await c.append("app", "u", "s", ev("other-1"))
                with pytest.raises(RuntimeError, match="Trio run that opened it"):
                    async with c.watch():
                        pass

            await trio.to_thread.run_sync(trio.run, elsewhere)
            await c.append("app", "u", "s", ev("mine-1"))
            got = await c.get_session("app", "u", "s")
            assert [e.event.id for e in got.events] == ["mine-1"]


async def test_a_call_or_watch_cancelled_waiting_for_room_in_the_outbox_is_not_left_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A daemon that reads nothing: the writer waits in send_all on the first
    # frame, 64 more fill the outbox, and the next call waits for a slot. Its
    # request never left, so no answer could ever take it out of in_flight
    # (nor free its params): it stayed there until the connection ended.
    client_end, _daemon_end = trio.testing.lockstep_stream_pair()
    with trio.fail_after(60):
        async with TrioClient.over(client_end) as c, trio.open_nursery() as sent:
            for _ in range(65):
                sent.start_soon(c.ping)
            await trio.testing.wait_all_tasks_blocked()
            assert c.in_flight == 65
            with trio.move_on_after(1) as waited:
                await c.ping()
            assert waited.cancelled_caught
            assert c.in_flight == 65
            with trio.move_on_after(1) as waited:
                async with c.watch():
                    pass
            assert waited.cancelled_caught
            assert c.in_flight == 65
            sent.cancel_scope.cancel()


async def test_calls_waiting_for_room_in_the_outbox_fail_closed_when_the_connection_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The daemon reads nothing (64 frames queued, the writer in send_all on
    # another), then its connection ends: the calls waiting for a slot were
    # answered closed in the core, but waited on the slot, which the stopped
    # writer would never free: for ever.
    client_end, daemon_end = trio.testing.lockstep_stream_pair()
    failures: list[int] = []
    with trio.fail_after(60):
        async with TrioClient.over(client_end) as c, trio.open_nursery() as calls:

            async def ping() -> None:
                try:
                    await c.ping()
                except RpcError as exc:
                    failures.append(exc.code)

            for _ in range(67):
                calls.start_soon(ping)
            await trio.testing.wait_all_tasks_blocked()
            await daemon_end.aclose()
    assert failures == [CLOSED] * 67
