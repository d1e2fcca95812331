"""Retention in storage: the policies, and one bounded step of each rule.

How a policy is cut into steps, and why, is in
:mod:`streamd.eventlog.retention`; each function here is one step, one
transaction, bounded by :class:`~streamd.eventlog.store.steps.Bounds`. No
step touches a session under a live lease (its holder drives it) or an event
after ``keep_after_seq`` (a watch still needs it).
"""

from __future__ import annotations

from typing import Any

from streamd.eventlog.model import RetentionPolicy
from streamd.eventlog.store import rules
from streamd.eventlog.store.leases import live_lease
from streamd.eventlog.store.sql import MAX_SEQ, Sql
from streamd.eventlog.store.steps import Bounds, KeepAfter, SessionCursor, Step, kept_after

__all__ = [
    "drop_idle_sessions",
    "drop_old_events",
    "old_events",
    "retention_policies",
    "set_retention",
    "trim_sessions",
]

_SESSION = "app_name = ? AND user_id = ? AND session_id = ?"


def _keep(keep_after_seq: KeepAfter) -> int:
    """The seq after which the step removes nothing, read inside its
    transaction (see :data:`~streamd.eventlog.store.steps.KeepAfter`)."""
    keep = kept_after(keep_after_seq)
    return MAX_SEQ if keep is None else keep


def set_retention(db: Sql, policy: RetentionPolicy, now_us: int) -> None:
    """Store the app's policy; one without limits removes it."""
    if policy.empty() and db.dialect.cannot_hold(policy.app):
        return  # no policy of such an app can exist
    rules.check_held(db.dialect, "retention policy", [("app", policy.app)])
    with db.write(single=True):
        if policy.empty():
            db.run("DELETE FROM retention WHERE app_name = ?", (policy.app,))
            return
        db.run(
            "INSERT INTO retention (app_name, max_age_s, max_events, idle_s, updated_at)"
            " VALUES (?, ?, ?, ?, ?)"
            + db.dialect.on_conflict_update(
                "app_name", ("max_age_s", "max_events", "idle_s", "updated_at")
            ),
            (policy.app, policy.max_age_s, policy.max_events, policy.idle_s, now_us),
        )


def retention_policies(db: Sql, app: str | None = None) -> list[RetentionPolicy]:
    if db.dialect.cannot_hold(app):
        return []
    sql = "SELECT app_name, max_age_s, max_events, idle_s FROM retention"
    args: tuple[Any, ...] = ()
    if app is not None:
        sql += " WHERE app_name = ?"
        args = (app,)
    return [
        RetentionPolicy(app=a, max_age_s=age, max_events=n, idle_s=idle)
        for a, age, n, idle in db.rows(sql + " ORDER BY app_name", args)
    ]


def drop_idle_sessions(
    db: Sql,
    app: str,
    cutoff_us: int,
    keep_after_seq: KeepAfter,
    now_us: int,
    previous: Step | None,
    bounds: Bounds,
) -> Step:
    """One bounded step of dropping the app's sessions not updated since
    ``cutoff_us`` (skipping leased ones and any holding an event after
    ``keep_after_seq``): each loses its own state history, then its events
    from the oldest, and its row goes in the transaction that deletes its
    newest event."""
    leased, largs = live_lease(db, "s", now_us)
    by_session = db.dialect.indexed("events", "events_by_session")
    budget = bounds.events
    events = deltas = sessions = 0
    cursor: SessionCursor | None = None
    after = 0
    with db.write(removes=True):
        keep = _keep(keep_after_seq)
        # A watch needs the events it has not been sent, not the session's
        # history: judged by last_seq, a session whose newest events an
        # older policy had removed stayed, empty and idle, for as long as a
        # watch lagged behind that seq.
        watched = ""
        wargs: tuple[int, ...] = ()
        if keep < MAX_SEQ:
            watched = (
                f" AND NOT EXISTS (SELECT 1 FROM {by_session} WHERE app_name = s.app_name"
                " AND user_id = s.user_id AND session_id = s.session_id AND seq > ?)"
            )
            wargs = (keep,)
        # Locked (a server's): another daemon's append to one of them waits
        # for this step, or this step for it, and a session appended to
        # meanwhile is idle no longer, and skipped. Without the lock the
        # step's later statements saw, and deleted, events another daemon
        # had committed and acknowledged since this one chose its sessions.
        idle = db.rows(
            "SELECT user_id, session_id FROM sessions s WHERE app_name = ?"
            f" AND updated_at < ?{watched} AND NOT {leased}"
            f" ORDER BY user_id, session_id LIMIT ?{db.dialect.for_update}",
            (app, cutoff_us, *wargs, *largs, bounds.sessions),
        )
        for user, session in idle:
            key = (app, user, session)
            done = previous.after_seq if previous and previous.cursor == (user, session) else 0
            n = len(db.delete_returning(
                "state_deltas", "rev",
                f"SELECT rev FROM state_deltas WHERE scope = 'session' AND {_SESSION}"
                " ORDER BY seq, rev LIMIT ?",
                (*key, budget),
            ))
            deltas, budget = deltas + n, budget - n
            if budget == 0:
                cursor, after = (user, session), done
                break
            gone = db.delete_returning(
                "events", "seq",
                f"SELECT seq FROM {by_session} WHERE {_SESSION} AND seq > ? ORDER BY seq LIMIT ?",
                (*key, done, budget),
            )
            events, budget = events + len(gone), budget - len(gone)
            if budget == 0 and db.one(
                f"SELECT 1 FROM events WHERE {_SESSION} AND seq > ? LIMIT 1", (*key, max(gone))
            ):
                cursor, after = (user, session), max(gone)
                break
            # Nothing left under it: the cascade and the trigger delete nothing.
            db.run(f"DELETE FROM sessions WHERE {_SESSION}", key)
            sessions += 1
            if budget == 0:
                break
    more = budget == 0 or len(idle) == bounds.sessions
    return Step(events=events, rows=events + deltas, sessions=sessions, more=more,
                cursor=cursor, after_seq=after)


def drop_old_events(
    db: Sql,
    app: str,
    cutoff_us: int,
    keep_after_seq: KeepAfter,
    now_us: int,
    previous: Step | None,
    bounds: Bounds,
) -> Step:
    """One bounded step of deleting the app's events timestamped before
    ``cutoff_us`` (none of a leased session, none after ``keep_after_seq``),
    in seq order from where the step before stopped."""
    done = previous.after_seq if previous else 0
    with db.write(removes=True):
        keep = _keep(keep_after_seq)
        gone = db.delete_returning(
            "events", "seq", *old_events(db, app, cutoff_us, done, keep, now_us, bounds.events)
        )
    n = len(gone)
    return Step(events=n, rows=n, more=n == bounds.events, after_seq=max(gone, default=done))


def old_events(
    db: Sql, app: str, cutoff_us: int, after: int, keep: int, now_us: int, limit: int
) -> tuple[str, tuple[Any, ...]]:
    """The SELECT of a :func:`drop_old_events` step: the first ``limit`` seqs
    after ``after`` (up to ``keep``) of the app's unleased events older than
    ``cutoff_us``. Every backend has ``events_by_app_time``: its planner
    reads the old events there when they are few (none, at the end of most
    compactions), instead of every event after ``after``."""
    leased, largs = live_lease(db, "e", now_us)
    return (
        "SELECT seq FROM events e WHERE app_name = ?"
        f" AND event_time < ? AND seq > ? AND seq <= ? AND NOT {leased}"
        " ORDER BY seq LIMIT ?",
        (app, cutoff_us, after, keep, *largs, limit),
    )


def trim_sessions(
    db: Sql,
    app: str,
    max_events: int,
    keep_after_seq: KeepAfter,
    now_us: int,
    previous: Step | None,
    bounds: Bounds,
) -> Step:
    """One bounded step of cutting the app's sessions (in key order, from
    the previous step's cursor on) to their newest ``max_events`` events,
    oldest first; the step's cursor is the first session the next step
    looks at. Each session's cut point is found by walking
    ``events_by_session`` back ``max_events`` entries, not by counting the
    session."""
    leased, largs = live_lease(db, "s", now_us)
    by_session = db.dialect.indexed("events", "events_by_session")
    budget = bounds.events
    start = previous.cursor if previous else None
    cursor: SessionCursor | None = None
    after = 0
    with db.write(removes=True):
        keep = _keep(keep_after_seq)
        # One more than looked at, to know where the next step starts.
        page = db.rows(
            "SELECT user_id, session_id FROM sessions s WHERE app_name = ?"
            f" AND (user_id, session_id) >= (?, ?) AND NOT {leased}"
            " ORDER BY user_id, session_id LIMIT ?",
            (app, *(start or ("", "")), *largs, bounds.sessions + 1),
        )
        if len(page) > bounds.sessions:
            cursor = (page[-1][0], page[-1][1])
            del page[-1]
        walked = 0
        for user, session in page:
            # Finding a cut point reads the session's newest entries, up to
            # max_events + 1: bounded per step too (one session always, to
            # move on). A session is charged what its walk read, not the
            # limit: charged max_events + 1 each, a log within a generous
            # policy took a step, a committed transaction, per session
            # (10,000 steps, 26 s on PostgreSQL at a million events).
            # A policy may keep up to 2**63 - 1 events, and one more is no
            # 64-bit LIMIT (SQLite's driver overflowed, PostgreSQL's bigint
            # too, failing every compaction); no session holds that many.
            want = min(max_events, MAX_SEQ - 1) + 1
            cap = want if not walked else min(want, bounds.events - walked)
            if cap <= 0:
                cursor = (user, session)
                break
            key = (app, user, session)
            walk = db.one(
                f"SELECT min(seq), count(*) FROM (SELECT seq FROM {by_session}"
                f" WHERE {_SESSION} ORDER BY seq DESC LIMIT ?) AS newest",
                (*key, cap),
            )
            assert walk is not None  # an aggregate answers one row
            cut, read = walk
            walked += read
            if read == cap < want:
                # The bound ran out before the walk could tell: the next
                # step walks this session first.
                cursor = (user, session)
                break
            if read < want:
                continue  # no more than max_events: nothing to cut
            done = previous.after_seq if previous and start == (user, session) else 0
            gone = db.delete_returning(
                "events", "seq",
                f"SELECT seq FROM {by_session} WHERE {_SESSION}"
                " AND seq > ? AND seq <= ? AND seq <= ? ORDER BY seq LIMIT ?",
                (*key, done, cut, keep, budget),
            )
            budget -= len(gone)
            if budget == 0:
                # It may have more to cut: again next step, after these.
                cursor, after = (user, session), max(gone)
                break
    deleted = bounds.events - budget
    return Step(events=deleted, rows=deleted, more=cursor is not None, cursor=cursor,
                after_seq=after)
