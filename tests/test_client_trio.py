"""The Trio client, against the real RPC server and event log in this process
(over memory streams), and against a ``streamd`` it spawns on stdio.

The in-process server also serves ``test/hang``, a method that waits forever
and records how it ended, so "cancelling a call cancels it on the daemon" is
seen from the daemon's side.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from eventlog_support import mocked

from streamd.client import TrioClient
from streamd.client.protocol import Call
from streamd.errors import (
    BUDGET_EXCEEDED,
    CLOSED,
    RpcError,
    is_session_locked,
    is_session_not_found,
    is_stale_session,
)
from streamd.eventlog import EventLog
from streamd.eventlog.model import (
    AppendResult,
    Empty,
    Entry,
    Event,
    Filter,
    PingParams,
    SessionKey,
    StateDelta,
)
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, Request, Server


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


@dataclass
class Hang:
    started: trio.Event = field(default_factory=trio.Event)
    cancelled: trio.Event = field(default_factory=trio.Event)

    async def handler(self, p: PingParams, request: Request) -> Empty:
        self.started.set()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")


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


async def test_every_method_answers_with_its_wire_struct(daemon: InProcess) -> None:
    with trio.fail_after(20):
        async with TrioClient.over(daemon.stream()) as c:
            created = await c.create_session("app", "u", "s", {"n": 0}, app_state={"a": 1})
            assert created.last_seq == 0
            r = await c.append("app", "u", "s", ev("e1", {"k": 1}),
                               state_delta=StateDelta(session={"n": 1}), expected_seq=0)
            assert r == AppendResult(seq=1, duplicate=False)
            page = await c.since(0, Filter(session="s"))
            assert [e.event.content for e in page.entries] == [{"k": 1}] and page.caught_up
            assert (await c.latest_seq()).seq == 1
            await c.append("app", "u", "s", ev("e2", branch="b.x"))
            assert (await c.branches()).branches == ["b.x"]
            got = await c.get_session("app", "u", "s", recent=1, scoped_state=True)
            assert [e.event.id for e in got.events] == ["e2"] and got.app_state == {"a": 1}
            many = await c.get_sessions("app", [("u", "s"), SessionKey(user="u", session="x")])
            assert len(many.sessions) == 1 and many.missing == [SessionKey(user="u", session="x")]
            assert [s.session for s in (await c.list_sessions("app")).sessions] == ["s"]
            state = await c.get_state("app", "u", "s", as_of_seq=1)
            assert (state.app, state.session) == ({"a": 1}, {"n": 1})
            boot = await c.record_boot(dt.datetime(2025, 1, 1, tzinfo=dt.UTC), ["s"])
            await c.update_boot(boot.id, [])
            assert [b.id for b in (await c.recent_boots(dt.datetime(2024, 1, 1,
                                                                    tzinfo=dt.UTC))).boots] \
                == [boot.id]
            assert await c.ping() == Empty()
            await c.delete_session("app", "u", "s")
            with pytest.raises(RpcError) as info:
                await c.get_session("app", "u", "s")
            assert is_session_not_found(info.value)


async def test_a_refusal_is_the_daemons_error_and_the_connection_serves_on(
    daemon: InProcess,
) -> None:
    with trio.fail_after(10):
        async with TrioClient.over(daemon.stream()) as c:
            await c.append("app", "u", "s", ev("e1"))
            await c.append("app", "u", "s", ev("e2"))
            with pytest.raises(RpcError) as info:
                await c.append("app", "u", "s", ev("e3"), expected_seq=1)
            assert is_stale_session(info.value)
            assert info.value.data == {"expected_seq": 1, "last_seq": 2}
            with pytest.raises(RpcError) as bad:
                await c.since(-1)
            assert bad.value.code == -32602 and "from_seq" in bad.value.message
            assert (await c.latest_seq()).seq == 2


async def test_cancelling_a_call_cancels_it_on_the_daemon(daemon: InProcess) -> None:
    with trio.fail_after(10):
        async with TrioClient.over(daemon.stream()) as c:
            with trio.move_on_after(0.05) as scope:
                await c.call(Call("test/hang", PingParams(), Empty))
            assert scope.cancelled_caught
            await daemon.hang.cancelled.wait()  # the daemon's task was cancelled
            # The -32007 it answers is read and dropped; the connection serves on.
            while c.in_flight:
                await c.ping()
            assert (await c.latest_seq()).seq == 0


async def test_a_watch_replays_history_then_follows_another_clients_appends(
    daemon: InProcess,
) -> None:
    with trio.fail_after(10):
        async with TrioClient.over(daemon.stream()) as a, TrioClient.over(daemon.stream()) as b:
            await a.append("app", "u", "s", ev("old"))
            got: list[Entry] = []
            async with a.watch(0, Filter(session="s")) as w:
                async for entry in w:
                    got.append(entry)
                    if entry.event.id == "old":
                        await b.append("app", "u", "s", ev("new"))
                        await b.append("app", "u", "other", ev("elsewhere"))
                    if len(got) == 2:
                        break
            assert [e.event.id for e in got] == ["old", "new"] and w.last_seq == got[-1].seq
            # Leaving the block cancelled the watch on the daemon.
            while a.in_flight:
                await a.ping()


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


async def test_a_stolen_lease_signals_lost(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(30):
        async with mocked(tmp_path / "events.db") as log, trio.open_nursery() as nursery:
            daemon = _serve(log, nursery)
            async with TrioClient.over(daemon.stream()) as c:
                lease = await c.acquire_lock("app", "u", "s", heartbeat_ms=50,
                                             stale_after_ms=150)
                with pytest.raises(RpcError) as info:
                    await c.acquire_lock("app", "u", "s")
                assert is_session_locked(info.value)
                # Another process takes the row; our next heartbeat finds it gone.
                await log._write(lambda store: store.connection.execute(
                    "UPDATE leases SET holder = 'thief/1/00000000'"))
                await lease.lost.wait()
                assert not c._leases
            nursery.cancel_scope.cancel()


async def test_leaving_the_block_fails_what_is_in_flight_and_loses_the_leases(
    daemon: InProcess,
) -> None:
    with trio.fail_after(10):
        failures: list[RpcError] = []
        async with TrioClient.over(daemon.stream()) as c:
            lease = await c.acquire_lock("app", "u", "s")

            async def hang() -> None:
                try:
                    await c.call(Call("test/hang", PingParams(), Empty))
                except RpcError as exc:
                    failures.append(exc)

            c._nursery.start_soon(hang)
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
