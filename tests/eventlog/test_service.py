"""The eventlog/* JSON-RPC methods, driven through the real RPC layer.

Clients talk to :class:`streamd.rpc.Server` over in-memory streams with raw JSON
frames, so these tests see exactly the bytes a client would.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import mocked
from support.service import HEAVY, Daemonish, _server, append

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.service import METHOD_NAMES
from streamd.eventlog.store import LeaseKey

SPEC_METHODS = {
    "eventlog/append",
    "eventlog/append_batch",
    "eventlog/since",
    "eventlog/watch",
    "eventlog/latest_seq",
    "eventlog/branches",
    "eventlog/sessions.create",
    "eventlog/sessions.get",
    "eventlog/sessions.get_many",
    "eventlog/sessions.list",
    "eventlog/sessions.delete",
    "eventlog/state.get",
    "eventlog/retention.set",
    "eventlog/retention.get",
    "eventlog/compact",
    "eventlog/lock.acquire",
    "eventlog/lock.release",
    "eventlog/boot.record",
    "eventlog/boot.update",
    "eventlog/boot.recent",
    "eventlog/ping",
}











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
        assert set(created) == {
            "app", "user", "session", "state", "created_at", "updated_at", "last_seq"
        }
        assert created["last_seq"] == 0
        sid = created["session"]
        await c.result("eventlog/append", append("e1", session=sid))
        e2 = await c.result("eventlog/append", append("e2", session=sid))
        got = await c.result(
            "eventlog/sessions.get", {"app": "app", "user": "u", "session": sid, "recent": 1}
        )
        assert [e["event"]["id"] for e in got["events"]] == ["e2"]
        assert got["last_seq"] == e2["seq"]
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


async def test_a_lease_released_by_another_client_is_reported_lost_to_its_holder(
        daemon: Daemonish) -> None:
    # The holder must learn it, or it works on as if it held the session
    # while a third client takes it.
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(10):
        a, b, c = await daemon.connect(), await daemon.connect(), await daemon.connect()
        held = await a.result("eventlog/lock.acquire", key)
        assert await b.result("eventlog/lock.release", {"lock": held["lock"]}) == {}
        assert await a.notification() == {
            "jsonrpc": "2.0", "method": "eventlog/lock_lost",
            "params": {"lock": held["lock"], "holder": held["holder"]}}
        taken = await c.result("eventlog/lock.acquire", key)
        assert taken["holder"] != held["holder"]
        # Released by its own holder: nothing is said to anyone.
        assert await c.result("eventlog/lock.release", {"lock": taken["lock"]}) == {}
        assert await c.result("eventlog/ping", {}) == {}
        assert c.notifications == [] and a.notifications == []


async def test_a_stolen_lease_is_reported_as_lock_lost_on_its_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(60):
        async with mocked(tmp_path / "events.db") as log, trio.open_nursery() as nursery:
            daemon = Daemonish(log, nursery, _server(lambda: log))
            a, b = await daemon.connect(), await daemon.connect()
            held = await a.result(
                "eventlog/lock.acquire", {**key, "heartbeat_ms": 50, "stale_after_ms": 150}
            )
            # A's heartbeats fail (a wedged disk) until B has taken the lease, which
            # B can do only once A's beat is older than A's own 150 ms window.
            writer = log.connections.writer
            real = writer.heartbeat_leases
            paused = {"holder": held["holder"]}

            def heartbeats(beats: list[LeaseKey], now_us: int) -> list[bool]:
                if any(b.holder == paused.get("holder") for b in beats):
                    raise RpcError(SOURCE_UNAVAILABLE, "disk I/O error")
                return real(beats, now_us)

            monkeypatch.setattr(writer, "heartbeat_leases", heartbeats)
            err = await b.error("eventlog/lock.acquire", key)
            assert err["code"] == -32011  # A's beat is fresh yet
            await trio.sleep(0.2)  # mock time: 200 ms without a beat
            taken = await b.result("eventlog/lock.acquire", key)
            paused.clear()
            note = await a.notification()
            assert note == {
                "jsonrpc": "2.0",
                "method": "eventlog/lock_lost",
                "params": {"lock": held["lock"], "holder": held["holder"]},
            }
            assert log.lease(held["lock"]) is None and log.lease(taken["lock"]) is not None
            nursery.cancel_scope.cancel()


async def test_a_short_stale_window_alone_is_accepted_with_a_derived_heartbeat(
    daemon: Daemonish,
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        key = {"app": "app", "user": "u", "session": "s"}
        held = await c.result("eventlog/lock.acquire", {**key, "stale_after_ms": 800})
        assert set(held) == {"lock", "holder"}
        (lease,) = await daemon.log.list_locks()
        assert lease.stale_after_ms == 800
        assert daemon.log.lease(held["lock"]).heartbeat_ms == 266


async def test_a_healthy_lease_is_not_taken_by_a_client_asking_with_a_tiny_window(
    daemon: Daemonish,
) -> None:
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(10):
        a, b = await daemon.connect(), await daemon.connect()
        held = await a.result(
            "eventlog/lock.acquire", {**key, "stale_after_ms": 30_000, "heartbeat_ms": 5000}
        )
        err = await b.error(
            "eventlog/lock.acquire", {**key, "stale_after_ms": 2, "heartbeat_ms": 1}
        )
        assert err == {
            "code": -32602,
            "message": "eventlog/lock.acquire params: stale_after_ms must be at least 150, not 2",
        }
        err = await b.error(
            "eventlog/lock.acquire", {**key, "stale_after_ms": 150, "heartbeat_ms": 50}
        )
        assert err["code"] == -32011 and err["data"]["holder"] == held["holder"]
        assert [lease.holder for lease in await daemon.log.list_locks()] == [held["holder"]]


KEY_PARAMS = {"app": "a", "user": "u", "session": "s"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"heartbeat_ms": 49}, "heartbeat_ms must be at least 50, not 49"),
        ({"stale_after_ms": 149}, "stale_after_ms must be at least 150, not 149"),
        (
            {"stale_after_ms": 300, "heartbeat_ms": 151},
            "stale_after_ms (300) must be at least twice heartbeat_ms (151)",
        ),
        ({"heartbeat_ms": 0}, "Expected `int` >= 1 - at `$.heartbeat_ms`"),
    ],
)
async def test_lease_values_below_the_floors_are_invalid_params_naming_field_and_floor(
    daemon: Daemonish, params: dict[str, int], message: str
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        err = await c.error("eventlog/lock.acquire", {**KEY_PARAMS, **params})
        assert err == {"code": -32602, "message": f"eventlog/lock.acquire params: {message}"}
        assert not daemon.log.opened


BIG = 2**63


@pytest.mark.parametrize(
    ("method", "params", "path"),
    [
        ("eventlog/since", {"from_seq": BIG}, "$.from_seq"),
        ("eventlog/since", {"from_seq": 0, "limit": BIG}, "$.limit"),
        ("eventlog/watch", {"from_seq": BIG}, "$.from_seq"),
        ("eventlog/branches", {"limit": BIG}, "$.limit"),
        ("eventlog/sessions.get", {**KEY_PARAMS, "after_seq": BIG}, "$.after_seq"),
        ("eventlog/sessions.get", {**KEY_PARAMS, "recent": BIG}, "$.recent"),
        ("eventlog/lock.acquire", {**KEY_PARAMS, "stale_after_ms": BIG}, "$.stale_after_ms"),
        ("eventlog/lock.acquire", {**KEY_PARAMS, "heartbeat_ms": BIG}, "$.heartbeat_ms"),
        ("eventlog/boot.update", {"id": BIG, "attempted": []}, "$.id"),
        ("eventlog/boot.update", {"id": -BIG - 1, "attempted": []}, "$.id"),
    ],
)
async def test_integers_past_int64_are_invalid_params_not_internal_errors(
    daemon: Daemonish, method: str, params: dict[str, Any], path: str
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        err = await c.error(method, params)
        assert err["code"] == -32602, err
        assert err["message"].endswith(f" - at `{path}`")
        # The largest int64 itself is a valid value where one is allowed.
        if method == "eventlog/since" and path == "$.from_seq":
            page = await c.result(method, {"from_seq": BIG - 1})
            assert page == {"entries": [], "next_seq": BIG - 1, "caught_up": True}


# 9999-12-31T23:59:59-14:00 is 10000-01-01T13:59:59Z and 0001-01-01T00:00:00+14:00
# is 0000-12-31T10:00:00Z: in microseconds since the epoch, as a store would hold
# them had they been accepted (or as an older streamd did).
YEAR_10000_US = 253_402_351_199_000_000
YEAR_0_US = -62_135_647_200_000_000


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
async def test_a_timestamp_outside_years_1_to_9999_in_utc_is_refused_at_append(
    daemon: Daemonish, when: str
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        err = await c.error("eventlog/append", append("e1", timestamp=when))
        assert err == {
            "code": -32602,
            "message": "eventlog/append params: event.timestamp must lie within"
            " 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z once converted to UTC,"
            f" not {when}",
        }
        err = await c.error("eventlog/boot.record", {"at": when, "attempted": []})
        assert err["code"] == -32602 and "at must lie within" in err["message"]
        # The edges themselves are fine.
        edge = append("e2", timestamp="9999-12-31T23:59:59.999999Z")
        assert await c.result("eventlog/append", edge) == {"seq": 1, "duplicate": False}
        page = await c.result("eventlog/since", {"from_seq": 0})
        assert page["entries"][0]["event"]["timestamp"] == "9999-12-31T23:59:59.999999Z"


async def test_a_stored_time_that_cannot_be_rendered_never_fails_a_read_or_a_watch(
    daemon: Daemonish,
) -> None:
    import apsw

    with trio.fail_after(10):
        c = await daemon.connect()
        await c.result("eventlog/append", append("ok1"))
        # Rows as an older streamd would have written them, straight into SQLite.
        db = apsw.Connection(str(daemon.log.path))
        with db:
            for event_id, when in (("late", YEAR_10000_US), ("early", YEAR_0_US)):
                db.execute(
                    "INSERT INTO events (app_name, user_id, session_id, event_id,"
                    " invocation_id, author, branch, event_time, content, metadata, digest)"
                    " VALUES ('app', 'u', 's', ?, '', 'agent', '', ?, '\"x\"', NULL, x'00')",
                    (event_id, when),
                )
        db.close()
        await c.result("eventlog/append", append("ok2"))

        page = await c.result("eventlog/since", {"from_seq": 0})
        assert [e["event"]["id"] for e in page["entries"]] == ["ok1", "late", "early", "ok2"]
        ok1, late, early, ok2 = page["entries"]
        for damaged in (late, early):
            assert damaged["event"]["timestamp"] is None
            assert damaged["event"]["content"] == "x"
            assert damaged["damaged"] == ["event.timestamp"]
        for intact in (ok1, ok2):
            assert "damaged" not in intact and intact["event"]["timestamp"].endswith("Z")

        got = await c.result("eventlog/sessions.get", {"app": "app", "user": "u", "session": "s"})
        assert [e["event"]["timestamp"] is None for e in got["events"]] == [
            False,
            True,
            True,
            False,
        ]

        watcher = await daemon.connect()
        watch_id = await watcher.start("eventlog/watch", {"from_seq": 0})
        seen = [(await watcher.notification())["params"]["entry"] for _ in range(4)]
        assert [e["event"]["id"] for e in seen] == ["ok1", "late", "early", "ok2"]
        assert seen[1]["damaged"] == ["event.timestamp"]
        # The watch (and the daemon) live on past the damaged rows.
        await c.result("eventlog/append", append("ok3"))
        note = await watcher.notification()
        assert note["params"]["entry"]["event"]["id"] == "ok3"
        assert note["params"]["watch"] == watch_id




async def test_a_since_page_stops_before_4_mib_and_says_how_to_continue(
    daemon: Daemonish,
) -> None:
    with trio.fail_after(30):
        c = await daemon.connect()
        for i in range(6):
            await c.result("eventlog/append", append(f"e{i}", content=HEAVY))
        seqs, cursor, frames = [], 0, []
        while True:
            request_id = await c.start("eventlog/since", {"from_seq": cursor})
            while b"\n" not in c.buffer:
                c.buffer += await c.stream.receive_some(1 << 20)
            frames.append(c.buffer.index(b"\n"))
            page = (await c.response(request_id))["result"]
            seqs.append([e["seq"] for e in page["entries"]])
            cursor = page["next_seq"]
            if page["caught_up"]:
                break
        assert seqs == [[1, 2], [3, 4], [5, 6]]
        assert max(frames) < 4 * 1024 * 1024 < 8 * 1024 * 1024
        assert all(e["event"]["content"] == HEAVY for e in page["entries"])


async def test_sessions_get_stops_before_4_mib_with_truncated_and_continues_from_next_seq(
    daemon: Daemonish,
) -> None:
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(30):
        c = await daemon.connect()
        for i in range(6):
            await c.result("eventlog/append", append(f"e{i}", content=HEAVY))
        await c.result("eventlog/append", append("small"))  # seq 7
        answers = []
        params: dict[str, Any] = dict(key)
        while True:
            got = await c.result("eventlog/sessions.get", params)
            answers.append(([e["seq"] for e in got["events"]], got.get("truncated")))
            if "next_seq" not in got:
                break
            assert got["next_seq"] == got["events"][-1]["seq"]
            params = {**key, "after_seq": got["next_seq"]}
        assert answers == [([1, 2], True), ([3, 4], True), ([5, 6, 7], None)]
        # The last answer has the shape an uncut answer always had.
        assert set(got) == {
            "app", "user", "session", "state", "created_at", "updated_at", "last_seq", "events"
        }
        # `recent` keeps its window: the newest 5 are 3..7, read oldest first.
        answers, params = [], {**key, "recent": 5}
        while True:
            got = await c.result("eventlog/sessions.get", params)
            answers.append([e["seq"] for e in got["events"]])
            if not got.get("truncated"):
                break
            params = {**key, "recent": 5, "after_seq": got["next_seq"]}
        assert answers == [[3, 4], [5, 6, 7]]


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


async def test_an_eventlog_call_on_another_programs_database_is_refused_naming_the_path(
    tmp_path: Path,
) -> None:
    import hashlib

    import apsw

    path = tmp_path / "theirs.db"
    db = apsw.Connection(str(path))
    db.execute("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep')")
    db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with trio.fail_after(10):
        async with EventLog(path) as log, trio.open_nursery() as nursery:
            c = await Daemonish(log, nursery, _server(lambda: log)).connect()
            err = await c.error("eventlog/append", append("e1"))
            assert err["code"] == -32000
            assert err["message"].startswith(f"{path} is not a streamd event log")
            assert (await c.error("eventlog/ping", {}))["code"] == -32000
            nursery.cancel_scope.cancel()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert [p.name for p in tmp_path.iterdir()] == ["theirs.db"]


async def test_the_database_is_created_by_the_first_eventlog_call(tmp_path: Path) -> None:
    (tmp_path / "lazy").mkdir()  # an explicit path's directory must exist
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
