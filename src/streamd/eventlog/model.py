"""The event log's vocabulary: every param and result as a msgspec Struct.

These types are the contract shared by the Python API, the JSON-RPC methods and
every storage backend, so the rules that hold for all of them live on the fields:

* Params forbid unknown fields: a misspelt filter key must be an invalid_params
  error, never a silently wider query.
* Times are timezone-aware ``datetime``s in UTC. msgspec writes an aware UTC
  datetime as RFC 3339 with a ``Z`` suffix; a naive time on the wire is rejected
  (its meaning would depend on the sender's zone). Storage keeps integer
  microseconds since the Unix epoch, so :func:`to_us` / :func:`from_us` are the only
  conversions.
* Identity strings (app, user, session, event id) are non-empty: an empty one
  could never be matched by a filter, which treats "omitted" and "empty" apart.
* Results always carry every key: a reader can rely on ``entry["metadata"]``
  existing and being ``null`` rather than absent. The one exception is
  :attr:`Entry.damaged`, present only on a damaged row (below), so an intact
  entry has exactly the contract's keys.
* Every time a client sends that the log stores (an event timestamp, a boot's
  ``at``) must be renderable as RFC 3339 in UTC: years 0001-9999 after
  conversion (``9999-12-31T23:59:59-14:00`` is year 10000 in UTC). Anything else
  is refused at append with invalid_params naming the field, because a stored
  time that cannot be rendered would fail every later read that covers it.
* No stored row can make a read fail. A value that cannot be rendered (a time
  outside that range, JSON that does not parse, written by an older streamd or
  by hand) reads as ``null`` and its row is still returned, never skipped: an
  audit log must not hide rows, and a replay must be able to pass them. An entry
  names such fields in ``damaged`` (``["event.timestamp"]``); a session's
  ``state`` and times, a boot's ``boot_at`` and ``attempted`` and a lease's
  times read as ``null``, a value they never have otherwise. The store logs a
  warning for each such row it reads.

State
-----
A session's events may carry a :class:`StateDelta`: top-level keys set in the
app's state (shared by every user of the app), the user's (shared by every
session of that user in the app) and the session's own. A delta replaces each
key it names, whole (a nested object is not merged into, and ``null`` is a
value, not a deletion): what a framework such as ADK does with its
``state_delta``. The log applies a delta in the transaction that appends its
event, so the state and the history never disagree; ``state.get`` reads the
current state, or the state as of any seq (the state when that seq was the
newest).

No I/O here, and no trio.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from streamd.errors import invalid_params

__all__ = [
    "DEFAULT_SINCE_LIMIT",
    "DEFAULT_STALE_AFTER_MS",
    "DEFAULT_WATCH_BUFFER_BYTES",
    "MAX_BATCH_APPENDS",
    "MAX_BULK_SESSIONS",
    "MAX_DERIVED_HEARTBEAT_MS",
    "MAX_INT",
    "MAX_SINCE_LIMIT",
    "MIN_HEARTBEAT_MS",
    "MIN_STALE_AFTER_MS",
    "REPLY_BUDGET_BYTES",
    "TIME_RANGE",
    "AppendBatchParams",
    "AppendBatchResult",
    "AppendParams",
    "AppendResult",
    "Boot",
    "BootRecentParams",
    "BootRecentResult",
    "BootRecordParams",
    "BootRecordResult",
    "BootUpdateParams",
    "BranchesParams",
    "BranchesResult",
    "CompactParams",
    "CompactResult",
    "Empty",
    "Entry",
    "EntryNotification",
    "Event",
    "Filter",
    "LatestSeqParams",
    "LatestSeqResult",
    "LeaseInfo",
    "LockAcquireParams",
    "LockAcquireResult",
    "LockLostNotification",
    "LockReleaseParams",
    "PingParams",
    "RetentionGetParams",
    "RetentionPolicy",
    "RetentionResult",
    "Session",
    "SessionCreateParams",
    "SessionDeleteParams",
    "SessionGetParams",
    "SessionKey",
    "SessionListParams",
    "SessionListResult",
    "SessionTree",
    "SessionWithEvents",
    "SessionsGetParams",
    "SessionsResult",
    "SinceParams",
    "SinceResult",
    "StateDelta",
    "StateGetParams",
    "StateSnapshot",
    "WatchParams",
    "WatchResult",
    "check_renderable",
    "checked",
    "from_us",
    "from_us_or_none",
    "to_us",
    "validated",
    "wire_size",
]

DEFAULT_SINCE_LIMIT = 1000
MAX_SINCE_LIMIT = 10_000
REPLY_BUDGET_BYTES = 4 << 20
"""How many bytes of entries one ``since`` page or ``sessions.get`` answer may
carry on the wire: half the 8 MiB frame limit (``streamd.rpc.framing``), so a reply
is always a frame a client can read. A reply that stops at the budget says how
to continue (``since``: ``caught_up`` false and ``next_seq``; ``sessions.get``:
``truncated`` and ``next_seq``). At least one entry is always returned, so a
reader makes progress even past an entry bigger than the budget."""
DEFAULT_WATCH_BUFFER_BYTES = 4 << 20
# Seconds between change polls while someone watches and inotify is unavailable.
DEFAULT_WATCH_INTERVAL = 0.2
"""What one watch may hold for a consumer that is not reading: over the wire,
its notifications queued on the connection plus what it has read ahead from the
log; in Python, what it has read ahead. (``--watch-buffer-bytes``)"""
DEFAULT_STALE_AFTER_MS = 30_000
MAX_DERIVED_HEARTBEAT_MS = 5_000
"""An omitted heartbeat is a third of the stale window, but at most this."""
MIN_HEARTBEAT_MS = 50
MIN_STALE_AFTER_MS = 150
"""Lease floors: below them a heartbeat is a busy loop on the database, and a
window of a few scheduler hiccups lets a healthy holder look dead."""
MAX_INT = 2**63 - 1
"""SQLite's largest integer. Every integer param is bounded by it, so an
oversized one is invalid_params, never an overflow deep in the driver."""

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
Count = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT)]
Millis = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT)]
UtcTime = Annotated[_dt.datetime, msgspec.Meta(tz=True)]
"""An aware datetime; offsets other than UTC are accepted and normalised on write."""

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MIN_TIME = _dt.datetime.min.replace(tzinfo=_dt.UTC)
_MAX_TIME = _dt.datetime.max.replace(tzinfo=_dt.UTC)
TIME_RANGE = "0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z"


def to_us(when: _dt.datetime) -> int:
    """Microseconds since the epoch; integer arithmetic so no float rounding."""
    if when.tzinfo is None:
        raise invalid_params("time must carry a timezone (RFC 3339 with Z or an offset)")
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> _dt.datetime:
    """The UTC time of a stored value; OverflowError outside years 0001-9999
    (see :func:`from_us_or_none` for reads of rows that may be damaged)."""
    # Seconds and microseconds given apart: timedelta(microseconds=...) normalises
    # through a slower path, and this runs once per entry read (30 % of it).
    seconds, micros = divmod(us, 1_000_000)
    return _EPOCH + _dt.timedelta(0, seconds, micros)


def from_us_or_none(us: Any) -> _dt.datetime | None:
    """:func:`from_us`, or None for a stored value that is no renderable time."""
    try:
        return from_us(us)
    except (OverflowError, TypeError, ValueError):
        return None


def check_renderable(field: str, when: _dt.datetime | None) -> None:
    """Refuse a time that could not be written back as RFC 3339 in UTC."""
    if when is None or when.tzinfo is None:
        return  # absent, or naive (refused elsewhere with its own message)
    if not _MIN_TIME <= when <= _MAX_TIME:
        raise ValueError(
            f"{field} must lie within {TIME_RANGE} once converted to UTC,"
            f" not {when.isoformat()}"
        )


class Params(msgspec.Struct, forbid_unknown_fields=True):
    """Base for everything a client sends: unknown keys are errors."""


class Result(msgspec.Struct):
    """Base for everything the log returns."""


# --- events and entries ---------------------------------------------------


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


# --- append / read ---------------------------------------------------------


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


# --- sessions --------------------------------------------------------------


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


class SessionsResult(Result):
    """The sessions found, in the order asked, and the keys of those never
    written (``missing``). One snapshot: every session is read as of the same
    state of the log. All of it fits the reply budget: a session whose events
    do not fit is ``truncated`` with ``next_seq`` (possibly with no events at
    all, once the budget is spent); ask again for those sessions with
    ``after_seq: next_seq``."""

    sessions: list[SessionWithEvents]
    missing: list[SessionKey]


class SessionDeleteParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty


# --- state -----------------------------------------------------------------


class StateGetParams(Params, kw_only=True):
    """``user`` adds the user's state, ``session`` (which needs ``user``) the
    session's; ``as_of_seq`` reads the state as it was when that seq was the
    newest in the log (every write up to it, none after)."""

    app: NonEmpty
    user: NonEmpty | None = None
    session: NonEmpty | None = None
    as_of_seq: Seq | None = None

    def __post_init__(self) -> None:
        if self.session is not None and self.user is None:
            raise ValueError("state.get of a session needs its user")


class StateSnapshot(Result, kw_only=True):
    """The state of each scope asked for (null for a scope not asked for), and
    ``seq``: the newest seq the state reflects (the request's ``as_of_seq``, or
    the newest seq in the log when read)."""

    seq: int
    app: dict[str, Any]
    user: dict[str, Any] | None
    session: dict[str, Any] | None


# --- retention --------------------------------------------------------------


class RetentionPolicy(Params, kw_only=True):
    """How long an app's history is kept. Every limit is optional; a policy
    with none is no policy (``retention.set`` with none removes it).

    * ``max_age_s``: events whose timestamp is older than this are removed;
    * ``max_events``: each session keeps only its newest N events;
    * ``idle_s``: a session not updated (appended to, or created) for this long
      is removed with its events and its own state.

    What a holder of a live lease or an open watch of this daemon still needs
    is never removed (see :class:`CompactResult`)."""

    app: NonEmpty
    max_age_s: Count | None = None
    max_events: Count | None = None
    idle_s: Count | None = None

    def empty(self) -> bool:
        return self.max_age_s is None and self.max_events is None and self.idle_s is None


class RetentionGetParams(Params, kw_only=True):
    app: NonEmpty | None = None


class RetentionResult(Result):
    policies: list[RetentionPolicy]


class CompactParams(Params, kw_only=True):
    """Apply the retention policies now (of one app, or every app), then give
    the freed space back to the file system: ``vacuum`` "incremental" (the
    default: freed pages are returned, a few thousand per transaction, so
    appends go on meanwhile), "full" (a VACUUM: rewrites the file, which also
    converts a file created before streamd vacuumed incrementally; it needs
    the file's size again in free space and blocks writers while it runs) or
    "none"."""

    app: NonEmpty | None = None
    vacuum: Literal["incremental", "full", "none"] = "incremental"


class CompactResult(Result, kw_only=True):
    """What compaction removed and what the file gave back.

    ``keep_after_seq`` is the newest seq an open watch of this daemon has been
    given (null without watches): no event after it was removed, so every
    watch and every client resuming one still gets what it has not seen.
    ``leased_sessions`` were skipped whole (a live lease's holder drives them).
    Seqs are never given again. ``bytes_before``/``bytes_after`` are the
    database file plus its WAL; ``checkpointed`` says whether the WAL could be
    written back and truncated (a reader of another process can hold it)."""

    events_deleted: int
    sessions_deleted: int
    leased_sessions: int
    keep_after_seq: int | None
    pages_freed: int
    bytes_before: int
    bytes_after: int
    checkpointed: bool


# --- leases ----------------------------------------------------------------


class LockAcquireParams(Params, kw_only=True):
    """``stale_after_ms`` is the requester's promise: "if my heartbeat is older
    than this, consider me dead". It is stored with the lease and judges only
    this lease; it never shortens the window of a lease someone else holds.

    ``heartbeat_ms`` omitted is derived from the window (a third of it, at most
    :data:`MAX_DERIVED_HEARTBEAT_MS`), so a default can never make a valid
    window invalid; after decoding it always holds the interval in use. Only
    explicit values that break the floors are invalid: ``heartbeat_ms`` >=
    :data:`MIN_HEARTBEAT_MS`, ``stale_after_ms`` >= :data:`MIN_STALE_AFTER_MS`
    and at least twice the heartbeat (one missed beat must not make a healthy
    holder stale).
    """

    app: NonEmpty
    user: NonEmpty
    session: NonEmpty
    stale_after_ms: Millis = DEFAULT_STALE_AFTER_MS
    heartbeat_ms: Millis | None = None

    def __post_init__(self) -> None:
        if self.stale_after_ms < MIN_STALE_AFTER_MS:
            raise ValueError(
                f"stale_after_ms must be at least {MIN_STALE_AFTER_MS}, not {self.stale_after_ms}"
            )
        if self.heartbeat_ms is None:
            # >= MIN_HEARTBEAT_MS because the window is >= 3 * MIN_HEARTBEAT_MS.
            self.heartbeat_ms = min(self.stale_after_ms // 3, MAX_DERIVED_HEARTBEAT_MS)
            return
        if self.heartbeat_ms < MIN_HEARTBEAT_MS:
            raise ValueError(
                f"heartbeat_ms must be at least {MIN_HEARTBEAT_MS}, not {self.heartbeat_ms}"
            )
        if self.stale_after_ms < 2 * self.heartbeat_ms:
            # A lease that can go stale between two beats is stealable while its
            # holder is healthy; refuse it rather than hand out a lease that lies.
            raise ValueError(
                f"stale_after_ms ({self.stale_after_ms}) must be at least twice"
                f" heartbeat_ms ({self.heartbeat_ms})"
            )

    @property
    def interval_ms(self) -> int:
        """The heartbeat interval in use (explicit or derived)."""
        assert self.heartbeat_ms is not None
        return self.heartbeat_ms


class LockAcquireResult(Result):
    lock: str
    holder: str


class LockReleaseParams(Params):
    lock: NonEmpty


class LockLostNotification(Result):
    lock: str
    holder: str


class LeaseInfo(Result, kw_only=True):
    """A lease row as stored (for ``streamd log locks`` and diagnostics)."""

    app: str
    user: str
    session: str
    holder: str
    acquired_at: _dt.datetime | None
    heartbeat_at: _dt.datetime | None
    """Null only for a damaged row (as ``acquired_at``)."""
    stale_after_ms: int
    """The window the holder declared: the lease is stale once its heartbeat is
    older than this."""


# --- boots -----------------------------------------------------------------


class BootRecordParams(Params):
    at: UtcTime
    attempted: list[str]

    def __post_init__(self) -> None:
        check_renderable("at", self.at)


class BootRecordResult(Result):
    id: int


class BootUpdateParams(Params):
    id: Annotated[int, msgspec.Meta(ge=-MAX_INT - 1, le=MAX_INT)]
    attempted: list[str]


class BootRecentParams(Params):
    since: UtcTime


class Boot(Result):
    """``attempted`` is None when the stored list cannot be parsed, ``boot_at``
    when the stored time cannot be rendered: a crash-loop breaker counts boots,
    so a damaged row must still be counted, never dropped."""

    id: int
    boot_at: _dt.datetime | None
    attempted: list[str] | None


class BootRecentResult(Result):
    boots: list[Boot]


class PingParams(Params):
    pass


class Empty(Result):
    pass


_T = TypeVar("_T", bound=msgspec.Struct)

_encoder = msgspec.json.Encoder()


def wire_size(value: Any) -> int:
    """Bytes of ``value`` as JSON on the wire; exact, and cheap for entries whose
    content is ``msgspec.Raw`` (about 0.5 us: it is a copy)."""
    return len(_encoder.encode(value))


def checked(cls: type[_T], **fields: Any) -> _T:
    """Build params from Python values and validate them as the wire would."""
    try:
        params = cls(**fields)
    except (TypeError, ValueError) as exc:
        raise invalid_params(str(exc)) from None
    return validated(params)


def validated(params: _T) -> _T:
    """Check a Struct built in Python against the same rules the wire enforces.

    Constructing a Struct does not run its ``Meta`` constraints; decoding does. A
    round trip through JSON is the one check that is exactly the wire's, so the
    Python API and the JSON-RPC methods can never disagree about what is valid.
    """
    try:
        return msgspec.json.decode(_encoder.encode(params), type=type(params))
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise invalid_params(str(exc)) from None
