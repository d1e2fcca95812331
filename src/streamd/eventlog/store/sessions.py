"""Sessions: created, read with their events, listed, paged and deleted.

A session row exists from its first append (or its creation) on, so a read
can tell a session that was written from one that never was. A read of
events is bounded three ways, each the same on every backend: after a seq,
at or after a time, the newest ``recent`` of those; and, given ``max_bytes``,
no more than fit in that many bytes on the wire with the session itself,
then ``truncated`` with ``next_seq`` where to go on.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from streamd.errors import INVALID_PARAMS, RpcError, invalid_params
from streamd.eventlog import filters
from streamd.eventlog.model import (
    MAX_STATE_BYTES,
    REPLY_BUDGET_BYTES,
    Session,
    SessionCreateParams,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionListResult,
    SessionsGetParams,
    SessionsResult,
    SessionWithEvents,
    StateDelta,
    to_us,
    wire_size,
)
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.backend import ReadShape, Shape
from streamd.eventlog.store.sql import Args, Sql
from streamd.eventlog.store.state import apply_delta, shared_state
from streamd.eventlog.store.storable import refusal_of

__all__ = [
    "EventBounds",
    "create_session",
    "delete_session",
    "get_session",
    "get_sessions",
    "list_sessions",
    "list_sessions_page",
    "page_query",
]

_SESSION = "app_name = ? AND user_id = ? AND session_id = ?"


def _us_or_none(when: _dt.datetime | None) -> int | None:
    return None if when is None else to_us(when)


def create_session(db: Sql, p: SessionCreateParams, now_us: int) -> Session:
    """Create a session with its own state, merging ``app_state`` and
    ``user_state`` into the state its app and user share, in one
    transaction. The deltas are recorded at the newest seq (its counter
    locked, so they take their place after every seq committed and state
    merges never interleave), so a read as of that seq sees them."""
    app, user, state = p.app, p.user, p.state
    session_id = p.session if p.session is not None else uuid.uuid4().hex
    try:
        state_json = rows.json_text(state or {})
        delta = StateDelta(app=p.app_state, user=p.user_state, session=state).normalized()
        if delta is not None:
            rows.json_text(delta)
    except (TypeError, ValueError) as exc:
        # Looked for only now, as rows.prepare does for an event.
        if (refusal := refusal_of(exc, p)) is not None:
            raise refusal from None
        raise invalid_params(f"session state is not JSON: {exc}") from None
    try:
        with db.write():
            at_seq = db.newest_seq(lock=True) if delta is not None else 0
            db.run(
                "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
                " updated_at, last_event_time) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (app, user, session_id, "{}", now_us, now_us, now_us),
            )
            if delta is not None:
                apply_delta(db, app, user, session_id, delta, at_seq, now_us)
    except db.duplicate_key:
        raise RpcError(
            INVALID_PARAMS,
            f"session {session_id!r} already exists",
            {"app": app, "user": user, "session": session_id, "reason": "session_exists"},
        ) from None
    except db.bad_value as exc:
        raise invalid_params(f"session rejected by the database: {db.describe(exc)}") from None
    # The session as it now reads back.
    return rows.to_session((app, user, session_id, state_json, now_us, now_us, 0, now_us))


@dataclass(frozen=True, slots=True)
class EventBounds:
    """Which of a session's events a read returns: after a seq, at or after a
    time, the newest ``recent`` of those. Where the dialect pins reads to an
    index, each is pinned to the one that answers it, so its cost follows
    what it returns: ``events_by_session`` (equality on the session, a range
    of seq) normally, and ``events_by_session_time`` (a range of time) with a
    time bound. ``recent`` finds the window's first seq by walking that index
    backwards ``recent`` entries, then reads forward from it."""

    after_seq: int
    recent: int | None
    after_time_us: int | None
    content: bool = True

    def _where(
        self, dialect: filters.Dialect, key: tuple[str, str, str], after_seq: int
    ) -> tuple[str, str, tuple[Any, ...]]:
        where = _SESSION + " AND seq > ?"
        args: tuple[Any, ...] = (*key, after_seq)
        if self.after_time_us is None:
            return dialect.indexed("events", "events_by_session"), where, args
        return (
            dialect.indexed("events", "events_by_session_time"),
            where + " AND event_time >= ?",
            (*args, self.after_time_us),
        )

    def window(
        self, dialect: filters.Dialect, key: tuple[str, str, str]
    ) -> tuple[str, tuple[Any, ...]] | None:
        """The query for the first seq of the ``recent`` window, if any."""
        if self.recent is None:
            return None
        table, where, args = self._where(dialect, key, self.after_seq)
        return (
            f"SELECT seq FROM {table} WHERE {where} ORDER BY seq DESC LIMIT 1 OFFSET ?",
            (*args, self.recent - 1),
        )

    def read(
        self, dialect: filters.Dialect, key: tuple[str, str, str], after_seq: int
    ) -> tuple[str, Args]:
        """The events after ``after_seq``, oldest first (no LIMIT)."""
        table, where, args = self._where(dialect, key, after_seq)
        columns = rows.ENTRY_COLUMNS if self.content else rows.ENTRY_COLUMNS_WITHOUT_CONTENT
        return f"SELECT {columns} FROM {table} WHERE {where} ORDER BY seq", args

    def queries(
        self, dialect: filters.Dialect, key: tuple[str, str, str], after_seq: int
    ) -> list[tuple[str, Args]]:
        """Every statement a read runs, in order (for query plans)."""
        window = self.window(dialect, key)
        return ([window] if window else []) + [self.read(dialect, key, after_seq)]


def session_with_events(
    db: Sql,
    app: str,
    user: str,
    session: str,
    bounds: EventBounds,
    shape: Shape,
    max_bytes: int | None,
    min_one: bool,
    scoped_state: bool,
    room: StateRoom | None = None,
) -> SessionWithEvents | None:
    """One session and its events within ``bounds`` (None if never written),
    inside the caller's snapshot; at most ``max_bytes`` on the wire in all.
    ``room``: a bulk read's room for sessions and shared states, which this
    one takes its share of, or raises :class:`NoRoom`."""
    if db.dialect.cannot_hold(app, user, session):
        return None
    row = db.one(
        f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE {_SESSION}", (app, user, session)
    )
    if row is None:
        return None
    base = rows.to_session(row)
    app_state = user_state = None
    if scoped_state:
        app_state, user_state = shared_state(db, app, user)
    budget = None
    if max_bytes is not None:
        budget = max_bytes - wire_size(base)
        if scoped_state:
            budget -= wire_size([app_state, user_state])
    if room is not None:
        size = wire_size(base) + (wire_size([app_state, user_state]) if scoped_state else 0)
        room.take(size)
    key = (app, user, session)
    start = bounds.after_seq
    events: list[Any] = []
    last, more = None, False
    if bounds.recent != 0:
        window = bounds.window(db.dialect, key)
        if window is not None:
            # The window is the newest `recent` events; read it oldest first
            # from its first seq, so a cut keeps seq order and the rest is
            # what follows the last event returned.
            first = db.one(*window)
            if first is not None:
                start = first[0] - 1
        dialect = db.dialect
        found = db.scan_events(lambda after: bounds.read(dialect, key, after), start)
        with closing(found):
            if budget is not None and budget <= 0 and not min_one:
                more = next(found, None) is not None
            else:
                events, last, more = rows.take(found, bounds.recent, shape, budget, min_one)
    return SessionWithEvents(
        app=base.app,
        user=base.user,
        session=base.session,
        state=base.state,
        created_at=base.created_at,
        updated_at=base.updated_at,
        last_seq=base.last_seq,
        last_event_time=base.last_event_time,
        events=events,
        truncated=more,
        next_seq=(start if last is None else last) if more else None,
        app_state=app_state,
        user_state=user_state,
    )


def get_session(db: Sql, p: SessionGetParams, shape: ReadShape) -> SessionWithEvents:
    """The session and its events within the bounds ``p`` asks for, oldest
    first, from one snapshot; ``scoped_state`` adds the app's and the user's
    state."""
    rules.check_recent(p.recent)
    bounds = EventBounds(p.after_seq, p.recent, _us_or_none(p.after_time), p.content)
    with db.snapshot():
        got = session_with_events(
            db,
            p.app,
            p.user,
            p.session,
            bounds,
            shape.entries,
            shape.max_bytes,
            True,
            p.scoped_state,
        )
    if got is None:
        raise rules.not_found(p.app, p.user, p.session)
    return got


class NoRoom(Exception):
    """A session of a bulk read that its answer has no room left for."""


@dataclass
class StateRoom:
    """What the sessions of a bulk read, with the shared states each carries,
    may take of its answer beside the events' budget: the states one
    ``sessions.get`` may carry (three scopes at :data:`MAX_STATE_BYTES`),
    so the answer stays a frame a client can read. The first session always
    fits; a session's row is small, so only states fill it."""

    left: int = 3 * MAX_STATE_BYTES
    first: bool = True

    def take(self, size: int) -> None:
        if size > self.left and not self.first:
            raise NoRoom
        self.left -= size
        self.first = False


def get_sessions(db: Sql, p: SessionsGetParams, shape: ReadShape) -> SessionsResult:
    """Many sessions with their events, in one snapshot, in the order asked.

    ``max_bytes`` is shared: each session gets what the ones before it
    left. The first entry of the whole answer is always taken (a reader
    gets past any entry); after that a session whose next entry does not
    fit is ``truncated`` where it stands, with no events if need be, and
    ``next_seq`` says where to continue it. A session whose own state (and
    the shared states it carries) does not fit the room the states have
    (:class:`StateRoom`) is not read, and neither is any key after it: they
    are ``unread``, to be asked again (the first session always comes back).
    Counting events alone, ten sessions of 0.9 MB state made an answer over
    the frame limit for good."""
    rules.check_recent(p.recent)
    found: list[SessionWithEvents] = []
    missing: list[SessionKey] = []
    left = shape.max_bytes
    after_time_us = _us_or_none(p.after_time)
    taken_any = False
    room = StateRoom() if left is not None else None
    with db.snapshot():
        for i, key in enumerate(p.sessions):
            bounds = EventBounds(key.after_seq, p.recent, after_time_us)
            try:
                got = session_with_events(
                    db,
                    p.app,
                    key.user,
                    key.session,
                    bounds,
                    shape.entries,
                    left,
                    not taken_any,
                    p.scoped_state,
                    room,
                )
            except NoRoom:
                return SessionsResult(sessions=found, missing=missing, unread=p.sessions[i:])
            if got is None:
                missing.append(key)
                continue
            found.append(got)
            taken_any = taken_any or bool(got.events)
            if left is not None:
                left -= wire_size(got) + 1
    return SessionsResult(sessions=found, missing=missing)


def list_sessions(db: Sql, app: str, user: str | None) -> list[Session]:
    """Every session of the app (of one user), in ``(user, session)`` order,
    without events; unbounded, for people and tools. Clients page with
    :func:`list_sessions_page`."""
    if db.dialect.cannot_hold(app, user):
        return []
    sql = f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE app_name = ?"
    args: tuple[Any, ...] = (app,)
    if user is not None:
        sql += " AND user_id = ?"
        args += (user,)
    return [rows.to_session(r) for r in db.rows(sql + " ORDER BY user_id, session_id", args)]


def page_query(
    dialect: filters.Dialect, app: str, user: str | None, limit: int, after: SessionKey | None
) -> tuple[str, tuple[Any, ...]]:
    """The SELECT of one page of sessions: one range of their primary key.
    The cursor is a place in that order, not a key to find: one the database
    cannot hold is placed where it falls among those it holds
    (:meth:`~streamd.eventlog.filters.Dialect.placed`)."""
    clauses: list[filters.Clause] = [("app_name = ?", (app,))]
    if dialect.cannot_hold(app, user):
        clauses = [(dialect.false, ())]  # no session of theirs can exist
    elif user is not None:
        clauses.append(("user_id = ?", (user,)))
        # Within one user the cursor is a range of session ids (SQLite does
        # not narrow an index range by a row value after an equality).
        if after is not None and after.user == user:
            clauses.append(("session_id > ?", (dialect.placed(after.session),)))
        elif after is not None and after.user > user:
            clauses.append((dialect.false, ()))
    elif after is not None and dialect.cannot_hold(after.user):
        # No stored user is the cursor's, so its session orders nothing: the
        # page is the users after it.
        clauses.append(("user_id > ?", (dialect.placed(after.user),)))
    elif after is not None:
        # A row value: the primary key's order, so the page is a range of it.
        clauses.append(
            ("(user_id, session_id) > (?, ?)", (after.user, dialect.placed(after.session)))
        )
    where, args = filters.render(clauses)
    return (
        f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE {where}"
        " ORDER BY user_id, session_id LIMIT ?",
        (*args, limit + 1),
    )


def list_sessions_page(
    db: Sql, p: SessionListParams, max_bytes: int = REPLY_BUDGET_BYTES
) -> SessionListResult:
    """One page of sessions after the cursor, read as one range of the
    sessions' primary key; ``next`` is null on the last page.

    The page also ends before ``max_bytes`` of sessions and shared states
    (always with one session): a session's state may be 1 MiB, and ten such
    made every read of the app's list an answer over the frame limit (refused
    -32603 each time, the ADK service's ``list_sessions`` too). Rows are read
    as they are taken, so the rows a page leaves out are never loaded."""
    app, user, limit = p.app, p.user, p.limit
    rules.check_limit(limit)
    sql, args = page_query(db.dialect, app, user, limit, p.after)
    page: list[Session] = []
    more = False
    app_state: dict[str, Any] | None = None
    user_states: dict[str, dict[str, Any]] | None = None
    with db.snapshot():
        used = 0
        if p.scoped_state:
            app_state, _ = shared_state(db, app, None)
            user_states = {}
            used = wire_size(app_state)
        with closing(db.scan(sql, args)) as found:
            for row in found:
                if len(page) == limit:
                    more = True
                    break
                session = rows.to_session(row)
                size = wire_size(session) + 1
                user_state = None
                if user_states is not None and session.user not in user_states:
                    user_state = shared_state(db, app, session.user)[1] or {}
                    size += wire_size(user_state) + wire_size(session.user) + 2
                if page and used + size > max_bytes:
                    more = True
                    break
                used += size
                page.append(session)
                if user_state is not None and user_states is not None:
                    user_states[session.user] = user_state
    last = page[-1] if more else None
    return SessionListResult(
        sessions=page,
        next=SessionKey(user=last.user, session=last.session) if last else None,
        app_state=app_state,
        user_states=user_states,
    )


def delete_session(db: Sql, app: str, user: str, session: str) -> None:
    # Idempotent. The events go first, by name: InnoDB's cascade fires no
    # trigger, and the deletion signal (``removed_events``) is a trigger.
    # The foreign key's cascade stays, so no orphan row can fail a replay.
    key = (app, user, session)
    if db.dialect.cannot_hold(*key):
        return  # no such session can exist
    with db.write(removes=True):
        # The session's row locked first (a server's lock), so another
        # daemon's append to it waits for the delete, or the delete for the
        # append, whose events the next statement then takes by name. Locked
        # only by the row's delete, after the events were taken, an append
        # committed in between lost its event to the cascade, which on MySQL
        # recorded no removal: an index of the log kept it for ever.
        db.one(f"SELECT 1 FROM sessions WHERE {_SESSION}{db.dialect.for_update}", key)
        db.run(f"DELETE FROM events WHERE {_SESSION}", key)
        db.run(f"DELETE FROM sessions WHERE {_SESSION}", key)
