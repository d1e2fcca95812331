"""Optimistic concurrency: ``append`` with ``expected_seq`` is refused with
``stale_session`` when the session moved on since the writer read it, so an append
computed on an outdated session is never merged.

Contract tests on every backend (``test_eventlog_store``'s ``fx``), then the
Trio API under contention and the wire.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from support.service import Daemonish, append
from support.store_contract import T0, Fixture, ap, ev

from streamd.errors import (
    STALE_SESSION,
    RpcError,
    is_session_not_found,
    is_stale_session,
)
from streamd.eventlog import EventLog
from streamd.eventlog.model import (
    AppendParams,
    AppendResult,
    SessionCreateParams,
    SessionGetParams,
    SinceParams,
    StateDelta,
)


def test_an_append_at_the_sessions_last_seq_is_written(fx: Fixture) -> None:
    fx.store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    first = fx.store.append(ap(ev("e1"), expected_seq=0), T0)
    second = fx.store.append(ap(ev("e2"), expected_seq=first.seq), T0)
    assert (
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s")).last_seq
        == second.seq
    )


def test_an_append_computed_before_the_session_moved_on_is_refused_and_writes_nothing(
    fx: Fixture,
) -> None:
    seen = fx.store.append(ap(ev("e1")), T0).seq
    moved = fx.store.append(ap(ev("e2", author="other writer")), T0).seq
    before = fx.store.since(SinceParams(from_seq=0, limit=100))
    with pytest.raises(RpcError) as info:
        fx.store.append(
            ap(ev("e3"), expected_seq=seen, state_delta=StateDelta(session={"lost": 1})), T0
        )
    assert info.value.code == STALE_SESSION and is_stale_session(info.value)
    assert info.value.data == {"expected_seq": seen, "last_seq": moved}
    assert "moved on" in info.value.message and "nothing was written" in info.value.message
    assert fx.store.since(SinceParams(from_seq=0, limit=100)) == before
    assert fx.store.get_state("app", "u", "s", None).session == {}


def test_expected_seq_says_the_session_exists(fx: Fixture) -> None:
    with pytest.raises(RpcError) as info:
        fx.store.append(ap(ev("e1"), expected_seq=0), T0)
    assert is_session_not_found(info.value)
    # Deleted under the writer: not found, and not silently created again.
    r = fx.store.append(ap(ev("e1")), T0)
    fx.store.delete_session("app", "u", "s")
    with pytest.raises(RpcError) as gone:
        fx.store.append(ap(ev("e2"), expected_seq=r.seq), T0)
    assert is_session_not_found(gone.value)
    with pytest.raises(RpcError):
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s"))


def test_a_retry_of_an_appended_event_is_a_duplicate_even_after_the_session_moved_on(
    fx: Fixture,
) -> None:
    first = fx.store.append(ap(ev("e1"), expected_seq=None), T0)
    fx.store.append(ap(ev("e2")), T0)
    again = fx.store.append(ap(ev("e1"), expected_seq=0), T0)
    assert again == AppendResult(seq=first.seq, duplicate=True)


def test_two_appends_from_the_same_view_in_one_batch_let_only_the_first_in(
    fx: Fixture,
) -> None:
    fx.store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    results = fx.store.append_batch([ap(ev("a"), expected_seq=0), ap(ev("b"), expected_seq=0)], T0)
    assert isinstance(results[0], AppendResult)
    assert isinstance(results[1], RpcError) and is_stale_session(results[1])
    assert results[1].data == {"expected_seq": 0, "last_seq": results[0].seq}


def test_another_sessions_appends_do_not_move_this_one(fx: Fixture) -> None:
    seen = fx.store.append(ap(ev("e1")), T0).seq
    fx.store.append(ap(ev("x1"), session="other"), T0)
    assert not fx.store.append(ap(ev("e2"), expected_seq=seen), T0).duplicate


async def test_of_writers_racing_from_one_view_exactly_one_wins(tmp_path: Path) -> None:
    """Ten writers read the session at the same seq and append at once (group
    commit puts them in one transaction): one is written, nine are refused."""
    with trio.fail_after(20):
        async with EventLog(tmp_path / "e.db", synchronous="NORMAL") as log:
            seen = (await log.append("app", "u", "s", ev("start"))).seq
            outcomes: list[AppendResult | RpcError] = []

            async def writer(i: int) -> None:
                try:
                    outcomes.append(
                        await log.append("app", "u", "s", ev(f"w{i}"), expected_seq=seen)
                    )
                except RpcError as exc:
                    outcomes.append(exc)

            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(writer, i)
            won = [o for o in outcomes if isinstance(o, AppendResult)]
            lost = [o for o in outcomes if isinstance(o, RpcError)]
            assert len(won) == 1 and len(lost) == 9
            assert all(is_stale_session(e) for e in lost)
            session = await log.get_session("app", "u", "s")
            assert [e.seq for e in session.events] == [seen, won[0].seq]
            assert session.last_seq == won[0].seq
            assert log.stats.largest_batch > 1  # they did race inside one transaction


async def test_stale_session_over_the_wire(daemon: Daemonish) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        first = await c.result("eventlog/append", append("e1"))
        await c.result("eventlog/append", append("e2"))
        err = await c.error("eventlog/append", {**append("e3"), "expected_seq": first["seq"]})
        assert err["code"] == -32014
        assert err["data"] == {"expected_seq": 1, "last_seq": 2}
        ok = await c.result("eventlog/append", {**append("e3"), "expected_seq": 2})
        assert ok == {"seq": 3, "duplicate": False}
        err = await c.error("eventlog/append", {**append("e4"), "expected_seq": -1})
        assert err["code"] == -32602


# --- ordered batches ---------------------------------------------------------------


def test_a_batch_commits_in_order_and_later_events_follow_the_first_expected_seq(
    fx: Fixture,
) -> None:
    from streamd.eventlog.store import AppendGroup

    fx.store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    group = AppendGroup([ap(ev("a"), expected_seq=0), ap(ev("b")), ap(ev("c"))])
    (results,) = fx.store.append_batch([group], T0)
    assert isinstance(results, list) and [r.seq for r in results] == [1, 2, 3]
    assert [e.event.id for e in fx.store.since(SinceParams(from_seq=0, limit=10)).entries] == [
        "a",
        "b",
        "c",
    ]


def test_a_batch_with_one_refused_append_writes_none_of_it_and_names_which(fx: Fixture) -> None:
    from streamd.eventlog.store import AppendGroup

    fx.store.append(ap(ev("taken", 1)), T0)
    (refused, single) = fx.store.append_batch(
        [
            AppendGroup(
                [
                    ap(ev("a"), state_delta=StateDelta(session={"a": 1})),
                    ap(ev("taken", 2)),
                    ap(ev("c")),
                ]
            ),
            ap(ev("alone")),
        ],
        T0,
    )
    assert isinstance(refused, RpcError) and refused.data["index"] == 1
    assert refused.code == -32010 and "nothing of the batch was written" in refused.message
    assert isinstance(single, AppendResult)  # other appends of the group commit are kept
    assert [e.event.id for e in fx.store.since(SinceParams(from_seq=0, limit=10)).entries] == [
        "taken",
        "alone",
    ]
    assert fx.store.get_state("app", "u", "s", None).session == {}
    (stale,) = fx.store.append_batch([AppendGroup([ap(ev("x"), expected_seq=1), ap(ev("y"))])], T0)
    assert isinstance(stale, RpcError) and is_stale_session(stale)
    assert stale.data == {"expected_seq": 1, "last_seq": 2, "index": 0}


def _batch(fx: Fixture, *items: AppendParams | list[AppendParams]) -> list[Any]:
    """``append_batch`` of the items, a list standing for one ordered group."""
    from streamd.eventlog.store import AppendGroup

    return fx.store.append_batch(
        [AppendGroup(i) if isinstance(i, list) else i for i in items], T0)


def _ids(fx: Fixture) -> list[str]:
    return [e.event.id for e in fx.store.since(SinceParams(from_seq=0, limit=100)).entries]


def test_a_batch_behind_a_duplicate_stored_elsewhere_is_refused_as_stale(fx: Fixture) -> None:
    # The writer read the session at "a" (seq 1); another wrote "x", then "e".
    fx.store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    _batch(fx, ap(ev("a"), expected_seq=0), ap(ev("x")), ap(ev("e")))
    # Its batch sends "e" again, then an event computed without "x".
    (refused,) = _batch(fx, [ap(ev("e"), expected_seq=1), ap(ev("y"))])
    assert isinstance(refused, RpcError) and is_stale_session(refused)
    assert refused.data == {"expected_seq": 1, "last_seq": 3, "index": 1}
    assert _ids(fx) == ["a", "x", "e"]


def test_a_batch_sent_again_after_its_answer_was_lost_is_stored_after_its_own_first(
    fx: Fixture,
) -> None:
    fx.store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    fx.store.append(ap(ev("a"), expected_seq=0), T0)
    fx.store.append(ap(ev("b"), expected_seq=1), T0)  # stored; its answer lost
    (results,) = _batch(fx, [ap(ev("b"), expected_seq=1), ap(ev("c")), ap(ev("d"))])
    assert [(r.seq, r.duplicate) for r in results] == [(2, True), (3, False), (4, False)]
    # An event the writer's view holds already leaves the view where it was.
    (results,) = _batch(fx, [ap(ev("a"), expected_seq=4), ap(ev("f"))])
    assert [(r.seq, r.duplicate) for r in results] == [(1, True), (5, False)]
    assert _ids(fx) == ["a", "b", "c", "d", "f"]


def test_a_duplicate_of_an_event_of_the_same_transaction_is_judged_where_that_went(
    fx: Fixture,
) -> None:
    # One call, one transaction: the earlier items are written (or, on a server
    # backend, planned) when the group reads where the session's next event is.
    fx.store.create_session(SessionCreateParams(app="app", user="u", session="s"), T0)
    fx.store.append(ap(ev("a"), expected_seq=0), T0)
    first, group = _batch(fx, ap(ev("b")), [ap(ev("b"), expected_seq=1), ap(ev("c"))])
    assert first.seq == 2 and [(r.seq, r.duplicate) for r in group] == [(2, True), (3, False)]
    *_, refused = _batch(fx, ap(ev("x")), ap(ev("e")),
                         [ap(ev("e"), expected_seq=3), ap(ev("y"))])
    assert isinstance(refused, RpcError) and is_stale_session(refused)
    assert refused.data == {"expected_seq": 3, "last_seq": 5, "index": 1}
    assert _ids(fx) == ["a", "b", "c", "x", "e"]


async def test_pipelined_batches_over_the_wire_keep_their_order(daemon: Daemonish) -> None:
    with trio.fail_after(20):
        c = await daemon.connect()
        ids, requests = [], []
        for b in range(20):  # pipelined: all sent before any answer is read
            batch = [append(f"b{b}-{i}") for i in range(5)]
            ids += [a["event"]["id"] for a in batch]
            requests.append(await c.start("eventlog/append_batch", {"appends": batch}))
        for request_id in requests:
            assert "result" in await c.response(request_id)
        got = await c.result("eventlog/sessions.get", {"app": "app", "user": "u", "session": "s"})
        stored = [e["event"]["id"] for e in got["events"]]
        # Each batch is contiguous and in its own order (batches may commit in
        # any order: they were separate requests).
        for b in range(20):
            at = stored.index(f"b{b}-0")
            assert stored[at : at + 5] == [f"b{b}-{i}" for i in range(5)]
        assert sorted(stored) == sorted(ids)
        err = await c.error("eventlog/append_batch", {"appends": []})
        assert err["code"] == -32602
