"""The client contract: one suite, each test written once, run over the
blocking, asyncio and Trio clients (``client_pairs``: the three behind one
face, against this process's daemon on a Unix socket, a fresh log per test).
What one client does, all three do: every method answers with its wire
Struct, refusals are the same RpcError, a cancelled call is cancelled on the
daemon, watches deliver and stop, leases are exclusive and signal loss, and a
daemon that goes fails what waits with ``closed``."""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from support.client_pairs import HANG, KINDS, Daemon, Driver, connected, serving

from streamd.errors import (
    CLOSED,
    RpcError,
    is_session_locked,
    is_session_not_found,
    is_stale_session,
)
from streamd.eventlog import EventLog
from streamd.eventlog.model import (
    AppendBatchResult,
    AppendParams,
    AppendResult,
    CompactResult,
    Empty,
    Entry,
    Event,
    Filter,
    RetentionPolicy,
    SessionKey,
    StateDelta,
)


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    # A socket path short enough for AF_UNIX, whatever tmp_path is.
    with tempfile.TemporaryDirectory(prefix="sdcc-", dir="/tmp") as run:
        async with (
            EventLog(tmp_path / "events.db", synchronous="NORMAL", watch_interval=60) as log,
            serving(log, str(Path(run) / "s.sock")) as d,
        ):
            yield d


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def client(daemon: Daemon, kind: str) -> AsyncIterator[Driver]:
    async with connected(kind, daemon.path) as c:
        yield c


async def test_every_method_answers_with_its_wire_struct(client: Driver) -> None:
    with trio.fail_after(30):
        c = client.call
        created = await c("create_session", "app", "u", "s", {"n": 0}, app_state={"a": 1})
        assert created.last_seq == 0
        r = await c("append", "app", "u", "s", ev("e1", {"k": 1}),
                    state_delta=StateDelta(session={"n": 1}), expected_seq=0)
        assert r == AppendResult(seq=1, duplicate=False)
        page = await c("since", 0, Filter(session="s"))
        assert [e.event.content for e in page.entries] == [{"k": 1}] and page.caught_up
        assert (await c("latest_seq")).seq == 1
        await c("append", "app", "u", "s", ev("e2", branch="b.x"))
        assert (await c("branches")).branches == ["b.x"]
        got = await c("get_session", "app", "u", "s", recent=1, scoped_state=True)
        assert [e.event.id for e in got.events] == ["e2"] and got.app_state == {"a": 1}
        many = await c("get_sessions", "app", [("u", "s"), SessionKey(user="u", session="x")])
        assert len(many.sessions) == 1 and many.missing == [SessionKey(user="u", session="x")]
        assert [s.session for s in (await c("list_sessions", "app")).sessions] == ["s"]
        state = await c("get_state", "app", "u", "s", as_of_seq=1)
        assert (state.app, state.session) == ({"a": 1}, {"n": 1})
        boot = await c("record_boot", dt.datetime(2025, 1, 1, tzinfo=dt.UTC), ["s"])
        assert await c("update_boot", boot.id, []) == Empty()
        recent = await c("recent_boots", dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
        assert [b.id for b in recent.boots] == [boot.id]
        assert await c("ping") == Empty()
        batch = await c("append_batch", [
            AppendParams(app="app", user="u", session="s", event=ev("e3")),
            AppendParams(app="app", user="u", session="s", event=ev("e3")),
        ])
        assert batch == AppendBatchResult(results=[AppendResult(seq=3, duplicate=False),
                                                   AppendResult(seq=3, duplicate=True)])
        assert await c("set_retention", "app", max_events=10) == Empty()
        assert (await c("retention", "app")).policies == [
            RetentionPolicy(app="app", max_events=10)]
        assert isinstance(await c("compact", "app", vacuum="none"), CompactResult)
        assert await c("delete_session", "app", "u", "s") == Empty()
        with pytest.raises(RpcError) as info:
            await c("get_session", "app", "u", "s")
        assert is_session_not_found(info.value)


async def test_a_refusal_is_the_daemons_error_and_the_connection_serves_on(
    client: Driver,
) -> None:
    with trio.fail_after(30):
        await client.call("append", "app", "u", "s", ev("e1"))
        await client.call("append", "app", "u", "s", ev("e2"))
        with pytest.raises(RpcError) as info:
            await client.call("append", "app", "u", "s", ev("e3"), expected_seq=1)
        assert is_stale_session(info.value)
        assert info.value.data == {"expected_seq": 1, "last_seq": 2}
        with pytest.raises(RpcError) as bad:
            await client.call("since", -1)
        assert bad.value.code == -32602 and "from_seq" in bad.value.message
        assert (await client.call("latest_seq")).seq == 2


async def test_cancelling_a_call_cancels_it_on_the_daemon(
    daemon: Daemon, client: Driver
) -> None:
    with trio.fail_after(30):
        with pytest.raises(TimeoutError):
            await client.call_within(HANG, 0.05)
        await daemon.hang.cancelled.wait()  # the daemon's task was cancelled
        # The -32007 it answers is read and dropped; the connection serves on.
        while client.in_flight:
            await client.call("ping")
        assert (await client.call("latest_seq")).seq == 0


async def test_a_watch_replays_history_then_follows_another_clients_appends(
    daemon: Daemon, client: Driver, kind: str
) -> None:
    with trio.fail_after(30):
        async with connected(kind, daemon.path) as other:
            await client.call("append", "app", "u", "s", ev("old"))
            got: list[Entry] = []
            async with client.watch(0, Filter(session="s")) as w:
                while (entry := await w.next()) is not None:
                    got.append(entry)
                    if entry.event.id == "old":
                        await other.call("append", "app", "u", "s", ev("new"))
                        await other.call("append", "app", "u", "other", ev("elsewhere"))
                    if len(got) == 2:
                        break
            assert [e.event.id for e in got] == ["old", "new"] and w.last_seq == got[-1].seq
            # Leaving the block cancelled the watch on the daemon.
            while client.in_flight:
                await client.call("ping")


async def test_a_lease_is_exclusive_and_a_released_one_is_never_lost(client: Driver) -> None:
    with trio.fail_after(30):
        lease = await client.acquire_lock("app", "u", "s")
        assert client.held_leases == {lease.lock}
        with pytest.raises(RpcError) as info:
            await client.acquire_lock("app", "u", "s")
        assert is_session_locked(info.value)
        await lease.release()
        assert not lease.is_lost() and client.held_leases == frozenset()
        again = await client.acquire_lock("app", "u", "s")
        await again.release()


async def test_a_stolen_lease_signals_lost(daemon: Daemon, client: Driver) -> None:
    with trio.fail_after(30):
        lease = await client.acquire_lock("app", "u", "s", heartbeat_ms=50, stale_after_ms=150)
        # Another process takes the row; the daemon's next heartbeat finds it gone.
        await daemon.log.connections.write(lambda store: store.connection.execute(
            "UPDATE leases SET holder = 'thief/1/00000000'"))
        await lease.wait_lost()
        assert client.held_leases == frozenset()


async def test_a_daemon_that_goes_fails_what_waits_with_closed_and_loses_the_leases(
    daemon: Daemon, client: Driver
) -> None:
    with trio.fail_after(30):
        lease = await client.acquire_lock("app", "u", "s")
        failures: list[RpcError] = []

        async def hang() -> None:
            try:
                await client.call_within(HANG, 30)
            except RpcError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang)
            await daemon.hang.started.wait()
            daemon.drop_peers()
        await lease.wait_lost()
        assert [f.code for f in failures] == [CLOSED]
        with pytest.raises(RpcError) as info:
            await client.call("ping")
        assert info.value.code == CLOSED
