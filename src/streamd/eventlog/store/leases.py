"""Leases: who drives a session, kept alive by heartbeats.

A lease is a row keyed by session, with the stale window its holder declared:
it is stale only when its heartbeat is older than *that* window, whatever
window the requester asks for for itself. Taking a stale lease is a
conditional update on the old holder *and* its heartbeat, so a holder that
beat in the meantime keeps its lease, and of two stealers (on two hosts, or
under READ COMMITTED) one update matches. A heartbeat is a conditional update
on our holder; zero rows means the lease was stolen. A log's leases beat
together (:func:`heartbeats`): one transaction refreshes all that are due.
Times are the lease clock's (:meth:`~streamd.eventlog.store.sql.Sql.lease_now`).

A time that stamps or judges a lease is read once the transaction holds the
lease's row, in a statement after the one that locked it: a time read before
a wait for the row (another requester's transaction, or a host that vanished
in one, held until its server gives up on it) made the lease as old as the
wait when it was written, stealable at once under a window shorter than the
wait. Within one statement no clock can be read after the wait: MariaDB's
``NOW(6)`` is the statement's start, and PostgreSQL computes a row's new
values before it waits for the row's lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamd.eventlog import filters
from streamd.eventlog.model import LeaseAcquireParams, LeaseInfo
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.backend import LeaseKey, LeaseTime, lease_time
from streamd.eventlog.store.sql import Sql

__all__ = [
    "acquire", "heartbeat", "heartbeats", "leased_sessions", "listed", "live_lease", "release",
    "releases",
]

_SESSION = "app_name = ? AND user_id = ? AND session_id = ?"
_KEY_COLUMNS = ("app_name", "user_id", "session_id", "holder")
"""What a heartbeat matches: the session's row, and only while it is our holder's."""


def live_lease(db: Sql, table: str, now_us: int) -> tuple[str, tuple[object, ...]]:
    """EXISTS a live lease on the row of ``table``, by the lease clock: a
    session its holder drives, which retention leaves whole."""
    now, args = db.lease_now(now_us)
    return (
        f"EXISTS (SELECT 1 FROM leases l WHERE l.app_name = {table}.app_name"
        f" AND l.user_id = {table}.user_id AND l.session_id = {table}.session_id"
        f" AND {_fresh('l.', now)})",
        args,
    )


def _fresh(prefix: str, now: str) -> str:
    """A lease's heartbeat is younger than its window, as :func:`acquire`
    judges it (the age in whole milliseconds below the window). Compared as
    an age, not as ``heartbeat + window * 1000``: a window the params allow
    (up to 2**63 - 1 ms) overflowed PostgreSQL's and MySQL's bigint there,
    and every retention step of the app failed."""
    return f"{prefix}stale_after_ms > ({now} - {prefix}heartbeat_at) / 1000"


def leased_sessions(db: Sql, app: str, now_us: int) -> int:
    """Sessions of the app under a live lease (heartbeat within its window)."""
    if db.dialect.cannot_hold(app):
        return 0
    now, args = db.lease_now(now_us)
    row = db.one(
        f"SELECT count(*) FROM leases WHERE app_name = ? AND {_fresh('', now)}", (app, *args)
    )
    return row[0] if row else 0


def acquire(db: Sql, p: LeaseAcquireParams, holder: str, now_us: LeaseTime) -> None:
    """Take the lease for ``holder``, who promises to beat more often than
    ``stale_after_ms``. An existing lease is judged by the window its own
    holder declared, never by ours."""
    key = (p.app, p.user, p.session)
    rules.check_held(
        db.dialect, "lease", [("app", p.app), ("user", p.user), ("session", p.session)]
    )
    stale_after_ms = p.stale_after_ms
    d = db.dialect
    with db.write():
        row = db.one(
            f"SELECT holder, heartbeat_at, stale_after_ms FROM leases"
            f" WHERE {_SESSION}{d.for_update}",
            key,
        )
        if row is None:
            # The row first, its times once it is ours: PostgreSQL's SELECT
            # above passes over a row another requester inserted and has not
            # committed, and it is this insert that waits for that transaction.
            taken = db.insert_absent(
                "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at,"
                " heartbeat_at, stale_after_ms) VALUES (?, ?, ?, ?, 0, 0, ?)",
                (*key, holder, stale_after_ms),
            )
            if not taken:
                # Another host inserted it first, between our read and insert.
                now_sql, now_args = db.lease_now(lease_time(now_us))
                other = db.one(
                    f"SELECT holder, {d.greatest}(0, ({now_sql} - heartbeat_at) / 1000)"
                    f" FROM leases WHERE {_SESSION}",
                    (*now_args, *key),
                )
                who, age = other if other else ("unknown", 0)
                raise rules.locked(p.session, who, int(age), "was taken by another requester")
            now = _now(db, now_us)
            db.run(f"UPDATE leases SET acquired_at = ?, heartbeat_at = ? WHERE {_SESSION}",
                   (now, now, *key))
            return
        now = _now(db, now_us)  # once the row is ours (see the module's essay)
        old_holder, old_beat, old_window_ms = row
        age_ms = max(0, (now - old_beat) // 1000)
        if age_ms < old_window_ms:
            raise rules.locked(p.session, old_holder, age_ms, "is locked")
        if not steal(db, key, old_holder, old_beat, holder, stale_after_ms, now):
            raise rules.locked(p.session, old_holder, age_ms, "was taken by another stealer")


def steal(
    db: Sql,
    key: tuple[str, str, str],
    old_holder: str,
    old_beat: int,
    new_holder: str,
    new_window_ms: int,
    now_us: int,
) -> bool:
    """Take a stale lease only if it is still exactly the stale lease we saw.

    Within SQLite's IMMEDIATE transaction nobody can interleave, but the rule is
    stated as a conditional update so that every backend (PostgreSQL under READ
    COMMITTED included) keeps it: of two stealers only one update matches.
    """
    return (
        db.run(
            "UPDATE leases SET holder = ?, acquired_at = ?, heartbeat_at = ?, stale_after_ms = ?"
            f" WHERE {_SESSION} AND holder = ? AND heartbeat_at = ?",
            (new_holder, now_us, now_us, new_window_ms, *key, old_holder, old_beat),
        )
        == 1
    )


def heartbeat(
    db: Sql, app: str, user: str, session: str, holder: str, now_us: LeaseTime
) -> bool:
    """True while we hold the lease; False means it was stolen (or released)."""
    return heartbeats(db, [LeaseKey(app, user, session, holder)], now_us)[0]


def heartbeats(db: Sql, beats: Sequence[LeaseKey], now_us: LeaseTime) -> list[bool]:
    """For each lease of ``beats``, in order: True while we hold it (its row
    was refreshed), False when it was stolen (or released). One transaction
    for all of them: a log's leases due in one tick cost its writer one write,
    not one each."""
    held = [False] * len(beats)
    # A text the database cannot hold names no row: that lease cannot exist.
    live = [
        i for i, b in enumerate(beats)
        if not db.dialect.cannot_hold(b.app, b.user, b.session, b.holder)
    ]
    if not live:
        return held
    keys = [(beats[i].app, beats[i].user, beats[i].session, beats[i].holder) for i in live]
    with db.write():
        if db.dialect.for_update:
            # On a server, our rows are locked first, by a statement of their
            # own, and the clock read after (see the module's essay). SQLite's
            # transaction already holds the whole file's write lock.
            db.update_each("leases", "heartbeat_at = heartbeat_at", (), _KEY_COLUMNS, keys)
        now_sql, now_args = db.lease_now(lease_time(now_us))
        matched = db.update_each("leases", f"heartbeat_at = {now_sql}", now_args, _KEY_COLUMNS,
                                 keys)
    for i, ours in zip(live, matched, strict=True):
        held[i] = ours
    return held


def _now(db: Sql, now_us: LeaseTime) -> int:
    """The lease clock, read now, as a value to stamp and judge with."""
    now_sql, now_args = db.lease_now(lease_time(now_us))
    row = db.one(f"SELECT {now_sql}", now_args)
    assert row is not None
    return int(row[0])


def release(db: Sql, app: str, user: str, session: str, holder: str) -> bool:
    # Conditional on our holder: never delete a successor's lease.
    if db.dialect.cannot_hold(app, user, session, holder):
        return False  # no such lease can exist
    with db.write(single=True):
        return (
            db.run(
                f"DELETE FROM leases WHERE {_SESSION} AND holder = ?", (app, user, session, holder)
            )
            == 1
        )


def releases(db: Sql, keys: Sequence[LeaseKey]) -> int:
    """Delete the row of every lease of ``keys`` still ours (a stolen one's
    row is its thief's, and stays); how many were. One transaction for all:
    a close that deleted thousands one write each ran out of its grace with
    most of them left, and their sessions stayed locked until stale."""
    live = [
        (k.app, k.user, k.session, k.holder) for k in keys
        if not db.dialect.cannot_hold(k.app, k.user, k.session, k.holder)
    ]
    if not live:
        return 0
    with db.write():
        return db.delete_each("leases", _KEY_COLUMNS, live)


def listed(db: Sql, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
    if db.dialect.cannot_hold(app, user):
        return []
    clauses: list[filters.Clause] = []
    if app is not None:
        clauses.append(("app_name = ?", (app,)))
    if user is not None:
        clauses.append(("user_id = ?", (user,)))
    where, args = filters.render(clauses)
    found = db.rows(
        f"SELECT {rows.LEASE_COLUMNS} FROM leases WHERE {where}"
        " ORDER BY app_name, user_id, session_id",
        args,
    )
    return [rows.to_lease(row) for row in found]
