"""How a batch's later appends of a session are judged (wire.md, append_batch:
"each later append of that session sent without one of its own expects the
session where the batch's earlier appends left it"), on every backend:
sessions interleaved in one group, and an ``expected_seq`` of a later
append's own, a refused append beside the group, and a server backend's
one-by-one rewrite of a batch."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import store_contract as contract
from support.store_contract import T0, Fixture, ap, ev, ids

from streamd.errors import EVENT_CONFLICT, RpcError, is_stale_session
from streamd.eventlog.model import AppendParams, SessionCreateParams
from streamd.eventlog.store import AppendGroup


def group(fx: Fixture, *appends: AppendParams) -> Any:
    (got,) = fx.store.append_batch([AppendGroup(list(appends))], T0)
    return got


def in_(session: str, event_id: str, **kw: Any) -> AppendParams:
    return ap(ev(event_id), session=session, **kw)


def made(fx: Fixture, *sessions: str) -> None:
    for s in sessions:
        fx.store.create_session(SessionCreateParams(app="app", user="u", session=s), T0)


def test_interleaved_sessions_of_a_group_each_follow_their_own_appends(fx: Fixture) -> None:
    made(fx, "s", "t")
    a = fx.store.append(in_("s", "a", expected_seq=0), T0).seq
    b = fx.store.append(in_("t", "b", expected_seq=0), T0).seq
    got = group(fx, in_("s", "c", expected_seq=a), in_("t", "d", expected_seq=b),
                in_("s", "e"), in_("t", "f"), in_("s", "g"))
    assert [r.seq for r in got] == [b + 1, b + 2, b + 3, b + 4, b + 5]
    assert ids(fx.store) == ["a", "b", "c", "d", "e", "f", "g"]


def test_a_duplicate_stored_elsewhere_in_one_session_refuses_that_sessions_next_append_only(
    fx: Fixture,
) -> None:
    made(fx, "s", "t")
    a = fx.store.append(in_("s", "a", expected_seq=0), T0).seq
    b = fx.store.append(in_("t", "b", expected_seq=0), T0).seq
    fx.store.append(in_("t", "x"), T0)  # another writer, unseen by this one
    e = fx.store.append(in_("t", "e"), T0).seq
    # The copy's view of "t" is at "b": "e" went in elsewhere, so its next
    # append of "t" is refused; its appends of "s" are judged on their own.
    refused = group(fx, in_("s", "c", expected_seq=a), in_("t", "e", expected_seq=b),
                    in_("s", "d"), in_("t", "y"))
    assert isinstance(refused, RpcError) and is_stale_session(refused)
    assert refused.data == {"expected_seq": b, "last_seq": e, "index": 3}
    assert ids(fx.store) == ["a", "b", "x", "e"]
    got = group(fx, in_("s", "c", expected_seq=a), in_("t", "e", expected_seq=b), in_("s", "d"))
    assert [r.duplicate for r in got] == [False, True, False]


def test_an_expected_seq_of_a_later_appends_own_is_the_one_it_is_judged_by(fx: Fixture) -> None:
    made(fx, "s")
    a = fx.store.append(in_("s", "a", expected_seq=0), T0).seq
    # Its own, behind the group's earlier append: refused, as it says.
    refused = group(fx, in_("s", "b", expected_seq=a), in_("s", "c", expected_seq=a))
    assert isinstance(refused, RpcError) and is_stale_session(refused)
    assert refused.data == {"expected_seq": a, "last_seq": a + 1, "index": 1}
    x = fx.store.append(in_("s", "x"), T0).seq
    e = fx.store.append(in_("s", "e"), T0).seq
    # A writer that learnt of "x" and "e" after sending "e" again says so:
    # its next append goes in, and the one after follows it.
    got = group(fx, in_("s", "e", expected_seq=a), in_("s", "y", expected_seq=e), in_("s", "z"))
    assert [(r.seq, r.duplicate) for r in got] == [(e, True), (e + 1, False), (e + 2, False)]
    # And one that says the group's own new append is where the session is.
    got = group(fx, in_("s", "f", expected_seq=e + 2), in_("s", "g", expected_seq=e + 3),
                in_("s", "h"))
    assert [r.seq for r in got] == [e + 3, e + 4, e + 5]
    assert ids(fx.store) == ["a", "x", "e", "y", "z", "f", "g", "h"]
    assert x == a + 1


def test_a_group_beside_a_refused_append_is_judged_as_alone(fx: Fixture) -> None:
    # A refused append in the same call sends SQLite's batch down its careful
    # path (a savepoint per item); a server backend rolls it out of the plan.
    made(fx, "s")
    a = fx.store.append(in_("s", "a", expected_seq=0), T0).seq
    fx.store.append(in_("t", "taken"), T0)
    clash = ap(ev("taken", content="other"), session="t")
    b = fx.store.append(in_("s", "b", expected_seq=a), T0).seq  # its answer lost
    retried = fx.store.append_batch(
        [clash, AppendGroup([in_("s", "b", expected_seq=a), in_("s", "c")])], T0)
    assert isinstance(retried[0], RpcError)
    assert [(r.seq, r.duplicate) for r in retried[1]] == [(b, True), (b + 1, False)]
    fx.store.append(in_("s", "x"), T0)
    e = fx.store.append(in_("s", "e"), T0).seq
    stale = fx.store.append_batch(
        [clash, AppendGroup([in_("s", "e", expected_seq=b + 1), in_("s", "y")])], T0)
    assert isinstance(stale[1], RpcError) and is_stale_session(stale[1])
    assert stale[1].data == {"expected_seq": b + 1, "last_seq": e, "index": 1}
    assert ids(fx.store) == ["a", "taken", "b", "c", "x", "e"]


@pytest.fixture(params=["postgres", "mysql"])
def server_fx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fixture]:
    yield from contract.BACKENDS[request.param](request, tmp_path)


class _BulkRefused(Exception):
    """What the database says of a value it cannot store, met by the bulk write."""


def written_one_by_one(fx: Fixture, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every bulk write of ``fx``'s server backend refused, so its group
    commits take the one-by-one path (each event in a savepoint of its own,
    each item's events written before the next item is planned); the sizes
    of the bulk writes refused."""
    module = sys.modules[type(fx.store).__module__]
    real = module.commit_planned
    refused: list[int] = []

    class RefusingBulk:
        def __init__(self, db: Any) -> None:
            self.db = db

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

        def write(self, events: list[Any], now_us: int) -> None:
            if len(events) > 1:
                refused.append(len(events))
                raise _BulkRefused
            self.db.write(events, now_us)

        def refusal(self, exc: BaseException) -> bool:
            return isinstance(exc, _BulkRefused) or bool(self.db.refusal(exc))

    monkeypatch.setattr(module, "commit_planned",
                        lambda db, *a, **kw: real(RefusingBulk(db), *a, **kw))
    return refused


def test_a_group_written_one_by_one_is_judged_as_one_written_in_bulk(
    server_fx: Fixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fx = server_fx
    made(fx, "s")
    a = fx.store.append(in_("s", "a", expected_seq=0), T0).seq
    bulk = written_one_by_one(fx, monkeypatch)
    # "b" stored by the call's first item, written before the group is planned.
    b, retried = fx.store.append_batch(
        [in_("s", "b"), AppendGroup([in_("s", "b", expected_seq=a), in_("s", "c"),
                                     in_("s", "d")])], T0)
    assert [(r.seq, r.duplicate) for r in retried] == [
        (b.seq, True), (b.seq + 1, False), (b.seq + 2, False)]
    assert bulk == [3]  # "b", "c" and "d", written again one by one
    fx.store.append(in_("s", "x"), T0)
    e = fx.store.append(in_("s", "e"), T0).seq
    (stale,) = fx.store.append_batch(
        [AppendGroup([in_("s", "e", expected_seq=b.seq + 2), in_("s", "y")])], T0)
    assert isinstance(stale, RpcError) and is_stale_session(stale)
    assert stale.data == {"expected_seq": b.seq + 2, "last_seq": e, "index": 1}
    assert ids(fx.store) == ["a", "b", "c", "d", "x", "e"]


def test_a_duplicate_is_not_taken_as_next_once_retention_removed_the_event_it_follows(
    fx: Fixture,
) -> None:
    from streamd.eventlog.retention import DEFAULT_BOUNDS

    made(fx, "s")
    a = fx.store.append(in_("s", "a", expected_seq=0), T0).seq
    fx.store.append(in_("s", "x"), T0)  # another writer, unseen by this one
    e = fx.store.append(in_("s", "e"), T0).seq
    copy = [in_("s", "e", expected_seq=a), in_("s", "y")]
    assert is_stale_session(group(fx, *copy))
    # Retention keeps the newest event, "e": "a" and "x" are gone, and "e"
    # is the session's first event after seq "a" had. Before, the copy's
    # batch then went in, "y" behind "x", which it never saw.
    assert fx.store.trim_sessions("app", 1, None, T0, None, DEFAULT_BOUNDS).events == 2
    refused = group(fx, *copy)
    assert isinstance(refused, RpcError) and is_stale_session(refused)
    assert refused.data == {"expected_seq": a, "last_seq": e, "index": 1}
    assert ids(fx.store) == ["e"]


def test_a_batch_sent_again_after_retention_removed_events_before_its_view_goes_through(
    fx: Fixture,
) -> None:
    from streamd.eventlog.retention import DEFAULT_BOUNDS

    made(fx, "s")
    for i in range(3):
        fx.store.append(in_("s", f"old{i}"), T0)
    view = fx.store.append(in_("s", "a"), T0).seq
    sent = [in_("s", "b", expected_seq=view), in_("s", "c")]
    first = group(fx, *sent)  # stored; its answer lost
    assert fx.store.trim_sessions("app", 3, None, T0, None, DEFAULT_BOUNDS).events == 3
    again = group(fx, *sent, in_("s", "d"))
    assert [(r.seq, r.duplicate) for r in again] == [
        (first[0].seq, True), (first[1].seq, True), (first[1].seq + 1, False)]
    assert ids(fx.store) == ["a", "b", "c", "d"]


def test_an_event_id_stored_in_another_session_refuses_the_group_as_a_conflict(
    fx: Fixture,
) -> None:
    # Event ids are the log's, not a session's: the same id and content sent
    # to another session is other content, never a duplicate to judge.
    made(fx, "s", "t")
    fx.store.append(in_("s", "e"), T0)
    refused = group(fx, in_("t", "e", expected_seq=0), in_("t", "y"))
    assert isinstance(refused, RpcError) and refused.code == EVENT_CONFLICT
    assert refused.data["index"] == 0
    assert ids(fx.store) == ["e"]
