"""Contract tests for the storage backends: a log's many heartbeats, and its
many releases, as one store call, on each backend in ``BACKENDS`` (see
``test_store.py``).

One call refreshes every lease it names, in one transaction, and answers for
each whether its row is still ours; a lease stolen, released or never taken
among them is the only one answered False, and its row is left as it is. One
call releases every lease it names that is still ours, and leaves a thief's
row.
"""

from __future__ import annotations

from support.store_contract import SECOND, T0, Fixture

from streamd.eventlog.model import LeaseAcquireParams
from streamd.eventlog.store import LeaseKey


def _acquire(fx: Fixture, session: str, holder: str, at_us: int) -> LeaseKey:
    fx.store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session=session, stale_after_ms=30_000),
        holder,
        at_us,
    )
    return LeaseKey("app", "u", session, holder)


def _beats_at(fx: Fixture) -> dict[tuple[str, str], float]:
    """Each lease's (session, holder) and its heartbeat, in seconds after T0."""
    return {
        (info.session, info.holder): info.heartbeat_at.timestamp() - T0 / SECOND
        for info in fx.store.list_leases()
        if info.heartbeat_at is not None
    }


def test_one_call_refreshes_the_leases_still_ours_and_names_each_one_that_is_not(
    fx: Fixture,
) -> None:
    keys = [_acquire(fx, f"s{i}", f"h/1/{i:08x}", T0) for i in range(5)]
    # s1 is stolen once stale, s3 released; "ghost" was never taken.
    thief = _acquire(fx, "s1", "thief", T0 + 31 * SECOND)
    fx.store.release_lease("app", "u", "s3", keys[3].holder)
    ghost = LeaseKey("app", "u", "ghost", "h/1/ffffffff")
    held = fx.store.heartbeat_leases([*keys, ghost], T0 + 40 * SECOND)
    assert held == [True, False, True, False, True, False]
    assert _beats_at(fx) == {
        ("s0", keys[0].holder): 40,
        ("s1", thief.holder): 31,  # the thief's row is not ours to refresh
        ("s2", keys[2].holder): 40,
        ("s4", keys[4].holder): 40,
    }


def test_many_leases_with_some_lost_in_the_middle_are_answered_one_by_one(fx: Fixture) -> None:
    # More keys than one statement names on MySQL (KEYS_A_STATEMENT), with
    # leases lost in three of its runs of them: each answered for itself.
    n = 1200
    rows = [("app", "u", f"s{i:04d}", f"h/1/{i:08x}", T0, T0, 30_000) for i in range(n)]
    fx.raw(
        "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at, heartbeat_at,"
        " stale_after_ms) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * n),
        tuple(v for row in rows for v in row),
    )
    lost = {3, 700, 701, 1199}
    fx.raw(
        "UPDATE leases SET holder = 'thief' WHERE session_id IN (?, ?, ?, ?)",
        tuple(f"s{i:04d}" for i in sorted(lost)),
    )
    keys = [LeaseKey("app", "u", f"s{i:04d}", f"h/1/{i:08x}") for i in range(n)]
    held = fx.store.heartbeat_leases(keys, T0 + 5 * SECOND)
    assert [i for i, ours in enumerate(held) if not ours] == sorted(lost)
    beats = _beats_at(fx)
    assert {beats[(k.session, k.holder)] for i, k in enumerate(keys) if i not in lost} == {5}
    assert {beats[(f"s{i:04d}", "thief")] for i in lost} == {0}


def test_a_lease_no_database_can_hold_is_not_ours_and_fails_no_other(fx: Fixture) -> None:
    # U+0000: PostgreSQL and MariaDB cannot store it, so no such lease exists
    # there; SQLite can, and has none of that name either.
    key = _acquire(fx, "s", "h/1/aaaaaaaa", T0)
    nul = LeaseKey("app", "u", "s\x00", "h/1/aaaaaaaa")
    assert fx.store.heartbeat_leases([nul, key], T0 + SECOND) == [False, True]
    assert fx.store.heartbeat_leases([nul], T0 + SECOND) == [False]
    assert fx.store.heartbeat_leases([], T0 + SECOND) == []


def test_a_lease_named_twice_in_one_call_is_answered_alike_both_times(fx: Fixture) -> None:
    key = _acquire(fx, "s", "h/1/aaaaaaaa", T0)
    other = _acquire(fx, "t", "h/1/bbbbbbbb", T0)
    fx.store.release_lease("app", "u", "t", other.holder)
    assert fx.store.heartbeat_leases([key, other, key, other], T0 + SECOND) == [
        True, False, True, False,
    ]


def test_one_call_releases_the_leases_still_ours_and_leaves_a_thiefs_row(fx: Fixture) -> None:
    keys = [_acquire(fx, f"s{i}", f"h/1/{i:08x}", T0) for i in range(5)]
    # s1 is stolen once stale, s3 already released; "ghost" was never taken;
    # U+0000 no server can hold.
    thief = _acquire(fx, "s1", "thief", T0 + 31 * SECOND)
    fx.store.release_lease("app", "u", "s3", keys[3].holder)
    ghost = LeaseKey("app", "u", "ghost", "h/1/ffffffff")
    nul = LeaseKey("app", "u", "s\x00", "h/1/aaaaaaaa")
    assert fx.store.release_leases([*keys, ghost, nul]) == 3
    assert _beats_at(fx) == {("s1", thief.holder): 31}
    assert fx.store.release_leases([]) == 0


def test_thousands_of_leases_are_released_by_one_call_with_stolen_ones_left(
    fx: Fixture,
) -> None:
    # More keys than one statement names on MySQL (KEYS_A_STATEMENT).
    n = 2500
    rows = [("app", "u", f"s{i:04d}", f"h/1/{i:08x}", T0, T0, 30_000) for i in range(n)]
    fx.raw(
        "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at, heartbeat_at,"
        " stale_after_ms) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * n),
        tuple(v for row in rows for v in row),
    )
    stolen = {3, 700, 2499}
    fx.raw(
        "UPDATE leases SET holder = 'thief' WHERE session_id IN (?, ?, ?)",
        tuple(f"s{i:04d}" for i in sorted(stolen)),
    )
    keys = [LeaseKey("app", "u", f"s{i:04d}", f"h/1/{i:08x}") for i in range(n)]
    assert fx.store.release_leases(keys) == n - len(stolen)
    assert set(_beats_at(fx)) == {(f"s{i:04d}", "thief") for i in stolen}
