"""Contract tests for the storage backends: sessions, leases and boots, on
each backend in ``BACKENDS`` (see ``test_store.py``).
"""

from __future__ import annotations

import datetime as dt

import pytest
from support.store_contract import KEY, SECOND, T0, Fixture, ap, ev, ids

from streamd.errors import (
    INVALID_PARAMS,
    SESSION_LOCKED,
    SESSION_NOT_FOUND,
    SOURCE_UNAVAILABLE,
    RpcError,
    is_session_locked,
    is_session_not_found,
)
from streamd.eventlog.model import (
    LeaseAcquireParams,
    SessionCreateParams,
    SessionGetParams,
)
from streamd.eventlog.sqlite import SqliteStore

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


def test_a_page_of_boots_continues_after_a_boot_in_time_then_id_order(fx: Fixture) -> None:
    # The cursor of boot.recent's pages: a boot id, placed by its boot_at and
    # id, so boots recorded at one time (a crash loop) are neither repeated
    # nor skipped between pages.
    late = fx.store.record_boot(T0 + SECOND, ["late"])
    same = [fx.store.record_boot(T0, [f"s{i}"]) for i in range(3)]
    page = fx.store.recent_boots_page(0, same[0])
    assert [b.id for b in page.boots] == [same[1], same[2], late] and page.next is None
    assert [b.id for b in fx.store.recent_boots_page(0, late).boots] == []
    assert [b.id for b in fx.store.recent_boots_page(T0 + SECOND, None).boots] == [late]
    with pytest.raises(RpcError) as info:
        fx.store.recent_boots_page(0, late + 100)
    assert info.value.code == INVALID_PARAMS
