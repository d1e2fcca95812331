"""The eventlog/* JSON-RPC methods, driven through the real RPC layer.

Clients talk to :class:`streamd.rpc.Server` over in-memory streams with raw JSON
frames, so these tests see exactly the bytes a client would.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from rpc_client import Client

from streamd.eventlog import EventLog
from streamd.eventlog.service import METHOD_NAMES, eventlog_methods
from streamd.rpc import Server

SPEC_METHODS = {
    "eventlog/append",
    "eventlog/since",
    "eventlog/watch",
    "eventlog/latest_seq",
    "eventlog/branches",
    "eventlog/sessions.create",
    "eventlog/sessions.get",
    "eventlog/sessions.list",
    "eventlog/sessions.delete",
    "eventlog/lock.acquire",
    "eventlog/lock.release",
    "eventlog/boot.record",
    "eventlog/boot.update",
    "eventlog/boot.recent",
    "eventlog/ping",
}


@dataclass
class Daemonish:
    """One shared EventLog and a way to open client connections to it."""

    log: EventLog
    nursery: trio.Nursery
    server: Server

    async def connect(self) -> Client:
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.serve, server_end, server_end)
        return Client(client_end)


def _server(factory: Callable[[], Any]) -> Server:
    return Server(lambda conn: {m.name: m for m in eventlog_methods(factory)})


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemonish]:
    async with (
        EventLog(tmp_path / "events.db", synchronous="NORMAL", watch_interval=60) as log,
        trio.open_nursery() as nursery,
    ):
        yield Daemonish(log, nursery, _server(lambda: log))
        nursery.cancel_scope.cancel()


def event(event_id: str, content: Any = None, **kw: Any) -> dict[str, Any]:
    return {"id": event_id, "author": kw.pop("author", "agent"), "content": content, **kw}


def append(event_id: str, session: str = "s", **kw: Any) -> dict[str, Any]:
    metadata = kw.pop("metadata", None)
    params = {"app": "app", "user": "u", "session": session, "event": event(event_id, **kw)}
    if metadata is not None:
        params["metadata"] = metadata
    return params


def test_every_method_of_the_contract_is_served() -> None:
    assert METHOD_NAMES == SPEC_METHODS


async def test_append_duplicate_and_conflict_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        first = await c.result("eventlog/append", append("e1", content={"x": 1}))
        assert first == {"seq": 1, "duplicate": False}
        assert await c.result("eventlog/append", append("e1", content={"x": 1})) == {
            "seq": 1,
            "duplicate": True,
        }
        err = await c.error("eventlog/append", append("e1", content={"x": 2}))
        assert err["code"] == -32010
        assert err["data"] == {"event_id": "e1", "seq": 1}


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("eventlog/since", {"from_seq": 0, "filter": {"sesion": "typo"}}),
        ("eventlog/since", {"from_seq": 0, "limit": 10_001}),
        ("eventlog/append", {**append("e"), "extra": 1}),
        ("eventlog/append", append("e", timestamp="2025-01-01T00:00:00")),
        ("eventlog/lock.acquire", {"app": "a", "user": "u", "session": "s", "heartbeat_ms": 9e9}),
        ("eventlog/ping", {"verbose": True}),
    ],
)
async def test_unknown_or_invalid_params_are_invalid_params_never_ignored(
    daemon: Daemonish, method: str, params: dict[str, Any]
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        err = await c.error(method, params)
        assert err["code"] == -32602
        assert not daemon.log.opened  # rejected before the database was touched


async def test_an_entry_on_the_wire_has_every_key_and_utc_rfc3339_times(
    daemon: Daemonish,
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        await c.result("eventlog/append", append("e1", content=[1]))
        await c.result(
            "eventlog/append",
            append("e2", metadata={}, timestamp="2025-03-04T05:06:07.5+02:00", branch="b.c"),
        )
        page = await c.result("eventlog/since", {"from_seq": 0})
    assert page["caught_up"] is True and page["next_seq"] == 2
    e1, e2 = page["entries"]
    for entry in (e1, e2):
        assert set(entry) == {"seq", "app", "user", "session", "event", "metadata"}
        assert set(entry["event"]) == {
            "id",
            "author",
            "branch",
            "invocation_id",
            "timestamp",
            "content",
        }
        assert entry["metadata"] is None
        assert entry["event"]["timestamp"].endswith("Z")
    assert e2["event"]["timestamp"] == "2025-03-04T03:06:07.500000Z"
    assert e1["event"]["branch"] == "" and e2["event"]["branch"] == "b.c"
    appended_at = dt.datetime.fromisoformat(e1["event"]["timestamp"])
    assert abs(appended_at - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=1)


async def test_reads_filters_and_branches_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        for i, (session, branch) in enumerate(
            [("p", ""), ("p:sub:x", "sub.x"), ("q", "bg.a"), ("p", "bg")]
        ):
            await c.result("eventlog/append", append(f"e{i}", session=session, branch=branch))
        tree = {"session_tree": {"app": "app", "user": "u", "parent": "p"}}
        page = await c.result("eventlog/since", {"from_seq": 0, "filter": tree, "limit": 2})
        assert [e["event"]["id"] for e in page["entries"]] == ["e0", "e1"]
        assert page["caught_up"] is False
        assert await c.result("eventlog/latest_seq", {"filter": tree}) == {"seq": 4}
        assert await c.result("eventlog/latest_seq", {"filter": {"app": "none"}}) == {"seq": 0}
        assert await c.result("eventlog/branches", {}) == {"branches": ["bg", "bg.a", "sub.x"]}
        assert await c.result("eventlog/branches", {"filter": {"branch_prefixes": ["bg"]}}) == {
            "branches": ["bg", "bg.a"]
        }


async def test_sessions_over_the_wire_with_not_found_distinct(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        err = await c.error("eventlog/sessions.get", {"app": "app", "user": "u", "session": "x"})
        assert err["code"] == -32012
        created = await c.result("eventlog/sessions.create", {"app": "app", "user": "u"})
        assert set(created) == {"app", "user", "session", "state", "created_at", "updated_at"}
        sid = created["session"]
        await c.result("eventlog/append", append("e1", session=sid))
        await c.result("eventlog/append", append("e2", session=sid))
        got = await c.result(
            "eventlog/sessions.get", {"app": "app", "user": "u", "session": sid, "recent": 1}
        )
        assert [e["event"]["id"] for e in got["events"]] == ["e2"]
        listed = await c.result("eventlog/sessions.list", {"app": "app"})
        assert [s["session"] for s in listed["sessions"]] == [sid]
        assert "events" not in listed["sessions"][0]
        assert (
            await c.result("eventlog/sessions.delete", {"app": "app", "user": "u", "session": sid})
            == {}
        )
        err = await c.error("eventlog/sessions.get", {"app": "app", "user": "u", "session": sid})
        assert err["code"] == -32012


async def test_watch_streams_history_then_another_clients_append_at_once(
    daemon: Daemonish,
) -> None:
    # The log polls only every 60 s: a live delivery inside the bound is the
    # in-process wake-up, across two client connections.
    with trio.fail_after(10):
        writer, watcher = await daemon.connect(), await daemon.connect()
        await writer.result("eventlog/append", append("old", session="s"))
        await writer.result("eventlog/append", append("other", session="t"))
        watch_id = await watcher.start(
            "eventlog/watch", {"from_seq": 0, "filter": {"session": "s"}}
        )
        note = await watcher.notification()
        assert note["method"] == "eventlog/entry"
        assert note["params"]["watch"] == watch_id
        assert note["params"]["entry"]["event"]["id"] == "old"
        await writer.result("eventlog/append", append("new", session="s"))
        note = await watcher.notification()
        assert note["params"]["entry"]["event"]["id"] == "new"
        assert note["params"]["entry"]["seq"] == 3
        await watcher.send(
            {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": watch_id}}
        )
        reply = await watcher.response(watch_id)
        assert reply["error"]["code"] == -32007


async def test_watch_answers_last_seq_when_the_connection_shuts_down(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        for i in range(3):
            await c.result("eventlog/append", append(f"e{i}"))
        watch_id = await c.start("eventlog/watch", {"from_seq": 1})
        seen = [(await c.notification())["params"]["entry"]["seq"] for _ in range(2)]
        assert seen == [2, 3]
        shutdown_id = await c.start("recall/shutdown", {})
        assert (await c.response(watch_id))["result"] == {"last_seq": 3}
        assert (await c.response(shutdown_id))["result"] == {}


async def test_a_lease_is_released_when_its_connection_closes(daemon: Daemonish) -> None:
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(10):
        a, b = await daemon.connect(), await daemon.connect()
        held = await a.result("eventlog/lock.acquire", key)
        assert set(held) == {"lock", "holder"}
        err = await b.error("eventlog/lock.acquire", key)
        assert err["code"] == -32011
        assert err["data"]["holder"] == held["holder"]
        assert 0 <= err["data"]["heartbeat_age_ms"] < 5000
        await a.stream.send_eof()  # the client goes away without releasing
        with pytest.raises(EOFError):
            while True:
                await a.frame()
        again = await b.result("eventlog/lock.acquire", key)
        assert again["holder"] != held["holder"]
        assert await b.result("eventlog/lock.release", {"lock": again["lock"]}) == {}
        assert await b.result("eventlog/lock.release", {"lock": again["lock"]}) == {}


async def test_a_stolen_lease_is_reported_as_lock_lost_on_its_connection(
    daemon: Daemonish,
) -> None:
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(10):
        a, b = await daemon.connect(), await daemon.connect()
        held = await a.result(
            "eventlog/lock.acquire", {**key, "heartbeat_ms": 150, "stale_after_ms": 1000}
        )
        # B considers 60 ms without a beat stale; A beats every 150 ms.
        while True:
            reply = await b.call(
                "eventlog/lock.acquire", {**key, "heartbeat_ms": 20, "stale_after_ms": 60}
            )
            if "result" in reply:
                break
            assert reply["error"]["code"] == -32011
            await trio.sleep(0.01)
        note = await a.notification()
        assert note == {
            "jsonrpc": "2.0",
            "method": "eventlog/lock_lost",
            "params": {"lock": held["lock"], "holder": held["holder"]},
        }


async def test_boots_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        boot = await c.result(
            "eventlog/boot.record", {"at": "2025-01-01T00:00:00Z", "attempted": ["s1"]}
        )
        assert await c.result("eventlog/boot.update", {"id": boot["id"], "attempted": []}) == {}
        err = await c.error("eventlog/boot.update", {"id": boot["id"] + 1, "attempted": []})
        assert err["code"] == -32602
        recent = await c.result("eventlog/boot.recent", {"since": "2024-12-31T23:00:00+00:00"})
        assert recent == {
            "boots": [{"id": boot["id"], "boot_at": "2025-01-01T00:00:00Z", "attempted": []}]
        }


async def test_the_database_is_created_by_the_first_eventlog_call(tmp_path: Path) -> None:
    path = tmp_path / "lazy" / "events.db"
    with trio.fail_after(10):
        async with EventLog(path) as log, trio.open_nursery() as nursery:
            d = Daemonish(log, nursery, _server(lambda: log))
            c = await d.connect()
            await c.send({"jsonrpc": "2.0", "id": 1, "method": "no/such", "params": {}})
            assert (await c.response(1))["error"]["code"] == -32601
            assert not path.exists()
            assert await c.result("eventlog/ping", {}) == {}
            assert path.exists()
            nursery.cancel_scope.cancel()
