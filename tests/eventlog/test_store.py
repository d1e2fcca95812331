"""Contract tests for the storage backends of the event log.

Every test here runs against each backend in ``BACKENDS`` through the
:class:`~streamd.eventlog.store.Backend` protocol; a new backend (PostgreSQL) joins
by adding a factory. Only the ``raw`` hook, used to damage rows on purpose, is
backend-specific. Times are passed in explicitly, so nothing here sleeps.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest
from support.store_contract import SECOND, T0, Fixture, ap, ev

from streamd.errors import (
    CLOSED,
    EVENT_CONFLICT,
    INVALID_PARAMS,
    SESSION_LOCKED,
    SESSION_NOT_FOUND,
    SOURCE_UNAVAILABLE,
    RpcError,
    is_event_conflict,
    is_session_locked,
    is_session_not_found,
)
from streamd.eventlog.model import (
    AppendParams,
    AppendResult,
    Filter,
    LeaseAcquireParams,
    SessionCreateParams,
    SessionGetParams,
    SessionTree,
    SinceParams,
    StateDelta,
    from_us,
)
from streamd.eventlog.sqlite import SCHEMA_VERSION, SqliteOptions, SqliteStore
from streamd.eventlog.store import AppendGroup, Backend, ReadShape


def seqs(store: Backend, flt: Filter | None = None, from_seq: int = 0) -> list[int]:
    return [
        e.seq for e in store.since(SinceParams(from_seq=from_seq, filter=flt, limit=10_000)).entries
    ]


def ids(store: Backend, flt: Filter | None = None) -> list[str]:
    return [
        e.event.id for e in store.since(SinceParams(from_seq=0, filter=flt, limit=10_000)).entries
    ]


# --- append -------------------------------------------------------------------


@pytest.mark.parametrize(
    "content", [{"b": [1, 2.5, None, True], "a": "é\u2028"}, "text", 0, None, [], {}]
)
def test_raw_content_is_the_stored_json_of_the_decoded_content(fx: Fixture, content: Any) -> None:
    fx.store.append(ap(ev("e1", content)), T0)
    decoded = fx.store.since(SinceParams(from_seq=0, limit=10)).entries[0]
    raw = fx.store.since(SinceParams(from_seq=0, limit=10), ReadShape.of(raw_content=True)).entries[
        0
    ]
    assert isinstance(raw.event.content, msgspec.Raw)
    assert msgspec.json.decode(raw.event.content) == decoded.event.content == content
    # On the wire the two are the same bytes.
    assert msgspec.json.encode(raw) == msgspec.json.encode(decoded)
    got = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s"), ReadShape.of(raw_content=True)
    ).events[0]
    assert msgspec.json.encode(got) == msgspec.json.encode(decoded)


def test_seqs_increase_strictly_in_append_order(fx: Fixture) -> None:
    got = [fx.store.append(ap(ev(f"e{i}")), T0).seq for i in range(20)]
    assert got == sorted(got) and len(set(got)) == 20
    assert seqs(fx.store) == got


def test_reappending_identical_event_returns_original_seq_as_duplicate(fx: Fixture) -> None:
    first = fx.store.append(ap(ev("e1", {"k": [1, 2]}), metadata={"caller": "me"}), T0)
    fx.store.append(ap(ev("e2")), T0)
    again = fx.store.append(ap(ev("e1", {"k": [1, 2]}), metadata={"caller": "me"}), T0 + SECOND)
    assert first == AppendResult(seq=first.seq, duplicate=False)
    assert again == AppendResult(seq=first.seq, duplicate=True)
    assert ids(fx.store) == ["e1", "e2"]


def test_key_order_inside_content_does_not_make_a_retry_a_conflict(fx: Fixture) -> None:
    a = fx.store.append(ap(ev("e1", {"a": 1, "b": {"c": 2, "d": 3}})), T0)
    b = fx.store.append(ap(ev("e1", {"b": {"d": 3, "c": 2}, "a": 1})), T0)
    assert b == AppendResult(seq=a.seq, duplicate=True)


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(ap(ev("e1", {"k": 2})), id="content"),
        pytest.param(ap(ev("e1", {"k": 1}, author="other")), id="author"),
        pytest.param(ap(ev("e1", {"k": 1}, branch="b")), id="branch"),
        pytest.param(ap(ev("e1", {"k": 1}), session="s2"), id="session"),
        pytest.param(ap(ev("e1", {"k": 1}), metadata={"caller": "x"}), id="metadata"),
        pytest.param(
            ap(ev("e1", {"k": 1}, timestamp=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))),
            id="timestamp",
        ),
    ],
)
def test_same_event_id_with_different_content_is_a_conflict_and_writes_nothing(
    fx: Fixture, changed: AppendParams
) -> None:
    original = fx.store.append(ap(ev("e1", {"k": 1})), T0)
    before = fx.store.since(SinceParams(from_seq=0, limit=100))
    with pytest.raises(RpcError) as info:
        fx.store.append(changed, T0 + SECOND)
    assert info.value.code == EVENT_CONFLICT and is_event_conflict(info.value)
    assert info.value.data == {"event_id": "e1", "seq": original.seq}
    assert fx.store.since(SinceParams(from_seq=0, limit=100)) == before
    assert fx.store.latest_seq(None) == original.seq
    if changed.session == "s2":
        # Not even the session row of the rejected append was written.
        with pytest.raises(RpcError) as nf:
            fx.store.get_session(SessionGetParams(app="app", user="u", session="s2"))
        assert is_session_not_found(nf.value)


def test_batch_commits_every_good_event_when_one_conflicts(fx: Fixture) -> None:
    fx.store.append(ap(ev("taken", 1)), T0)
    results = fx.store.append_batch(
        [ap(ev("a", 1)), ap(ev("taken", 2)), ap(ev("b", 1)), ap(ev("a", 1))], T0
    )
    assert isinstance(results[0], AppendResult) and not results[0].duplicate
    assert isinstance(results[1], RpcError) and results[1].code == EVENT_CONFLICT
    assert isinstance(results[2], AppendResult) and not results[2].duplicate
    # The same id twice in one batch: the second sees the first, inside the txn.
    assert results[3] == AppendResult(seq=results[0].seq, duplicate=True)
    assert ids(fx.store) == ["taken", "a", "b"]


def test_batch_rejects_unencodable_content_for_that_event_only(fx: Fixture) -> None:
    results = fx.store.append_batch([ap(ev("bad", {"x": object()})), ap(ev("good", [1]))], T0)
    assert isinstance(results[0], RpcError) and results[0].code == INVALID_PARAMS
    assert isinstance(results[1], AppendResult)
    assert ids(fx.store) == ["good"]


def test_event_without_timestamp_gets_the_append_time(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1")), T0 + 123)
    given = dt.datetime(2021, 6, 7, 8, 9, 10, 11, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    fx.store.append(ap(ev("e2", timestamp=given)), T0)
    a, b = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert a.event.timestamp == dt.datetime(2025, 1, 2, 3, 4, 5, 123, tzinfo=dt.UTC)
    assert b.event.timestamp == given
    assert b.event.timestamp.utcoffset() == dt.timedelta(0)  # normalised to UTC


def test_entries_round_trip_every_field(fx: Fixture) -> None:
    content = {"parts": [{"text": "hi"}], "n": 1.5, "ok": True, "none": None}
    fx.store.append(
        ap(
            ev("e1", content, author="model", branch="bg.x", invocation_id="inv"),
            metadata={"caller": "alice", "proxy_by": "bot"},
        ),
        T0,
    )
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert (entry.app, entry.user, entry.session) == ("app", "u", "s")
    assert entry.event.content == content
    assert (entry.event.author, entry.event.branch, entry.event.invocation_id) == (
        "model",
        "bg.x",
        "inv",
    )
    assert entry.metadata == {"caller": "alice", "proxy_by": "bot"}


@pytest.mark.parametrize("metadata", [None, {}])
def test_metadata_absent_or_empty_reads_back_as_null(fx: Fixture, metadata: Any) -> None:
    fx.store.append(ap(ev("e1"), metadata=metadata), T0)
    assert fx.store.since(SinceParams(from_seq=0, limit=10)).entries[0].metadata is None


def test_seq_is_never_reused_after_the_newest_events_are_deleted(fx: Fixture) -> None:
    fx.store.append(ap(ev("keep"), session="a"), T0)
    last = fx.store.append(ap(ev("gone"), session="b"), T0).seq
    fx.store.delete_session("app", "u", "b")
    # A watcher whose cursor is at `last` must see the next event.
    nxt = fx.store.append(ap(ev("new"), session="a"), T0).seq
    assert nxt > last
    assert seqs(fx.store, from_seq=last) == [nxt]


# --- since / latest / branches ------------------------------------------------


def _populate(store: Backend) -> None:
    rows = [
        ("e1", "s1", "", "user"),
        ("e2", "s1", "bg.cluster", "core/autonomous"),
        ("e3", "s2", "bg.cluster.child", "model"),
        ("e4", "s1:sub:x", "sub.x", "scion/autonomous"),
        ("e5", "s1", "bg", "model"),
        ("e6", "s1", "bgx", "model"),
    ]
    for event_id, session, branch, author in rows:
        store.append(ap(ev(event_id, author=author, branch=branch), session=session), T0)


def test_since_pages_with_next_seq_and_caught_up(fx: Fixture) -> None:
    for i in range(5):
        fx.store.append(ap(ev(f"e{i}")), T0)
    p1 = fx.store.since(SinceParams(from_seq=0, limit=2))
    assert [e.event.id for e in p1.entries] == ["e0", "e1"] and not p1.caught_up
    p2 = fx.store.since(SinceParams(from_seq=p1.next_seq, limit=2))
    assert [e.event.id for e in p2.entries] == ["e2", "e3"] and not p2.caught_up
    p3 = fx.store.since(SinceParams(from_seq=p2.next_seq, limit=2))
    assert [e.event.id for e in p3.entries] == ["e4"] and p3.caught_up
    p4 = fx.store.since(SinceParams(from_seq=p3.next_seq, limit=2))
    assert p4.entries == [] and p4.caught_up and p4.next_seq == p3.next_seq


def test_exactly_limit_remaining_entries_is_caught_up(fx: Fixture) -> None:
    for i in range(3):
        fx.store.append(ap(ev(f"e{i}")), T0)
    assert fx.store.since(SinceParams(from_seq=0, limit=3)).caught_up
    assert not fx.store.since(SinceParams(from_seq=0, limit=2)).caught_up


@pytest.mark.parametrize("limit", [0, -1])
def test_since_rejects_a_limit_below_one(fx: Fixture, limit: int) -> None:
    with pytest.raises(RpcError) as info:
        fx.store.since(SinceParams(from_seq=0, limit=limit))
    assert info.value.code == INVALID_PARAMS


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (Filter(session="s1"), ["e1", "e2", "e5", "e6"]),
        (Filter(app="app", user="u", session="s2"), ["e3"]),
        (Filter(app="other"), []),
        (
            Filter(session_tree=SessionTree(app="app", user="u", parent="s1")),
            ["e1", "e2", "e4", "e5", "e6"],
        ),
        (Filter(branch_prefixes=["bg"]), ["e2", "e3", "e5"]),
        (Filter(branch_prefixes=["bg.cluster"]), ["e3", "e2"][::-1]),
        (Filter(branch_prefixes=["", "sub"]), ["e4"]),
        (Filter(branch_prefixes=[""]), []),
        (Filter(author="model"), ["e3", "e5", "e6"]),
        (Filter(author_suffix="/autonomous"), ["e2", "e4"]),
        (Filter(session="s1", branch_prefixes=["bg"], author="model"), ["e5"]),
    ],
)
def test_since_applies_each_filter(fx: Fixture, flt: Filter, expected: list[str]) -> None:
    _populate(fx.store)
    assert ids(fx.store, flt) == expected


def test_app_user_and_session_match_case_sensitively(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), app="App", user="U", session="S"), T0)
    assert ids(fx.store, Filter(app="app")) == []
    assert ids(fx.store, Filter(user="u")) == []
    assert ids(fx.store, Filter(session="s")) == []
    assert ids(fx.store, Filter(app="App", user="U", session="S")) == ["e1"]


def test_latest_seq_is_zero_for_an_empty_log_and_respects_filters(fx: Fixture) -> None:
    assert fx.store.latest_seq(None) == 0
    _populate(fx.store)
    all_seqs = seqs(fx.store)
    assert fx.store.latest_seq(None) == all_seqs[-1]
    assert fx.store.latest_seq(Filter(session="s2")) == seqs(fx.store, Filter(session="s2"))[-1]
    assert fx.store.latest_seq(Filter(session="nope")) == 0


def test_nth_newest_seq_counts_matching_entries_not_global_seqs(fx: Fixture) -> None:
    quiet = [fx.store.append(ap(ev(f"q{i}"), session="quiet"), T0).seq for i in range(3)]
    for i in range(10):
        fx.store.append(ap(ev(f"busy{i}"), session="busy"), T0)
    flt = Filter(session="quiet")
    assert fx.store.nth_newest_seq(flt, 0) == quiet[2]
    assert fx.store.nth_newest_seq(flt, 2) == quiet[0]
    assert fx.store.nth_newest_seq(flt, 3) == 0
    assert fx.store.nth_newest_seq(None, 0) == fx.store.latest_seq(None)


def test_branches_are_distinct_sorted_and_never_empty(fx: Fixture) -> None:
    _populate(fx.store)
    fx.store.append(ap(ev("e7", branch="bg.cluster"), session="s1"), T0)
    assert fx.store.branches(None, None) == ["bg", "bg.cluster", "bg.cluster.child", "bgx", "sub.x"]
    assert fx.store.branches(Filter(session="s1"), None) == ["bg", "bg.cluster", "bgx"]
    assert fx.store.branches(None, 2) == ["bg", "bg.cluster"]
    assert fx.store.branches(Filter(branch_prefixes=["bg"]), None) == [
        "bg",
        "bg.cluster",
        "bg.cluster.child",
    ]


# --- sessions -----------------------------------------------------------------


def test_session_never_written_is_not_found_not_a_fault(fx: Fixture) -> None:
    with pytest.raises(RpcError) as info:
        fx.store.get_session(SessionGetParams(app="app", user="u", session="ghost"))
    assert info.value.code == SESSION_NOT_FOUND
    assert is_session_not_found(info.value)
    assert info.value.data == {"app": "app", "user": "u", "session": "ghost"}


def test_a_database_fault_while_getting_a_session_is_not_session_not_found(
    fx: Fixture,
) -> None:
    fx.store.append(ap(ev("e1")), T0)
    fx.raw("DROP TABLE events", ())  # the file is damaged under the store
    with pytest.raises(RpcError) as info:
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s"))
    assert info.value.code == SOURCE_UNAVAILABLE
    assert not is_session_not_found(info.value)


def test_appending_writes_the_session(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), session="s1"), T0)
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session="s1"))
    assert got.state == {} and [e.event.id for e in got.events] == ["e1"]
    assert got.created_at == got.updated_at == dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    fx.store.append(ap(ev("e2"), session="s1"), T0 + SECOND)
    assert (
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s1")).updated_at.second
        == 6
    )


def test_create_generates_an_id_and_keeps_state(fx: Fixture) -> None:
    a = fx.store.create_session(SessionCreateParams(app="app", user="u", state={"x": [1]}), T0)
    b = fx.store.create_session(SessionCreateParams(app="app", user="u"), T0)
    assert a.session and b.session and a.session != b.session
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session=a.session))
    assert got.state == {"x": [1]} and got.events == []


def test_creating_an_existing_session_is_invalid_params_and_changes_nothing(fx: Fixture) -> None:
    fx.store.create_session(
        SessionCreateParams(app="app", user="u", session="s", state={"v": 1}), T0
    )
    with pytest.raises(RpcError) as info:
        fx.store.create_session(
            SessionCreateParams(app="app", user="u", session="s", state={"v": 2}), T0 + SECOND
        )
    assert info.value.code == INVALID_PARAMS
    assert fx.store.get_session(SessionGetParams(app="app", user="u", session="s")).state == {
        "v": 1
    }


def test_get_session_after_seq_and_recent(fx: Fixture) -> None:
    got = [fx.store.append(ap(ev(f"e{i}")), T0).seq for i in range(6)]
    fx.store.append(ap(ev("other"), session="t"), T0)

    def event_ids(after: int, recent: int | None) -> list[str]:
        return [
            e.event.id
            for e in fx.store.get_session(
                SessionGetParams(app="app", user="u", session="s", after_seq=after, recent=recent)
            ).events
        ]

    assert event_ids(0, None) == [f"e{i}" for i in range(6)]
    assert event_ids(got[2], None) == ["e3", "e4", "e5"]
    assert event_ids(0, 2) == ["e4", "e5"]
    assert event_ids(got[4], 3) == ["e5"]


def test_list_sessions_by_app_and_user_without_events(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), user="bob", session="b1"), T0)
    fx.store.create_session(SessionCreateParams(app="app", user="alice", session="a2"), T0)
    fx.store.create_session(SessionCreateParams(app="app", user="alice", session="a1"), T0)
    fx.store.create_session(SessionCreateParams(app="other", user="alice", session="x"), T0)
    listed = fx.store.list_sessions("app", None)
    assert [(s.user, s.session) for s in listed] == [
        ("alice", "a1"),
        ("alice", "a2"),
        ("bob", "b1"),
    ]
    assert not hasattr(listed[0], "events")
    assert [s.session for s in fx.store.list_sessions("app", "alice")] == ["a1", "a2"]


def test_delete_removes_the_session_and_its_events_and_is_idempotent(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), session="s1"), T0)
    fx.store.append(ap(ev("e2"), session="s2"), T0)
    fx.store.delete_session("app", "u", "s1")
    fx.store.delete_session("app", "u", "s1")
    with pytest.raises(RpcError) as info:
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s1"))
    assert is_session_not_found(info.value)
    assert ids(fx.store) == ["e2"]
    # The deleted event's id is free again.
    assert not fx.store.append(ap(ev("e1"), session="s1"), T0).duplicate


# --- leases -------------------------------------------------------------------

KEY = ("app", "u", "s")


def test_fresh_lease_is_session_locked_with_holder_and_age(fx: Fixture) -> None:
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "h/1/aaaaaaaa",
        T0,
    )
    with pytest.raises(RpcError) as info:
        fx.store.acquire_lease(
            LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
            "h/2/bbbbbbbb",
            T0 + 29 * SECOND,
        )
    assert info.value.code == SESSION_LOCKED and is_session_locked(info.value)
    assert info.value.data == {"holder": "h/1/aaaaaaaa", "heartbeat_age_ms": 29_000}


def test_stale_lease_is_stolen_and_old_holder_heartbeat_then_fails(fx: Fixture) -> None:
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "old",
        T0,
    )
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "new",
        T0 + 30 * SECOND,
    )
    assert not fx.store.heartbeat_lease(*KEY, "old", T0 + 31 * SECOND)
    assert fx.store.heartbeat_lease(*KEY, "new", T0 + 31 * SECOND)
    (info,) = fx.store.list_leases()
    assert info.holder == "new"


def test_heartbeat_keeps_a_lease_fresh(fx: Fixture) -> None:
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "old",
        T0,
    )
    assert fx.store.heartbeat_lease(*KEY, "old", T0 + 25 * SECOND)
    with pytest.raises(RpcError) as info:
        fx.store.acquire_lease(
            LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
            "new",
            T0 + 50 * SECOND,
        )
    assert info.value.data["heartbeat_age_ms"] == 25_000


def test_losing_the_steal_race_is_session_locked(fx: Fixture) -> None:
    # Two stealers saw the same stale lease; the first one's conditional update
    # wins. The second one's update names a holder that is no longer there.
    if not isinstance(fx.store, SqliteStore):
        pytest.skip("drives the SQLite steal step directly")
    from streamd.eventlog.sqlite.sql import SqliteSql
    from streamd.eventlog.store.leases import steal

    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "stale",
        T0,
    )
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "first",
        T0 + 60 * SECOND,
    )
    db = fx.store.connection
    with db:
        assert not steal(SqliteSql(db), KEY, "stale", T0, "second", 30_000, T0 + 60 * SECOND)
    assert [i.holder for i in fx.store.list_leases()] == ["first"]


def test_release_never_deletes_a_successors_lease(fx: Fixture) -> None:
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "old",
        T0,
    )
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "new",
        T0 + 40 * SECOND,
    )
    assert not fx.store.release_lease(*KEY, "old")
    assert [i.holder for i in fx.store.list_leases()] == ["new"]
    assert fx.store.release_lease(*KEY, "new")
    assert not fx.store.release_lease(*KEY, "new")
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "third",
        T0 + 41 * SECOND,
    )


def test_a_lease_is_judged_by_the_window_its_holder_declared(fx: Fixture) -> None:
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "patient",
        T0,
    )
    with pytest.raises(RpcError) as info:
        # The requester's own 150 ms window does not make a 5 s old beat stale.
        fx.store.acquire_lease(
            LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=150),
            "hasty",
            T0 + 5 * SECOND,
        )
    assert is_session_locked(info.value)
    assert info.value.data == {"holder": "patient", "heartbeat_age_ms": 5000}
    assert fx.store.release_lease(*KEY, "patient")
    # And the other way round: a holder that promised 150 ms is stale after it,
    # even to a requester that would itself wait 30 s.
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=150), "brief", T0
    )
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000),
        "patient",
        T0 + 200_000,
    )
    (info_row,) = fx.store.list_leases()
    assert (info_row.holder, info_row.stale_after_ms) == ("patient", 30_000)


def test_leases_are_per_session(fx: Fixture) -> None:
    fx.store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session="s1", stale_after_ms=30_000), "a", T0
    )
    fx.store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session="s2", stale_after_ms=30_000), "b", T0
    )
    assert [(i.session, i.holder) for i in fx.store.list_leases("app")] == [
        ("s1", "a"),
        ("s2", "b"),
    ]


# --- boots --------------------------------------------------------------------


def test_boots_round_trip_oldest_first_from_since(fx: Fixture) -> None:
    a = fx.store.record_boot(T0 + 2 * SECOND, ["s1"])
    b = fx.store.record_boot(T0, [])
    c = fx.store.record_boot(T0 + SECOND, ["s2", "s3"])
    got = fx.store.recent_boots(T0 + SECOND)
    assert [(x.id, x.attempted) for x in got] == [(c, ["s2", "s3"]), (a, ["s1"])]
    assert got[0].boot_at == dt.datetime(2025, 1, 2, 3, 4, 6, tzinfo=dt.UTC)
    assert b not in [x.id for x in got]


def test_boot_update_rewrites_attempted_and_unknown_id_is_an_error(fx: Fixture) -> None:
    boot = fx.store.record_boot(T0, ["s1", "s2"])
    fx.store.update_boot(boot, ["s1"])
    assert fx.store.recent_boots(0)[0].attempted == ["s1"]
    with pytest.raises(RpcError) as info:
        fx.store.update_boot(boot + 100, [])
    assert info.value.code == INVALID_PARAMS


def test_boot_with_unparseable_attempted_is_returned_with_null_not_dropped(fx: Fixture) -> None:
    good = fx.store.record_boot(T0, ["s1"])
    bad = fx.store.record_boot(T0 + 1, ["s2"])
    fx.raw("UPDATE boots SET attempted = '{not json' WHERE id = ?", (bad,))
    got = fx.store.recent_boots(0)
    assert [(x.id, x.attempted) for x in got] == [(good, ["s1"]), (bad, None)]


# --- health, errors, schema ---------------------------------------------------


def test_ping_succeeds_on_a_healthy_log(fx: Fixture) -> None:
    fx.store.ping()
    fx.store.append(ap(ev("e1")), T0)
    fx.store.ping()


def test_damaged_metadata_reads_as_null_rather_than_failing_the_replay(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), metadata={"caller": "a"}), T0)
    fx.raw("UPDATE events SET metadata = '[broken'", ())
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert entry.metadata is None and entry.damaged == ["metadata"]


# 10000-01-01T13:59:59Z: what 9999-12-31T23:59:59-14:00 became when it was accepted.
YEAR_10000_US = 253_402_351_199_000_000


@pytest.mark.parametrize("shape", ["decoded", "raw", "encoded"])
def test_rows_that_cannot_be_rendered_read_as_null_and_flagged_never_fail_or_vanish(
    fx: Fixture, shape: str
) -> None:
    for i in range(4):
        fx.store.append(ap(ev(f"e{i}", {"i": i}), metadata={"caller": "c"}), T0)
    fx.raw("UPDATE events SET event_time = ? WHERE event_id = 'e1'", (YEAR_10000_US,))
    fx.raw("UPDATE events SET metadata = '[broken' WHERE event_id = 'e2'", ())
    how = ReadShape.of(raw_content=shape == "raw", encoded=shape == "encoded")

    def on_the_wire(entries: list[Any]) -> list[Any]:
        return [msgspec.json.decode(msgspec.json.encode(e)) for e in entries]

    wire = on_the_wire(fx.store.since(SinceParams(limit=10), how).entries)
    assert [w["event"]["id"] for w in wire] == ["e0", "e1", "e2", "e3"]
    # Only a damaged row carries the flag; nothing else about it is lost.
    assert [w.get("damaged") for w in wire] == [None, ["event.timestamp"], ["metadata"], None]
    assert wire[1]["event"]["timestamp"] is None and wire[1]["event"]["content"] == {"i": 1}
    assert wire[2]["metadata"] is None and wire[2]["event"]["timestamp"].endswith("Z")
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session="s"), how).events
    assert on_the_wire(got) == wire
    recent = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s", recent=3), how
    ).events
    assert on_the_wire(recent) == wire[1:]


def test_content_that_is_not_json_cannot_be_stored_even_by_hand(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1", {"i": 1})), T0)
    refused, message = fx.not_json
    with pytest.raises(refused, match=message):
        fx.raw("UPDATE events SET content = '{nope'", ())
    with pytest.raises(refused, match=message):
        fx.raw(
            "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id,"
            " author, branch, event_time, content, digest)"
            " VALUES ('app', 'u', 's', 'e2', '', 'a', '', 0, 'nope', x'00')",
            (),
        )
    assert ids(fx.store) == ["e1"]
    # A file that arrives without the guard (changed by other means) still reads:
    # a decoded read reports the content instead of failing.
    fx.raw(fx.unguard, ())
    fx.raw("UPDATE events SET content = '{nope'", ())
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert entry.event.content is None and entry.damaged == ["event.content"]


def test_encoded_entries_are_the_bytes_the_entries_encode_to(fx: Fixture) -> None:
    for i in range(3):
        fx.store.append(ap(ev(f"e{i}", {"i": [i, "é"]}, branch="b.x")), T0 + i)
    decoded = fx.store.since(SinceParams(from_seq=0, limit=10))
    encoded = fx.store.since(SinceParams(from_seq=0, limit=10), ReadShape.of(encoded=True))
    assert all(isinstance(e, msgspec.Raw) for e in encoded.entries)
    assert msgspec.json.encode(encoded) == msgspec.json.encode(decoded)
    assert (encoded.next_seq, encoded.caught_up) == (3, True)
    got = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s"), ReadShape.of(encoded=True)
    )
    assert msgspec.json.encode(got) == msgspec.json.encode(
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s"))
    )


def test_a_session_boot_or_lease_with_unrenderable_values_reads_with_nulls(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1")), T0)
    fx.store.create_session(
        SessionCreateParams(app="app", user="u", session="s2", state={"k": 1}), T0
    )
    fx.raw(
        "UPDATE sessions SET state = 'oops', created_at = ? WHERE session_id = 's2'",
        (YEAR_10000_US,),
    )
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session="s2"))
    assert (got.state, got.created_at, got.updated_at) == (None, None, from_us(T0))
    assert [s.state for s in fx.store.list_sessions("app", None)] == [{}, None]
    boot = fx.store.record_boot(T0, ["s"])
    fx.raw("UPDATE boots SET boot_at = ? WHERE id = ?", (YEAR_10000_US, boot))
    assert [(b.id, b.boot_at) for b in fx.store.recent_boots(0)] == [(boot, None)]
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000), "h", T0
    )
    fx.raw("UPDATE leases SET acquired_at = ?", (YEAR_10000_US,))
    (lease,) = fx.store.list_leases()
    assert (lease.acquired_at, lease.heartbeat_at) == (None, from_us(T0))


def test_operations_on_a_closed_store_are_closed_errors(fx: Fixture) -> None:
    fx.close()
    with pytest.raises(RpcError) as info:
        fx.store.latest_seq(None)
    assert info.value.code == CLOSED


def test_reopening_keeps_everything(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1")), T0)
    again = fx.reopen()
    assert [e.event.id for e in again.since(SinceParams(from_seq=0, limit=10)).entries] == ["e1"]
    assert again.append(ap(ev("e1")), T0).duplicate


# --- SQLite specifics -----------------------------------------------------------


def test_sqlite_setup_is_wal_full_fk_and_versioned(tmp_path: Path) -> None:
    store = SqliteStore.open(str(tmp_path / "x.db"))
    db = store.connection
    assert db.pragma("journal_mode") == "wal"
    assert db.pragma("synchronous") == 2  # FULL by default
    assert db.pragma("foreign_keys") == 1
    assert db.pragma("auto_vacuum") == 2  # INCREMENTAL: retention gives disk back
    assert db.pragma("user_version") == SCHEMA_VERSION
    assert db.transaction_mode == "IMMEDIATE"
    store.close()
    normal = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    assert normal.connection.pragma("synchronous") == 1
    normal.close()


def test_a_version_1_database_migrates_and_its_leases_keep_the_default_window(
    tmp_path: Path,
) -> None:
    from streamd.eventlog.sqlite.schema import MIGRATIONS

    path = str(tmp_path / "v1.db")
    db = apsw.Connection(path)
    with db:
        db.execute(MIGRATIONS[0])
        db.pragma("user_version", 1)
        db.execute(
            "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at,"
            " heartbeat_at) VALUES ('app', 'u', 's', 'old/1/aaaaaaaa', ?, ?)",
            (T0, T0),
        )
    db.close()
    store = SqliteStore.open(path)
    assert store.connection.pragma("user_version") == SCHEMA_VERSION == 6
    (info,) = store.list_leases()
    assert (info.holder, info.stale_after_ms) == ("old/1/aaaaaaaa", 30_000)
    with pytest.raises(RpcError) as raised:
        store.acquire_lease(
            LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=150),
            "new",
            T0 + 29 * SECOND,
        )
    assert is_session_locked(raised.value)
    store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=150),
        "new",
        T0 + 30 * SECOND,
    )
    store.close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_another_programs_database_is_refused_before_anything_in_it_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "theirs.db"
    db = apsw.Connection(str(path))
    db.execute(
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL);"
        " INSERT INTO invoices (total) VALUES (9.5);"
    )
    db.close()
    before = _sha256(path)
    for migrate in (True, False):  # the writer's open and a reader's
        with pytest.raises(RpcError) as info:
            SqliteStore.open(str(path), migrate=migrate)
        assert info.value.code == SOURCE_UNAVAILABLE
        assert info.value.message.startswith(f"{path} is not a streamd event log")
        assert "invoices" in info.value.message
        assert info.value.data == {"path": str(path)}
    assert _sha256(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["theirs.db"]  # no -wal, no -shm
    db = apsw.Connection(str(path))
    assert db.pragma("journal_mode") == "delete"
    assert db.pragma("user_version") == 0
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_schema")] == ["invoices"]
    db.close()


def test_a_tableless_database_with_someone_elses_user_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "theirs.db"
    db = apsw.Connection(str(path))
    db.pragma("user_version", 7)
    db.close()
    before = _sha256(path)
    with pytest.raises(RpcError) as info:
        SqliteStore.open(str(path))
    assert "application_id 0, user_version 7" in info.value.message
    assert _sha256(path) == before


def test_an_empty_file_becomes_ours_and_is_stamped_with_our_application_id(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new.db"
    path.touch()
    SqliteStore.open(str(path)).close()
    db = apsw.Connection(str(path))
    assert db.pragma("application_id") == 0x53544D44
    db.close()
    SqliteStore.open(str(path)).close()  # and is accepted again


def test_a_newer_schema_is_refused_not_downgraded(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    SqliteStore.open(path).close()
    db = apsw.Connection(path)
    db.pragma("user_version", SCHEMA_VERSION + 1)
    db.close()
    with pytest.raises(RpcError) as info:
        SqliteStore.open(path)
    assert info.value.code == SOURCE_UNAVAILABLE
    assert "newer" in info.value.message


def test_a_file_that_is_not_a_database_is_source_unavailable_not_a_driver_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"this is not a database file" * 200)
    with pytest.raises(RpcError) as info:
        SqliteStore.open(str(path))
    assert info.value.code == SOURCE_UNAVAILABLE
    assert isinstance(info.value.__cause__, apsw.Error)


def test_busy_database_is_source_unavailable(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    store = SqliteStore.open(path, SqliteOptions(busy_timeout_ms=50))
    other = apsw.Connection(path)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(RpcError) as info:
            store.append(ap(ev("e1")), T0)
        assert info.value.code == SOURCE_UNAVAILABLE
        assert info.value.data == {"sqlite_error": "BusyError"}
    finally:
        other.execute("ROLLBACK")
        other.close()
    # Nothing half-written, and the store still works.
    assert store.append(ap(ev("e1")), T0).seq == 1
    store.close()


def _many(store: SqliteStore, n: int) -> None:
    batch = [ap(ev(f"e{i}", branch=f"b{i % 50}.x"), session=f"s{i % 50}") for i in range(n)]
    store.append_batch(batch, T0)


@pytest.mark.parametrize(
    ("flt", "index"),
    [
        (Filter(app="app", user="u", session="s7"), "events_by_session"),
        (Filter(session_tree=SessionTree(app="app", user="u", parent="s7")), "events_by_session"),
        (Filter(branch_prefixes=["b7"]), "events_by_branch"),
    ],
)
def test_replaying_history_with_a_filter_is_an_index_range_scan(
    tmp_path: Path, flt: Filter, index: str
) -> None:
    store = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    _many(store, 5000)
    plan = store.explain_since(0, flt, 1000)
    assert any(f"USING INDEX {index}" in d or f"COVERING INDEX {index}" in d for d in plan), plan
    assert not any(d.startswith("SCAN events") for d in plan), plan
    # And the plan answers correctly.
    assert len(store.since(SinceParams(from_seq=0, filter=flt, limit=10_000)).entries) == 100
    store.close()


def test_a_caught_up_cursor_reads_only_rows_past_it_by_primary_key(tmp_path: Path) -> None:
    store = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    _many(store, 5000)
    tip = store.latest_seq(None)
    plan = store.explain_since(tip - 10, Filter(branch_prefixes=["b7"]), 1000)
    assert any("INTEGER PRIMARY KEY (rowid>?)" in d for d in plan), plan
    got = store.since(
        SinceParams(from_seq=tip - 60, filter=Filter(branch_prefixes=["b7"]), limit=1000)
    ).entries
    assert [e.event.branch for e in got] == ["b7.x"]
    store.close()


# --- what a commit added, for the watchers --------------------------------------


def test_append_commit_captures_each_new_event_as_since_encodes_it(fx: Fixture) -> None:

    fx.store.append(ap(ev("taken", 1)), T0)
    given = dt.datetime(2021, 6, 7, 8, 9, 10, 11, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    out = fx.store.append_commit(
        [
            ap(ev("a", {"k": ["é", 1.5]}, branch="root.x", timestamp=given), metadata={"m": "1"}),
            ap(ev("taken", 2)),  # a conflict: rolled back, never seen
            AppendGroup([ap(ev("g1", 1)), ap(ev("taken", 3))]),  # refused as a whole
            AppendGroup([ap(ev("g2", None, author="tool"), session="t")]),
            ap(ev("a", {"k": ["é", 1.5]}, branch="root.x", timestamp=given), metadata={"m": "1"}),
            AppendParams(
                app="app",
                user="u",
                session="s",
                event=ev("d"),
                state_delta=StateDelta(session={"x": 1}),
            ),
        ],
        T0 + 7,
        capture=True,
    )
    assert [type(r).__name__ for r in out.results] == [
        "AppendResult",
        "RpcError",
        "RpcError",
        "list",
        "AppendResult",
        "AppendResult",
    ]
    assert out.results[4] == AppendResult(seq=out.results[0].seq, duplicate=True)
    assert out.entries is not None
    stored = fx.store.since(
        SinceParams(from_seq=out.before_seq, limit=100), ReadShape.of(encoded=True)
    ).entries
    # Byte for byte what a reader gets, in seq order, and nothing rolled back.
    assert [c.wire for c in out.entries] == [bytes(e) for e in stored]
    assert [c.seq for c in out.entries] == seqs(fx.store, from_seq=out.before_seq)
    assert [(c.app, c.user, c.session, c.branch, c.author) for c in out.entries] == [
        ("app", "u", "s", "root.x", "agent"),
        ("app", "u", "t", "", "tool"),
        ("app", "u", "s", "", "agent"),
    ]
    assert out.before_seq == 1
    assert out.after_seq == out.entries[-1].seq == fx.store.newest_seq()


def test_append_commit_without_capture_still_reports_the_seqs(fx: Fixture) -> None:
    assert fx.store.newest_seq() == 0
    out = fx.store.append_commit([ap(ev("a")), ap(ev("b"))], T0, capture=False)
    assert out.entries is None
    assert (out.before_seq, out.after_seq) == (0, 2)
    dup = fx.store.append_commit([ap(ev("a"))], T0, capture=True)
    assert (dup.before_seq, dup.after_seq, dup.entries) == (2, 2, [])


def test_newest_seq_counts_deleted_events(fx: Fixture) -> None:
    fx.store.append(ap(ev("a")), T0)
    fx.store.append(ap(ev("b"), session="gone"), T0)
    fx.store.delete_session("app", "u", "gone")
    assert fx.store.newest_seq() == 2
    assert fx.store.latest_seq(None) == 1


def test_since_committed_is_since_encoded_with_the_fields_a_filter_reads(fx: Fixture) -> None:
    _populate(fx.store)
    flt = Filter(branch_prefixes=["bg"])
    page, last = fx.store.since_committed(0, flt, 2, 1 << 20)
    encoded = fx.store.since(
        SinceParams(from_seq=0, filter=flt, limit=2), ReadShape.of(encoded=True)
    )
    assert [c.wire for c in page] == [bytes(e) for e in encoded.entries]
    assert [(c.branch, c.author) for c in page] == [
        ("bg.cluster", "core/autonomous"),
        ("bg.cluster.child", "model"),
    ]
    assert not last and not encoded.caught_up
    rest, last = fx.store.since_committed(page[-1].seq, flt, 10, 1 << 20)
    assert [c.branch for c in rest] == ["bg"] and last
    # A byte budget cuts the page, but never below one entry.
    one, last = fx.store.since_committed(0, None, 10, 1)
    assert len(one) == 1 and not last
