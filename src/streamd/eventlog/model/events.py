"""Events and entries, the filters of a read, and the append, since, watch,
latest-seq and branches methods.

No I/O here, and no trio.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from streamd.eventlog.model.base import (
    DEFAULT_SINCE_LIMIT,
    MAX_SINCE_LIMIT,
    Count,
    NonEmpty,
    Params,
    Result,
    Seq,
    UtcTime,
    check_renderable,
)


class Event(Params, kw_only=True):
    """One agent-session event as the client wrote it.

    ``branch`` and ``invocation_id`` default to the empty string, which is the
    parent session's own turn (branches never report it). ``timestamp`` is filled
    with the append time when omitted, so a stored event always has one.
    """

    id: NonEmpty
    author: str
    content: Any
    branch: str = ""
    invocation_id: str = ""
    timestamp: UtcTime | None = None


class StateDelta(Params, omit_defaults=True):
    """What one append (or a session's creation) sets in each scope of state.

    Each present scope replaces the top-level keys it names; absent or empty
    scopes change nothing (and an all-empty delta is stored as none)."""

    app: dict[str, Any] | None = None
    user: dict[str, Any] | None = None
    session: dict[str, Any] | None = None

    def normalized(self) -> StateDelta | None:
        """This delta without its empty scopes; None when nothing is left."""
        app, user, session = self.app or None, self.user or None, self.session or None
        if app is None and user is None and session is None:
            return None
        return StateDelta(app=app, user=user, session=session)


class Entry(Result, omit_defaults=True):
    """A committed event and the seq the log gave it. Every key of the contract is
    always present (none has a default); ``metadata`` is None for an event
    appended without metadata (or with ``{}``)."""

    seq: int
    app: str
    user: str
    session: str
    event: Event
    metadata: dict[str, str] | None
    damaged: list[str] | None = None
    """Only on a row that could not be fully rendered: the fields given as null
    instead (``event.timestamp``, ``event.content``, ``metadata``,
    ``state_delta``). Omitted on the wire otherwise."""
    state_delta: StateDelta | None = None
    """The state this event set, as it was appended (empty scopes dropped);
    omitted on the wire for an event that set none."""


class SessionTree(Params):
    """The parent session plus every ``<parent>:sub:<anything>`` sub-session."""

    app: NonEmpty
    user: NonEmpty
    parent: NonEmpty


class Filter(Params, kw_only=True):
    """One filter shape for since, watch, latest_seq and branches; all parts AND.

    ``None`` means "no restriction" for every field. ``branch_prefixes`` is an OR
    group; empty strings in it are dropped, and a group left empty matches nothing
    (dropping a blank must never widen a query to everything).
    """

    app: NonEmpty | None = None
    user: NonEmpty | None = None
    session: NonEmpty | None = None
    session_tree: SessionTree | None = None
    branch_prefixes: list[str] | None = None
    author: str | None = None
    author_suffix: str = ""


class AppendParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty
    event: Event
    metadata: dict[str, str] | None = None
    state_delta: StateDelta | None = None
    """Applied to the app's, the user's and the session's state in the
    transaction that appends the event; part of the event's identity (a retry
    with another delta is ``event_conflict``)."""
    expected_seq: Seq | None = None
    """The session's ``last_seq`` as the writer last saw it: the append is
    refused (``stale_session``, nothing written) when the session has moved on
    since, and ``session_not_found`` when it does not exist (0 means "exists,
    with no events yet"). Omitted, the append creates the session if need be.
    Checked after the retry check, so a retry of an event that was appended is
    still ``duplicate``; not part of the event's identity."""

    def __post_init__(self) -> None:
        # Here and not on Event: Event is also built for every entry read.
        check_renderable("event.timestamp", self.event.timestamp)


class AppendResult(Result):
    seq: int
    duplicate: bool


MAX_BATCH_APPENDS = 1000


class AppendBatchParams(Params, kw_only=True):
    """Appends written in order, in one transaction, all or none: the first
    one refused (a conflict, a stale ``expected_seq``, ...) refuses the batch
    with its own error (data adds its ``index``) and nothing of it is written.
    The order is the batch's, so a writer may pipeline one session's events
    (only the first needs ``expected_seq``) where separate requests on one
    connection are served concurrently and may commit in any order."""

    appends: Annotated[
        list[AppendParams], msgspec.Meta(min_length=1, max_length=MAX_BATCH_APPENDS)
    ]


class AppendBatchResult(Result):
    results: list[AppendResult]


class SinceParams(Params, kw_only=True):
    from_seq: Seq = 0
    filter: Filter | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_SINCE_LIMIT)] = DEFAULT_SINCE_LIMIT


class SinceResult(Result):
    """``next_seq`` is the from_seq for the next page (the last entry's seq, or the
    request's from_seq when nothing matched). ``caught_up`` is true when no further
    matching entry existed when the page was read.

    For the JSON-RPC method the store hands each entry over already encoded
    (``msgspec.Raw``, read with ``encoded=True``), which writes the same bytes."""

    entries: list[Entry]
    next_seq: int
    caught_up: bool


class WatchParams(Params, kw_only=True):
    from_seq: Seq = 0
    filter: Filter | None = None


class WatchResult(Result):
    """Sent when a watch ends at shutdown: the last seq it delivered."""

    last_seq: int


class EntryNotification(Result):
    watch: int | str
    entry: Entry


class LatestSeqParams(Params, kw_only=True):
    filter: Filter | None = None


class LatestSeqResult(Result):
    seq: int


class BranchesParams(Params, kw_only=True):
    filter: Filter | None = None
    limit: Count | None = None


class BranchesResult(Result):
    branches: list[str]
