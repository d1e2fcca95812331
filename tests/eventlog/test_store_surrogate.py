"""Contract tests for the storage backends: text holding a surrogate code
point, on each backend in ``BACKENDS`` (see ``test_store.py``).

No UTF-8 encoder takes a lone surrogate (``"\\ud800"``), so no database can
store one or be sent one. The wire's decoder refuses such an escape in any
request's params; an in-process caller reaching the store with one gets the
same answer from it: -32602 naming the field, on every backend, for reads as
for writes (see :mod:`streamd.eventlog.store.storable` for why a lookup is
refused rather than answered as absent), and never the driver's
``UnicodeEncodeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.store_contract import T0, Fixture, ap, ev

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.model import (
    Filter,
    LeaseAcquireParams,
    RetentionPolicy,
    SessionCreateParams,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionsGetParams,
    SessionTree,
    SinceParams,
)
from streamd.eventlog.store import Backend, LeaseKey

LONE = "s\ud800"
"""A session id whose part before the surrogate ("s") is a stored name."""
SPLIT_PAIR = "\ud83d\ude00"
"""A pair's two halves as two code points (not U+1F600): no more text than one."""

Call = Callable[[Backend, str], Any]

_CALLS: dict[str, tuple[Call, str]] = {
    # name: (the call with the text in one field, the field the answer names)
    "sessions.get": (
        lambda s, v: s.get_session(SessionGetParams(app="app", user="u", session=v)), "session"),
    "sessions.get app": (
        lambda s, v: s.get_session(SessionGetParams(app=v, user="u", session="s")), "app"),
    "sessions.get_many": (
        lambda s, v: s.get_sessions(
            SessionsGetParams(app="app", sessions=[SessionKey(user="u", session="s"),
                                                   SessionKey(user=v, session="s")])),
        "sessions[1].user"),
    "sessions.list": (lambda s, v: s.list_sessions("app", v), "user"),
    "sessions.list page": (
        lambda s, v: s.list_sessions_page(SessionListParams(app=v)), "app"),
    "sessions.list cursor": (
        lambda s, v: s.list_sessions_page(
            SessionListParams(app="app", after=SessionKey(user="u", session=v))),
        "after.session"),
    "sessions.create": (
        lambda s, v: s.create_session(SessionCreateParams(app="app", user="u", session=v), T0),
        "session"),
    "sessions.create state key": (
        lambda s, v: s.create_session(
            SessionCreateParams(app="app", user="u", session="new", state={"k": [v]}), T0),
        "state.k[0]"),
    "sessions.delete": (lambda s, v: s.delete_session("app", "u", v), "session"),
    "state.get": (lambda s, v: s.get_state("app", "u", v, None), "session"),
    "state.get as of": (lambda s, v: s.get_state("app", v, None, 1), "user"),
    "lease.acquire": (
        lambda s, v: s.acquire_lease(LeaseAcquireParams(app="app", user="u", session=v), "h", T0),
        "session"),
    "lease.acquire holder": (
        lambda s, v: s.acquire_lease(
            LeaseAcquireParams(app="app", user="u", session="s"), v, T0), "holder"),
    "lease.heartbeat": (lambda s, v: s.heartbeat_lease("app", "u", v, "h", T0), "session"),
    "lease.heartbeats": (
        lambda s, v: s.heartbeat_leases(
            [LeaseKey("app", "u", "s", "h"), LeaseKey("app", v, "s", "h")], T0),
        "beats[1].user"),
    "lease.release": (lambda s, v: s.release_lease("app", "u", v, "h"), "session"),
    "lease.list": (lambda s, v: s.list_leases("app", v), "user"),
    "lease.count": (lambda s, v: s.leased_sessions(v, T0), "app"),
    "retention.set": (lambda s, v: s.set_retention(RetentionPolicy(app=v, max_events=1), T0),
                      "app"),
    "retention.get": (lambda s, v: s.retention_policies(v), "app"),
    "boot.record": (lambda s, v: s.record_boot(T0, ["ok", v]), "attempted[1]"),
    "boot.update": (lambda s, v: s.update_boot(1, [v]), "attempted[0]"),
    "since": (lambda s, v: s.since(SinceParams(from_seq=0, filter=Filter(session=v))),
              "filter.session"),
    "since tree": (
        lambda s, v: s.since(SinceParams(
            from_seq=0, filter=Filter(session_tree=SessionTree(app="app", user="u", parent=v)))),
        "filter.session_tree.parent"),
    "since branch prefix": (
        lambda s, v: s.since(SinceParams(from_seq=0, filter=Filter(branch_prefixes=["main", v]))),
        "filter.branch_prefixes[1]"),
    "watch read": (lambda s, v: s.since_committed(0, Filter(author_suffix=v), 10, 1 << 20),
                   "filter.author_suffix"),
    "latest_seq": (lambda s, v: s.latest_seq(Filter(app=v)), "filter.app"),
    "nth_newest_seq": (lambda s, v: s.nth_newest_seq(Filter(author=v), 0), "filter.author"),
    "branches": (lambda s, v: s.branches(Filter(user=v), None), "filter.user"),
    "append": (lambda s, v: s.append(ap(ev("e9"), session=v), T0), "session"),
    "append branch": (lambda s, v: s.append(ap(ev("e9", branch=v)), T0), "event.branch"),
    "append content": (lambda s, v: s.append(ap(ev("e9", content={"t": ["x", v]})), T0),
                       "event.content.t[1]"),
}


def _world(store: Backend) -> tuple[Any, ...]:
    """Everything a refused call could have written."""
    return (
        store.since(SinceParams(from_seq=0, limit=100)),
        store.list_sessions("app", None),
        store.list_leases(),
        store.retention_policies(),
        store.recent_boots(0),
        store.newest_seq(),
    )


@pytest.mark.parametrize("name", sorted(_CALLS))
@pytest.mark.parametrize("text", [LONE, SPLIT_PAIR], ids=["lone", "split_pair"])
def test_a_text_holding_a_surrogate_is_refused_naming_its_field_and_nothing_is_written(
    fx: Fixture, name: str, text: str
) -> None:
    call, field = _CALLS[name]
    fx.store.append(ap(ev("e1", branch="main")), T0)
    fx.store.record_boot(T0, ["ok"])
    before = _world(fx.store)
    with pytest.raises(RpcError) as info:
        call(fx.store, text)
    assert info.value.code == INVALID_PARAMS
    assert info.value.message.startswith(f"{field} is not text any database can store")
    assert _world(fx.store) == before


def test_a_refused_append_in_a_batch_names_its_place_and_the_others_commit(fx: Fixture) -> None:
    got = fx.store.append_batch([ap(ev("e1")), ap(ev(LONE)), ap(ev("e3"))], T0)
    assert isinstance(got[1], RpcError) and got[1].code == INVALID_PARAMS
    assert got[1].message.startswith("event.id is not text any database can store")
    assert [e.event.id for e in fx.store.since(SinceParams(from_seq=0)).entries] == ["e1", "e3"]


def test_the_store_still_answers_after_a_refusal(fx: Fixture) -> None:
    # Refused before the driver met it: the connection is not left mid-statement.
    with pytest.raises(RpcError):
        fx.store.heartbeat_lease("app", "u", LONE, "h", T0)
    fx.store.append(ap(ev("e1")), T0)
    assert fx.store.get_session(SessionGetParams(app="app", user="u", session="s")).events
