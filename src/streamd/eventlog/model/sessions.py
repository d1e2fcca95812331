"""Sessions: create, get (one, or many at once), list and delete.

No I/O here, and no trio.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, TypeVar

import msgspec

from streamd.eventlog.model.base import (
    DEFAULT_SINCE_LIMIT,
    MAX_SINCE_LIMIT,
    NonEmpty,
    Params,
    Result,
    Seq,
    UtcTime,
)
from streamd.eventlog.model.events import Entry


class SessionCreateParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty | None = None
    state: dict[str, Any] | None = None
    """The new session's own state."""
    app_state: dict[str, Any] | None = None
    user_state: dict[str, Any] | None = None
    """Merged (key by key) into the app's and the user's shared state, in the
    transaction that creates the session."""


class Session(Result, kw_only=True, omit_defaults=True):
    """``state``, ``created_at`` and ``updated_at`` are null only for a damaged
    row (see the module docstring); they always have a value otherwise.

    ``last_seq`` is the seq of the newest event ever appended to the session (0
    before the first): what a writer passes as ``expected_seq``. It is history,
    not what is retained, so it never goes back when events are compacted."""

    app: str
    user: str
    session: str
    state: dict[str, Any] | None
    created_at: _dt.datetime | None
    updated_at: _dt.datetime | None
    last_seq: int
    last_event_time: _dt.datetime | None = None
    """The timestamp of the session's newest event (its creation time before
    the first), where ``updated_at`` is the daemon's clock at its last write:
    what a framework orders sessions by. History like ``last_seq``. Sent only
    to a caller that asks (``event_time: true``), so the wire of every other
    caller stays as it was; the Python API always has it."""


class SessionWithEvents(Session, kw_only=True, omit_defaults=True):
    """The session with its events in seq order. When the events do not fit the
    reply budget (:data:`REPLY_BUDGET_BYTES`) the answer holds the oldest that
    fit, ``truncated: true`` and ``next_seq`` (the last seq returned): ask again
    with ``after_seq: next_seq`` (and the same ``recent``) for the rest. Both
    keys are absent from an answer that holds everything. Events are
    pre-encoded for the JSON-RPC method as in :class:`SinceResult`."""

    events: list[Entry]
    truncated: bool = False
    next_seq: int | None = None
    app_state: dict[str, Any] | None = None
    user_state: dict[str, Any] | None = None
    """Only when asked for (``scoped_state``): the app's and the user's shared
    state, read in the same snapshot as the session."""


class SessionGetParams(Params, kw_only=True):
    """Which events come back, all ANDed, each bound served by an index
    (``events_by_session``; ``events_by_session_time`` with ``after_time``)
    so a bounded read costs what it returns, not what the session holds."""

    app: NonEmpty
    user: NonEmpty
    session: NonEmpty
    after_seq: Seq = 0
    """Only events after this seq; also how a truncated answer is continued."""
    recent: Seq | None = None
    """Only the newest N events (of those the other bounds admit), still in
    seq order; 0 returns the session without events."""
    after_time: UtcTime | None = None
    """Only events whose timestamp is at or after this time."""
    scoped_state: bool = False
    """Also return the app's and the user's state (``app_state``,
    ``user_state``), read in the same snapshot as the session."""
    event_time: bool = False
    """Also return the session's ``last_event_time``."""
    content: bool = True
    """False: every event comes with its content null, for a client that keeps
    decoded events by seq (a seq names one stored event forever) and asks for
    the content of the ones it lacks; a read of 2,000 events then moves a
    fifth of the bytes."""


class SessionKey(Params, kw_only=True, omit_defaults=True):
    """A session of an app, for paging and for bulk reads."""

    user: NonEmpty
    session: NonEmpty
    after_seq: Seq = 0
    """In a bulk read: only this session's events after this seq (how a
    truncated session is continued); ignored as a paging cursor."""


class SessionListParams(Params, kw_only=True):
    """A page of an app's sessions (one user's, given ``user``) in
    ``(user, session)`` order, starting after the ``after`` cursor: the
    previous page's ``next``."""

    app: NonEmpty
    user: NonEmpty | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_SINCE_LIMIT)] = DEFAULT_SINCE_LIMIT
    after: SessionKey | None = None
    scoped_state: bool = False
    """Also return the app's state and the state of each user on the page."""
    event_time: bool = False
    """Also return each session's ``last_event_time``."""


class SessionListResult(Result, omit_defaults=True):
    """``next`` is the cursor of the following page, null on the last page.
    ``app_state`` and ``user_states`` (by user) only with ``scoped_state``."""

    sessions: list[Session]
    next: SessionKey | None
    app_state: dict[str, Any] | None = None
    user_states: dict[str, dict[str, Any]] | None = None


MAX_BULK_SESSIONS = 1000


class SessionsGetParams(Params, kw_only=True):
    """Many sessions of one app, each with its events, in one read: ``recent``,
    ``after_time`` and ``scoped_state`` apply to each session as in
    ``sessions.get``, ``after_seq`` per session in ``sessions``."""

    app: NonEmpty
    sessions: Annotated[list[SessionKey], msgspec.Meta(min_length=1, max_length=MAX_BULK_SESSIONS)]
    recent: Seq | None = None
    after_time: UtcTime | None = None
    scoped_state: bool = False
    event_time: bool = False


class SessionsResult(Result, omit_defaults=True):
    """The sessions found, in the order asked, and the keys of those never
    written (``missing``). One snapshot: every session is read as of the same
    state of the log. All of it fits the reply budget: a session whose events
    do not fit is ``truncated`` with ``next_seq`` (possibly with no events at
    all, once the budget is spent); ask again for those sessions with
    ``after_seq: next_seq``. From the first session whose state (with the
    shared states it carries) does not fit what is left, the keys asked for
    are ``unread`` (absent when there are none): ask again for them."""

    sessions: list[SessionWithEvents]
    missing: list[SessionKey]
    unread: list[SessionKey] | None = None


class SessionDeleteParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty


_S = TypeVar("_S", bound=Session)


def with_event_time(session: _S, wanted: bool) -> _S:
    """``session`` as answered: without its ``last_event_time`` unless the
    caller asked for it (``event_time: true``), so the answers of every other
    caller keep the keys they always had."""
    if wanted or session.last_event_time is None:
        return session
    return msgspec.structs.replace(session, last_event_time=None)
