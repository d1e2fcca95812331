"""Session state in the log: app, user and session state written as deltas in the
transaction of the event that carries them, read current or as of any seq.

Contract tests: they run against every backend of ``test_eventlog_store``
(through its ``fx`` fixture), plus the SQLite migration and the wire method.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
from support.service import Daemonish
from support.store_contract import SECOND, T0, Fixture, ap, ev

from streamd.errors import (
    EVENT_CONFLICT,
    INVALID_PARAMS,
    SOURCE_UNAVAILABLE,
    RpcError,
    is_session_not_found,
)
from streamd.eventlog.model import (
    MAX_STATE_BYTES,
    AppendResult,
    SessionCreateParams,
    SessionGetParams,
    SinceParams,
    StateDelta,
)
from streamd.eventlog.sqlite import SCHEMA_VERSION, SqliteStore


def delta(**scopes: dict[str, Any]) -> StateDelta:
    return StateDelta(**scopes)


def state(fx: Fixture, user: str | None = "u", session: str | None = "s", at: int | None = None):
    return fx.store.get_state("app", user, session, at)


def test_a_delta_sets_each_scope_in_the_transaction_of_its_event(fx: Fixture) -> None:
    r = fx.store.append(
        ap(ev("e1"), state_delta=delta(app={"a": 1}, user={"u": 2}, session={"s": 3})), T0
    )
    got = state(fx)
    assert (got.app, got.user, got.session) == ({"a": 1}, {"u": 2}, {"s": 3})
    assert got.seq == r.seq
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert entry.state_delta == delta(app={"a": 1}, user={"u": 2}, session={"s": 3})
    session = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s", scoped_state=True)
    )
    assert (session.state, session.app_state, session.user_state) == ({"s": 3}, {"a": 1}, {"u": 2})
    # Without scoped_state the shared scopes are not read (and not on the wire).
    plain = fx.store.get_session(SessionGetParams(app="app", user="u", session="s"))
    assert plain.app_state is None and plain.user_state is None


def test_a_delta_replaces_top_level_keys_whole_and_null_is_a_value(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), state_delta=delta(session={"k": {"x": 1, "y": 2}, "n": 1})), T0)
    fx.store.append(ap(ev("e2"), state_delta=delta(session={"k": {"z": 3}, "n": None})), T0)
    assert state(fx).session == {"k": {"z": 3}, "n": None}


def test_user_state_is_shared_by_a_users_sessions_and_app_state_by_every_user(
    fx: Fixture,
) -> None:
    fx.store.append(ap(ev("e1"), user="ann", session="a1", state_delta=delta(user={"v": 1})), T0)
    fx.store.append(ap(ev("e2"), user="bob", session="b1", state_delta=delta(app={"g": 1})), T0)
    fx.store.append(ap(ev("e3"), user="ann", session="a2", state_delta=delta(session={"x": 1})), T0)
    a2 = fx.store.get_state("app", "ann", "a2", None)
    assert (a2.app, a2.user, a2.session) == ({"g": 1}, {"v": 1}, {"x": 1})
    b1 = fx.store.get_state("app", "bob", "b1", None)
    assert (b1.app, b1.user, b1.session) == ({"g": 1}, {}, {})
    assert fx.store.get_state("other", None, None, None).app == {}


def test_empty_scopes_are_no_delta_at_all(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), state_delta=delta(app={}, user={}, session={})), T0)
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert entry.state_delta is None
    # And so it is not part of the event's identity: a retry without it is a duplicate.
    assert fx.store.append(ap(ev("e1")), T0).duplicate


def test_state_as_of_a_seq_holds_every_write_up_to_it_and_none_after(fx: Fixture) -> None:
    s1 = fx.store.append(ap(ev("e1"), state_delta=delta(session={"n": 1}, app={"v": "a"})), T0)
    # A creation takes its place at the newest seq: as of s1 its state is there.
    fx.store.create_session(
        SessionCreateParams(
            app="app",
            user="u",
            session="t",
            state={"t": 1},
            app_state={"v": "b"},
            user_state={"w": 1},
        ),
        T0,
    )
    s2 = fx.store.append(ap(ev("e2"), state_delta=delta(session={"n": 2}, user={"w": 2})), T0)
    s3 = fx.store.append(ap(ev("e3"), session="t", state_delta=delta(session={"t": 3})), T0)
    assert state(fx, at=0).session == {} and state(fx, at=0).app == {}
    at1 = state(fx, at=s1.seq)
    assert (at1.app, at1.user, at1.session) == ({"v": "b"}, {"w": 1}, {"n": 1})
    at2 = state(fx, at=s2.seq)
    assert (at2.user, at2.session) == ({"w": 2}, {"n": 2})
    assert fx.store.get_state("app", "u", "t", s2.seq).session == {"t": 1}
    assert fx.store.get_state("app", "u", "t", s3.seq).session == {"t": 3}
    # As of the newest seq, the fold equals the current state.
    current = state(fx)
    assert current == state(fx, at=current.seq)
    # Past the newest, it is the state now, and says which seq that is: an
    # answer the next write does not make false.
    assert state(fx, at=s3.seq + 100) == current
    fx.store.append(ap(ev("e4"), state_delta=delta(session={"n": 4})), T0)
    assert state(fx, at=s3.seq).session == current.session


def test_an_event_refused_in_a_batch_sets_no_state(fx: Fixture) -> None:
    fx.store.append(ap(ev("taken", 1)), T0)
    results = fx.store.append_batch(
        [
            ap(ev("a"), state_delta=delta(session={"a": 1})),
            ap(ev("taken", 2), state_delta=delta(session={"bad": 1}, app={"bad": 1})),
            ap(ev("b"), state_delta=delta(session={"b": 1})),
        ],
        T0,
    )
    assert isinstance(results[1], RpcError) and results[1].code == EVENT_CONFLICT
    got = state(fx)
    assert (got.app, got.session) == ({}, {"a": 1, "b": 1})
    assert state(fx, at=got.seq).session == {"a": 1, "b": 1}


def test_a_retry_is_a_duplicate_only_with_the_same_delta_and_applies_it_once(
    fx: Fixture,
) -> None:
    first = fx.store.append(ap(ev("e1"), state_delta=delta(user={"count": 1})), T0)
    fx.store.append(ap(ev("e2"), state_delta=delta(user={"count": 2})), T0)
    again = fx.store.append(ap(ev("e1"), state_delta=delta(user={"count": 1})), T0)
    assert again == AppendResult(seq=first.seq, duplicate=True)
    assert state(fx).user == {"count": 2}  # the retry did not set count back to 1
    with pytest.raises(RpcError) as info:
        fx.store.append(ap(ev("e1"), state_delta=delta(user={"count": 9})), T0)
    assert info.value.code == EVENT_CONFLICT
    with pytest.raises(RpcError):
        fx.store.append(ap(ev("e1")), T0)  # nor without the delta it was appended with


def test_create_merges_app_and_user_state_and_sets_the_sessions_own(fx: Fixture) -> None:
    fx.store.create_session(
        SessionCreateParams(
            app="app",
            user="u",
            session="s1",
            state={"mine": 1},
            app_state={"a": 1},
            user_state={"u": 1},
        ),
        T0,
    )
    fx.store.create_session(
        SessionCreateParams(app="app", user="u", session="s2", app_state={"b": 2}), T0
    )
    got = fx.store.get_state("app", "u", "s2", None)
    assert (got.app, got.user, got.session) == ({"a": 1, "b": 2}, {"u": 1}, {})
    assert fx.store.get_state("app", "u", "s1", None).session == {"mine": 1}
    with pytest.raises(RpcError) as info:
        fx.store.create_session(
            SessionCreateParams(app="app", user="u", session="s1", app_state={"a": "lost"}), T0
        )
    assert info.value.code == INVALID_PARAMS
    assert info.value.data["reason"] == "session_exists"
    assert fx.store.get_state("app", None, None, None).app == {"a": 1, "b": 2}


def test_deleting_a_session_keeps_the_state_its_user_and_app_share(fx: Fixture) -> None:
    r = fx.store.append(
        ap(ev("e1"), state_delta=delta(app={"a": 1}, user={"u": 1}, session={"s": 1})), T0
    )
    fx.store.delete_session("app", "u", "s")
    got = fx.store.get_state("app", "u", None, None)
    assert (got.app, got.user, got.session) == ({"a": 1}, {"u": 1}, None)
    assert fx.store.get_state("app", "u", None, r.seq).user == {"u": 1}
    with pytest.raises(RpcError) as info:
        fx.store.get_state("app", "u", "s", r.seq)
    assert is_session_not_found(info.value)
    # A session of the same name starts with no state of the deleted one.
    fx.store.append(ap(ev("e2")), T0)
    assert fx.store.get_state("app", "u", "s", None).session == {}
    assert fx.store.get_state("app", "u", "s", r.seq).session == {}


def test_state_of_a_session_never_written_is_not_found_and_needs_its_user(fx: Fixture) -> None:
    with pytest.raises(RpcError) as info:
        fx.store.get_state("app", "u", "ghost", None)
    assert is_session_not_found(info.value)
    with pytest.raises(RpcError) as bad:
        fx.store.get_state("app", None, "s", None)
    assert bad.value.code == INVALID_PARAMS


def test_an_empty_log_has_empty_state_at_seq_0(fx: Fixture) -> None:
    got = fx.store.get_state("app", "u", None, None)
    assert (got.seq, got.app, got.user, got.session) == (0, {}, {}, None)


def test_state_that_cannot_be_json_is_refused_and_nothing_is_written(fx: Fixture) -> None:
    results = fx.store.append_batch([ap(ev("e1"), state_delta=delta(app={"x": object()}))], T0)
    assert isinstance(results[0], RpcError) and results[0].code == INVALID_PARAMS
    assert fx.store.latest_seq(None) == 0


def test_damaged_stored_state_is_refused_for_merging_and_read_as_empty(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), state_delta=delta(app={"keep": 1})), T0)
    fx.raw("UPDATE app_states SET state = '{broken'", ())
    with pytest.raises(RpcError) as info:
        fx.store.append(ap(ev("e2"), state_delta=delta(app={"x": 1})), T0)
    assert info.value.code == SOURCE_UNAVAILABLE
    assert [e.event.id for e in fx.store.since(SinceParams(from_seq=0, limit=10)).entries] == ["e1"]
    assert fx.store.get_state("app", None, None, None).app == {}  # a read never fails
    # Events without app state are still written.
    fx.store.append(ap(ev("e3"), state_delta=delta(session={"y": 1})), T0)


def test_a_version_2_database_migrates_keeping_state_and_finding_last_seqs(
    tmp_path: Path,
) -> None:
    from streamd.eventlog.sqlite.schema import MIGRATIONS

    path = str(tmp_path / "v2.db")
    db = apsw.Connection(path)
    with db:
        db.execute(MIGRATIONS[0])
        db.execute(MIGRATIONS[1])
        db.pragma("user_version", 2)
        db.execute(
            "INSERT INTO sessions VALUES ('app', 'u', 's', '{\"kept\": true}', ?, ?)", (T0, T0)
        )
        db.execute("INSERT INTO sessions VALUES ('app', 'u', 'empty', '{}', ?, ?)", (T0, T0))
        for i in range(3):
            db.execute(
                "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id,"
                " author, branch, event_time, content, metadata, digest)"
                " VALUES ('app', 'u', 's', ?, '', 'a', '', ?, 'null', NULL, x'00')",
                (f"e{i}", T0),
            )
    db.close()
    store = SqliteStore.open(path)
    assert store.connection.pragma("user_version") == SCHEMA_VERSION == 8
    got = store.get_session(SessionGetParams(app="app", user="u", session="s"))
    assert (got.state, got.last_seq) == ({"kept": True}, 3)
    assert store.get_session(SessionGetParams(app="app", user="u", session="empty")).last_seq == 0
    assert store.get_state("app", "u", "s", 0).session == {"kept": True}
    store.append(ap(ev("e9"), state_delta=delta(session={"new": 1})), T0 + SECOND)
    assert store.get_state("app", "u", "s", None).session == {"kept": True, "new": 1}
    store.close()


async def test_state_get_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        params = {
            "app": "app",
            "user": "u",
            "session": "s",
            "event": {"id": "e1", "author": "agent", "content": None},
            "state_delta": {"app": {"a": 1}, "session": {"s": [1]}},
        }
        first = await c.result("eventlog/append", params)
        entries = (await c.result("eventlog/since", {"from_seq": 0}))["entries"]
        assert entries[0]["state_delta"] == {"app": {"a": 1}, "session": {"s": [1]}}
        got = await c.result("eventlog/state.get", {"app": "app", "user": "u", "session": "s"})
        assert got == {"seq": first["seq"], "app": {"a": 1}, "user": {}, "session": {"s": [1]}}
        at0 = await c.result("eventlog/state.get", {"app": "app", "as_of_seq": 0})
        assert at0 == {"seq": 0, "app": {}, "user": None, "session": None}
        err = await c.error("eventlog/state.get", {"app": "app", "session": "s"})
        assert err["code"] == -32602 and "needs its user" in err["message"]
        err = await c.error("eventlog/append", {**params, "state_delta": {"apps": {}}})
        assert err["code"] == -32602 and "apps" in err["message"]
        got = await c.result(
            "eventlog/sessions.get",
            {"app": "app", "user": "u", "session": "s", "scoped_state": True},
        )
        assert (got["app_state"], got["user_state"], got["last_seq"]) == ({"a": 1}, {}, 1)


@pytest.mark.parametrize("scope", ["app", "user", "session"])
def test_a_delta_growing_a_state_past_its_limit_is_refused_alone_and_nothing_of_it_stays(
    fx: Fixture, scope: str
) -> None:
    # Grown by deltas without a bound, a state made every read of its session
    # an answer over the frame limit, which no client can read.
    third = "x" * (MAX_STATE_BYTES // 3)
    for i in range(2):
        fx.store.append(ap(ev(f"e{i}"), state_delta=delta(**{scope: {f"k{i}": third}})), T0)
    got = fx.store.append_batch([
        ap(ev("e2"), state_delta=delta(**{scope: {"k2": third + "xx"}})),
        ap(ev("e3"), state_delta=delta(**{scope: {"k0": "small"}})),
    ], T0)
    assert isinstance(got[0], RpcError) and got[0].code == INVALID_PARAMS
    assert f"over the {MAX_STATE_BYTES} a state may take" in got[0].message
    assert isinstance(got[1], AppendResult)
    held = getattr(state(fx), scope)
    assert sorted(held) == ["k0", "k1"] and held["k0"] == "small"
    assert [e.event.id for e in fx.store.since(SinceParams(from_seq=0)).entries] == [
        "e0", "e1", "e3"
    ]


def test_a_new_sessions_state_over_the_limit_is_refused_and_no_session_is_made(
    fx: Fixture,
) -> None:
    big = {"k": "é" * (MAX_STATE_BYTES // 2)}  # under the limit in characters, over in bytes
    with pytest.raises(RpcError) as info:
        fx.store.create_session(
            SessionCreateParams(app="app", user="u", session="big", state=big), T0
        )
    assert info.value.code == INVALID_PARAMS and "session 'big' state" in info.value.message
    with pytest.raises(RpcError) as gone:
        fx.store.get_session(SessionGetParams(app="app", user="u", session="big"))
    assert is_session_not_found(gone.value)


def test_a_state_already_past_the_limit_still_takes_a_delta_that_does_not_grow_it(
    fx: Fixture,
) -> None:
    # Made before there was a limit (written here as an old daemon would):
    # refusing every delta would freeze its session for good.
    fx.store.append(ap(ev("e0"), state_delta=delta(session={"turn": 1})), T0)
    legacy = {"big": "x" * (MAX_STATE_BYTES + 10), "turn": 1}
    fx.raw("UPDATE sessions SET state = ? WHERE session_id = ?", (json.dumps(legacy), "s"))
    same = fx.store.append(ap(ev("e1"), state_delta=delta(session={"turn": 2})), T0)
    assert isinstance(same, AppendResult)
    assert state(fx).session == {**legacy, "turn": 2}
    with pytest.raises(RpcError) as info:
        fx.store.append(ap(ev("e2"), state_delta=delta(session={"more": "y"})), T0)
    assert info.value.code == INVALID_PARAMS
    shrink = fx.store.append(ap(ev("e3"), state_delta=delta(session={"big": "small"})), T0)
    assert isinstance(shrink, AppendResult) and state(fx).session["big"] == "small"
