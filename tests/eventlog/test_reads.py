"""Bounded reads: a session's last N events, events after a seq or a time, paged
session lists, and many sessions' events in one call.

Contract tests run against every backend of ``test_eventlog_store`` (its
``fx`` fixture); the query-plan tests are SQLite's, and pin each bounded read
to the index that makes its cost follow what it returns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from support.service import HEAVY, Daemonish, append
from support.store_contract import SECOND, T0, Fixture, ap, ev

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.model import (
    SessionCreateParams,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionsGetParams,
    StateDelta,
    from_us,
)
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.store import ReadShape


def at(seconds: int) -> dt.datetime:
    return from_us(T0 + seconds * SECOND)


def timed(fx: Fixture, times: list[int], session: str = "s") -> list[int]:
    """Append one event per time (seconds after T0), in this order."""
    return [
        fx.store.append(ap(ev(f"{session}-{i}", timestamp=at(t)), session=session), T0).seq
        for i, t in enumerate(times)
    ]


def event_ids(got: Any) -> list[str]:
    return [e.event.id for e in got.events]


def get(fx: Fixture, after_seq: int = 0, recent: int | None = None, after: int | None = None):
    after_time = None if after is None else from_us(T0 + after * SECOND)
    return fx.store.get_session(
        SessionGetParams(
            app="app",
            user="u",
            session="s",
            after_seq=after_seq,
            recent=recent,
            after_time=after_time,
        )
    )


# --- one session, bounded ---------------------------------------------------


def test_recent_zero_is_the_session_without_its_events(fx: Fixture) -> None:
    timed(fx, [0, 1, 2])
    got = get(fx, recent=0)
    assert got.events == [] and not got.truncated and got.next_seq is None
    assert got.last_seq == 3


def test_after_time_is_at_or_after_the_time_and_kept_in_seq_order(fx: Fixture) -> None:
    # Times go backwards at seq 3: order stays seq order, the bound is the time.
    seqs = timed(fx, [10, 20, 5, 30, 20])
    assert event_ids(get(fx, after=20)) == ["s-1", "s-3", "s-4"]
    assert event_ids(get(fx, after=31)) == []
    assert event_ids(get(fx, after=0)) == [f"s-{i}" for i in range(5)]
    # All bounds AND together: after a seq, at or after a time, the newest N.
    assert event_ids(get(fx, after=20, recent=2)) == ["s-3", "s-4"]
    assert event_ids(get(fx, after=10, after_seq=seqs[1])) == ["s-3", "s-4"]
    assert event_ids(get(fx, after=10, after_seq=seqs[0], recent=1)) == ["s-4"]


def test_recent_is_the_newest_events_of_this_session_whatever_its_siblings_write(
    fx: Fixture,
) -> None:
    timed(fx, list(range(30)))
    timed(fx, list(range(50)), session="busy")
    assert event_ids(get(fx, recent=3)) == ["s-27", "s-28", "s-29"]
    assert event_ids(get(fx, recent=100)) == [f"s-{i}" for i in range(30)]


def test_a_negative_recent_is_invalid_params(fx: Fixture) -> None:
    timed(fx, [0])
    with pytest.raises(RpcError) as info:
        get(fx, recent=-1)
    assert info.value.code == INVALID_PARAMS


def test_events_without_content_are_the_same_entries_with_content_null(fx: Fixture) -> None:
    timed(fx, [0, 1, 2])
    fx.store.append(ap(ev("big", {"x": "y" * 10_000}, timestamp=at(3))), T0)
    full = fx.store.get_session(SessionGetParams(app="app", user="u", session="s"))
    bare = fx.store.get_session(SessionGetParams(app="app", user="u", session="s", content=False))
    assert [e.seq for e in bare.events] == [e.seq for e in full.events]
    assert all(e.event.content is None and e.damaged is None for e in bare.events)
    for b, f in zip(bare.events, full.events, strict=True):
        f.event.content = None
        assert b == f
    budget = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s", content=False),
        ReadShape.of(max_bytes=2000),
    )
    assert len(budget.events) == 4 and not budget.truncated  # the content is not counted


# --- paged lists -------------------------------------------------------------


def _sessions(fx: Fixture) -> list[tuple[str, str]]:
    keys = [(u, f"s{i}") for u in ("ann", "bob", "cy") for i in range(4)]
    for u, s in reversed(keys):
        fx.store.create_session(
            SessionCreateParams(app="app", user=u, session=s, state={"n": s}), T0
        )
    fx.store.create_session(SessionCreateParams(app="other", user="ann", session="x"), T0)
    return keys


def test_pages_cover_every_session_once_in_key_order(fx: Fixture) -> None:
    keys = _sessions(fx)
    seen: list[tuple[str, str]] = []
    after = None
    pages = 0
    while True:
        page = fx.store.list_sessions_page(SessionListParams(app="app", limit=5, after=after))
        pages += 1
        seen += [(s.user, s.session) for s in page.sessions]
        if page.next is None:
            break
        assert page.next == SessionKey(user=seen[-1][0], session=seen[-1][1])
        after = page.next
    assert seen == keys and pages == 3
    # Exactly a page's worth left is the last page: no empty page follows.
    assert fx.store.list_sessions_page(SessionListParams(app="app", limit=12)).next is None


def test_a_users_pages_stay_within_that_user(fx: Fixture) -> None:
    _sessions(fx)
    first = fx.store.list_sessions_page(SessionListParams(app="app", user="bob", limit=3))
    assert [s.session for s in first.sessions] == ["s0", "s1", "s2"]
    rest = fx.store.list_sessions_page(
        SessionListParams(app="app", user="bob", limit=3, after=first.next)
    )
    assert [s.session for s in rest.sessions] == ["s3"] and rest.next is None
    # A cursor of another user: before bob's sessions, all of them; after, none.
    early = fx.store.list_sessions_page(
        SessionListParams(
            app="app", user="bob", limit=10, after=SessionKey(user="ann", session="s9")
        )
    )
    assert len(early.sessions) == 4
    late = fx.store.list_sessions_page(
        SessionListParams(
            app="app", user="bob", limit=10, after=SessionKey(user="cy", session="s0")
        )
    )
    assert late.sessions == [] and late.next is None


def test_a_page_with_scoped_state_has_the_app_and_each_of_its_users_state(
    fx: Fixture,
) -> None:
    _sessions(fx)
    fx.store.append(
        ap(
            ev("e1"),
            user="ann",
            session="s0",
            state_delta=StateDelta(app={"a": 1}, user={"who": "ann"}),
        ),
        T0,
    )
    page = fx.store.list_sessions_page(SessionListParams(app="app", limit=5, scoped_state=True))
    assert page.app_state == {"a": 1}
    assert page.user_states == {"ann": {"who": "ann"}, "bob": {}}
    assert fx.store.list_sessions_page(SessionListParams(app="app", limit=5)).user_states is None


# --- many sessions at once ----------------------------------------------------


def test_a_bulk_read_answers_in_the_order_asked_and_names_the_missing(fx: Fixture) -> None:
    for session in ("a", "b", "c"):
        timed(fx, [0, 1, 2, 3], session=session)
    got = fx.store.get_sessions(
        SessionsGetParams(
            app="app",
            sessions=[
                SessionKey(user="u", session="c"),
                SessionKey(user="u", session="ghost"),
                SessionKey(user="u", session="a", after_seq=2),
            ],
        )
    )
    assert [s.session for s in got.sessions] == ["c", "a"]
    assert event_ids(got.sessions[0]) == ["c-0", "c-1", "c-2", "c-3"]
    assert event_ids(got.sessions[1]) == ["a-2", "a-3"]
    assert got.missing == [SessionKey(user="u", session="ghost")]
    recent = fx.store.get_sessions(
        SessionsGetParams(
            app="app",
            sessions=[SessionKey(user="u", session=s) for s in "abc"],
            recent=1,
            after_time=from_us(T0 + 3 * SECOND),
        )
    )
    assert [event_ids(s) for s in recent.sessions] == [["a-3"], ["b-3"], ["c-3"]]


def test_a_bulk_read_shares_one_byte_budget_and_continues_exactly(fx: Fixture) -> None:
    for session in ("a", "b", "c"):
        for i in range(3):
            fx.store.append(ap(ev(f"{session}{i}", "x" * 1000), session=session), T0)
    keys = [SessionKey(user="u", session=s) for s in "abc"]
    collected: dict[str, list[str]] = {s: [] for s in "abc"}
    rounds = 0
    while keys:
        rounds += 1
        got = fx.store.get_sessions(
            SessionsGetParams(app="app", sessions=keys),
            ReadShape.of(raw_content=True, max_bytes=4000),
        )
        assert got.missing == []
        keys = []
        for s in got.sessions:
            collected[s.session] += event_ids(s)
            if s.truncated:
                assert s.next_seq is not None
                keys.append(SessionKey(user="u", session=s.session, after_seq=s.next_seq))
            else:
                assert s.next_seq is None
    assert collected == {s: [f"{s}{i}" for i in range(3)] for s in "abc"}
    assert rounds >= 3  # 9 KB of content through a 4 KB budget


def test_a_spent_budget_still_names_every_session_with_where_to_continue(fx: Fixture) -> None:
    for session in ("a", "b"):
        fx.store.append(ap(ev(f"{session}0", "x" * 5000), session=session), T0)
    got = fx.store.get_sessions(
        SessionsGetParams(app="app", sessions=[SessionKey(user="u", session=s) for s in "ab"]),
        ReadShape.of(max_bytes=1000),
    )
    a, b = got.sessions
    # The first entry of the answer always comes back, so a reader makes progress.
    assert event_ids(a) == ["a0"] and not a.truncated
    assert b.events == [] and b.truncated and b.next_seq == 0


# --- access paths (SQLite) ---------------------------------------------------


@pytest.fixture
def big(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    batch = [
        ap(ev(f"e{i}", timestamp=at(i)), session=f"s{i % 20}", user=f"u{i % 3}")
        for i in range(4000)
    ]
    store.append_batch(batch, T0)
    for i in range(200):
        store.create_session(
            SessionCreateParams(app="app", user=f"u{i % 3}", session=f"extra{i}"), T0
        )
    yield store
    store.close()


def _uses(plan: list[str], index: str) -> bool:
    return any(f"USING INDEX {index}" in d or f"USING COVERING INDEX {index}" in d for d in plan)


@pytest.mark.parametrize(
    ("recent", "after_time", "index"),
    [
        (None, None, "events_by_session"),
        (20, None, "events_by_session"),
        (None, 3000, "events_by_session_time"),
        (20, 3000, "events_by_session_time"),
    ],
)
def test_every_bounded_session_read_is_an_index_search_never_a_scan(
    big: SqliteStore, recent: int | None, after_time: int | None, index: str
) -> None:
    after_us = None if after_time is None else T0 + after_time * SECOND
    plan = big.explain_session_events("app", "u1", "s1", 0, recent, after_us)
    assert _uses(plan, index), plan
    assert not any(d.startswith("SCAN") for d in plan), plan
    got = big.get_session(
        SessionGetParams(
            app="app",
            user="u1",
            session="s1",
            recent=recent,
            after_time=None if after_us is None else from_us(after_us),
        )
    )
    expected = [
        i
        for i in range(4000)
        if (i % 20, i % 3) == (1, 1) and (after_time is None or i >= after_time)
    ]
    if recent is not None:
        expected = expected[-recent:]
    assert [e.event.id for e in got.events] == [f"e{i}" for i in expected]


@pytest.mark.parametrize("user", [None, "u1"])
def test_a_page_of_sessions_is_a_range_of_the_primary_key(
    big: SqliteStore, user: str | None
) -> None:
    cursor = SessionKey(user="u1", session="extra50")
    plan = big.explain_list_sessions("app", user, 50, cursor)
    # The cursor is part of the index search, not a filter over what precedes it.
    bound = "session_id>?" if user else "(user_id,session_id)>(?,?)"
    assert any("USING PRIMARY KEY" in d and bound in d for d in plan), plan
    assert not any(d.startswith("SCAN") for d in plan), plan
    assert not any("TEMP B-TREE" in d for d in plan), plan


# --- the wire -------------------------------------------------------------------


async def test_sessions_get_after_time_and_recent_zero_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        for i in range(3):
            await c.result("eventlog/append", append(f"e{i}", timestamp=f"2025-01-01T00:00:0{i}Z"))
        key = {"app": "app", "user": "u", "session": "s"}
        got = await c.result("eventlog/sessions.get", {**key, "after_time": "2025-01-01T00:00:01Z"})
        assert [e["event"]["id"] for e in got["events"]] == ["e1", "e2"]
        got = await c.result("eventlog/sessions.get", {**key, "recent": 0})
        assert got["events"] == [] and got["last_seq"] == 3
        err = await c.error("eventlog/sessions.get", {**key, "after_time": "2025-01-01T00:00:01"})
        assert err["code"] == -32602


async def test_sessions_list_pages_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        for s in ("s1", "s2", "s3"):
            await c.result("eventlog/sessions.create", {"app": "app", "user": "u", "session": s})
        first = await c.result("eventlog/sessions.list", {"app": "app", "limit": 2})
        assert [s["session"] for s in first["sessions"]] == ["s1", "s2"]
        assert first["next"] == {"user": "u", "session": "s2"}
        rest = await c.result(
            "eventlog/sessions.list", {"app": "app", "limit": 2, "after": first["next"]}
        )
        assert [s["session"] for s in rest["sessions"]] == ["s3"] and rest["next"] is None
        assert "app_state" not in rest
        err = await c.error("eventlog/sessions.list", {"app": "app", "limit": 0})
        assert err["code"] == -32602


async def test_a_bulk_read_over_the_wire_stops_before_4_mib_and_continues(
    daemon: Daemonish,
) -> None:
    with trio.fail_after(60):
        c = await daemon.connect()
        for s in ("a", "b"):
            for i in range(3):
                await c.result("eventlog/append", append(f"{s}{i}", session=s, content=HEAVY))
        keys: list[dict[str, Any]] = [{"user": "u", "session": s} for s in ("a", "b", "nope")]
        got_ids: list[str] = []
        frames = 0
        while keys:
            reply = await c.call("eventlog/sessions.get_many", {"app": "app", "sessions": keys})
            frames += 1
            result = reply["result"]
            keys = []
            for s in result["sessions"]:
                got_ids += [e["event"]["id"] for e in s["events"]]
                if s.get("truncated"):
                    keys.append({"user": "u", "session": s["session"], "after_seq": s["next_seq"]})
            if frames == 1:
                assert result["missing"] == [{"user": "u", "session": "nope"}]
        assert sorted(got_ids) == ["a0", "a1", "a2", "b0", "b1", "b2"]
        assert frames == 3  # two 1.4 MB events fit under 4 MiB, a third does not
        err = await c.error("eventlog/sessions.get_many", {"app": "app", "sessions": []})
        assert err["code"] == -32602
