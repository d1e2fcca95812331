"""Contract tests for the storage backends of the event log: appends, reads
by seq, and what a commit reports to the watchers.

Every test here runs against each backend in ``BACKENDS``
(``support.store_contract``) through the :class:`~streamd.eventlog.store.Backend`
protocol; a new backend joins by adding a factory. Only the ``raw`` hook, used
to damage rows on purpose, is backend-specific. Times are passed in
explicitly, so nothing here sleeps. Sessions, leases and boots are in
``test_store_sessions.py``; health and damaged rows in ``test_store_health.py``;
what only a SQLite file has in ``test_store_sqlite.py``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pytest
from support.store_contract import SECOND, T0, Fixture, ap, ev, ids, seqs

from streamd.errors import (
    EVENT_CONFLICT,
    INVALID_PARAMS,
    RpcError,
    is_event_conflict,
    is_session_not_found,
)
from streamd.eventlog.model import (
    AppendParams,
    AppendResult,
    Filter,
    SessionGetParams,
    SessionTree,
    SinceParams,
    StateDelta,
)
from streamd.eventlog.store import AppendGroup, Backend, ReadShape

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
