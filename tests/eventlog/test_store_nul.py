"""Contract tests for the storage backends: reads naming U+0000, on each
backend in ``BACKENDS`` (see ``test_store.py``).

PostgreSQL text cannot hold U+0000 and its server refuses a parameter that
does; SQLite and MySQL hold it. A read naming one (a session, a filter's app,
a cursor) must answer on every backend as a read naming a value no row has:
``session_not_found``, an empty page, ``{}``; never ``source_unavailable``,
which says the database is down. None of these tests stores such a text, so
on every backend the right answer is the answer for an absent value.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.store_contract import T0, Fixture, ap, ev

from streamd.errors import SESSION_NOT_FOUND, RpcError
from streamd.eventlog.model import (
    Filter,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionsGetParams,
    SessionTree,
    SinceParams,
    StateDelta,
)
from streamd.eventlog.store import Backend

NUL = "s\x00"
"""A name holding U+0000, whose part before it ("s") is a stored name: a read
that cut the name there, or matched it as a prefix, would find rows."""


def _written(store: Backend) -> None:
    """A log whose every name is "s", "app", "u", "main" or "agent" (and
    their extensions), with state in every scope."""
    delta = StateDelta(app={"a": 1}, user={"u": 1}, session={"s": 1})
    store.append(ap(ev("e1", branch="main"), state_delta=delta), T0)
    store.append(ap(ev("e2", branch="s"), session="s"), T0)
    store.append(ap(ev("e3", author="agents"), user="s", session="s1"), T0)


def _filter_reads(store: Backend, flt: Filter) -> tuple[Any, ...]:
    """Every read by filter, as one value (the wire's since, watch, latest_seq,
    tail's start and branches)."""
    return (
        store.since(SinceParams(from_seq=0, filter=flt, limit=100)),
        store.since_committed(0, flt, 100, 1 << 20),
        store.latest_seq(flt),
        store.nth_newest_seq(flt, 0),
        store.branches(flt, None),
    )


_ABSENT = "nobody"


@pytest.mark.parametrize(
    "named",
    [
        lambda v: Filter(app=v),
        lambda v: Filter(user=v),
        lambda v: Filter(session=v),
        lambda v: Filter(session_tree=SessionTree(app="app", user="u", parent=v)),
        lambda v: Filter(branch_prefixes=[v]),
        lambda v: Filter(author=v),
        lambda v: Filter(author_suffix=v),
    ],
    ids=["app", "user", "session", "session_tree", "branch_prefix", "author", "author_suffix"],
)
def test_a_filter_naming_u0000_matches_nothing_as_one_naming_an_absent_value(
    fx: Fixture, named: Any
) -> None:
    _written(fx.store)
    nothing = _filter_reads(fx.store, named(_ABSENT))
    assert nothing[0].entries == [] and nothing[1] == ([], True) and nothing[4] == []
    assert _filter_reads(fx.store, named(NUL)) == nothing


def test_a_branch_prefix_naming_u0000_leaves_the_group_and_the_others_still_match(
    fx: Fixture,
) -> None:
    _written(fx.store)
    alone = _filter_reads(fx.store, Filter(branch_prefixes=["main"]))
    assert [e.event.id for e in alone[0].entries] == ["e1"]
    assert _filter_reads(fx.store, Filter(branch_prefixes=[NUL, "main"])) == alone


def test_a_filter_naming_u0000_where_the_session_tree_overrides_it_is_not_read(
    fx: Fixture,
) -> None:
    # The tree names its own app and user: the app field is not read at all.
    _written(fx.store)
    tree = SessionTree(app="app", user="u", parent="s")
    got = fx.store.since(SinceParams(from_seq=0, filter=Filter(app=NUL, session_tree=tree)))
    assert [e.event.id for e in got.entries] == ["e1", "e2"]


@pytest.mark.parametrize(
    "key", [("app", "u", NUL), ("app", NUL, "s"), (NUL, "u", "s")], ids=["session", "user", "app"]
)
def test_a_session_naming_u0000_is_not_found(fx: Fixture, key: tuple[str, str, str]) -> None:
    _written(fx.store)
    app, user, session = key
    with pytest.raises(RpcError) as info:
        fx.store.get_session(SessionGetParams(app=app, user=user, session=session))
    assert info.value.code == SESSION_NOT_FOUND
    assert info.value.data == {"app": app, "user": user, "session": session}
    with pytest.raises(RpcError) as state:
        fx.store.get_state(app, user, session, None)
    assert state.value.code == SESSION_NOT_FOUND
    with pytest.raises(RpcError) as as_of:
        fx.store.get_state(app, user, session, 1)
    assert as_of.value.code == SESSION_NOT_FOUND


def test_sessions_get_many_lists_a_key_naming_u0000_as_missing_and_reads_the_others(
    fx: Fixture,
) -> None:
    _written(fx.store)
    keys = [SessionKey(user="u", session=NUL), SessionKey(user="u", session="s"),
            SessionKey(user=NUL, session="s")]
    got = fx.store.get_sessions(SessionsGetParams(app="app", sessions=keys, scoped_state=True))
    assert [(s.user, s.session) for s in got.sessions] == [("u", "s")]
    assert got.sessions[0].app_state == {"a": 1} and got.sessions[0].user_state == {"u": 1}
    assert got.missing == [keys[0], keys[2]]
    other_app = fx.store.get_sessions(SessionsGetParams(app=NUL, sessions=keys))
    assert other_app.sessions == [] and other_app.missing == keys


def test_the_state_of_an_app_or_user_naming_u0000_is_empty(fx: Fixture) -> None:
    _written(fx.store)
    newest = fx.store.newest_seq()
    for as_of in (None, 1):
        user = fx.store.get_state("app", NUL, None, as_of)
        assert (user.app, user.user, user.session) == ({"a": 1}, {}, None)
        app = fx.store.get_state(NUL, "u", None, as_of)
        assert (app.app, app.user) == ({}, {})
        assert app.seq == user.seq == (newest if as_of is None else as_of)


def test_sessions_list_of_an_app_or_user_naming_u0000_is_empty(fx: Fixture) -> None:
    _written(fx.store)
    assert fx.store.list_sessions("app", NUL) == [] and fx.store.list_sessions(NUL, None) == []
    for app, user in (("app", NUL), (NUL, None), (NUL, "u")):
        page = fx.store.list_sessions_page(SessionListParams(app=app, user=user, scoped_state=True))
        assert page.sessions == [] and page.next is None
        assert page.app_state == ({"a": 1} if app == "app" else {}) and page.user_states == {}


@pytest.mark.parametrize(
    "after",
    [
        SessionKey(user="s\x00", session="z"),  # after user "s", before "s" + anything
        SessionKey(user="s", session="s\x00"),  # after ("s", "s"), before ("s", "s1")
        SessionKey(user="s", session="\x00"),  # before every session of user "s"
        SessionKey(user="\x00", session="s"),  # before every user
    ],
)
def test_a_page_cursor_naming_u0000_is_placed_in_the_order_of_the_keys(
    fx: Fixture, after: SessionKey
) -> None:
    # A cursor is a place in (user, session) order, not a key to find: the
    # page is the stored keys after it, U+0000 being the least character.
    for user, session in [("s", "s"), ("s", "s1"), ("sa", "a"), ("s", "t"), ("s\x01", "a"),
                          ("r", "z"), ("u", "s")]:
        fx.store.append(ap(ev(f"{user}/{session}"), user=user, session=session), T0)
    keys = [(s.user, s.session) for s in fx.store.list_sessions("app", None)]
    expected = [k for k in keys if k > (after.user, after.session)]
    for user in (None, "s"):
        page = fx.store.list_sessions_page(SessionListParams(app="app", user=user, after=after))
        assert [(s.user, s.session) for s in page.sessions] == [
            k for k in expected if user is None or k[0] == user
        ]


def test_leases_and_policies_naming_u0000_are_not_found(fx: Fixture) -> None:
    _written(fx.store)
    assert fx.store.list_leases(NUL) == [] and fx.store.list_leases("app", NUL) == []
    assert fx.store.leased_sessions(NUL, T0) == 0
    assert fx.store.release_lease("app", "u", NUL, "me") is False
    assert fx.store.heartbeat_lease("app", "u", NUL, "me", T0) is False
    assert fx.store.retention_policies(NUL) == []


def test_deleting_a_session_naming_u0000_deletes_nothing(fx: Fixture) -> None:
    _written(fx.store)
    before = fx.store.since(SinceParams(from_seq=0, limit=100))
    fx.store.delete_session("app", "u", NUL)
    fx.store.delete_session("app", NUL, "s")
    assert fx.store.since(SinceParams(from_seq=0, limit=100)) == before
