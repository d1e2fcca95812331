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
* Results always carry every key (no ``omit_defaults``): a reader can rely on
  ``entry["metadata"]`` existing and being ``null`` rather than absent.

No I/O here, and no trio.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, TypeVar

import msgspec

from streamd.errors import invalid_params

__all__ = [
    "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_SINCE_LIMIT",
    "DEFAULT_STALE_AFTER_MS",
    "MAX_SINCE_LIMIT",
    "METADATA_CALLER",
    "METADATA_FINISH_REASON",
    "METADATA_PROXY_BY",
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
    "Session",
    "SessionCreateParams",
    "SessionDeleteParams",
    "SessionGetParams",
    "SessionListParams",
    "SessionListResult",
    "SessionTree",
    "SessionWithEvents",
    "SinceParams",
    "SinceResult",
    "WatchParams",
    "WatchResult",
    "checked",
    "from_us",
    "to_us",
    "validated",
]

DEFAULT_SINCE_LIMIT = 1000
MAX_SINCE_LIMIT = 10_000
DEFAULT_STALE_AFTER_MS = 30_000
DEFAULT_HEARTBEAT_MS = 5_000

# Well-known metadata keys (the log itself is agnostic to keys; these are the
# conventions agent runtimes use, named once so readers need not guess).
METADATA_CALLER = "caller"
METADATA_PROXY_BY = "proxy_by"
METADATA_FINISH_REASON = "finish_reason"

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Seq = Annotated[int, msgspec.Meta(ge=0)]
UtcTime = Annotated[_dt.datetime, msgspec.Meta(tz=True)]
"""An aware datetime; offsets other than UTC are accepted and normalised on write."""

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def to_us(when: _dt.datetime) -> int:
    """Microseconds since the epoch; integer arithmetic so no float rounding."""
    if when.tzinfo is None:
        raise invalid_params("time must carry a timezone (RFC 3339 with Z or an offset)")
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> _dt.datetime:
    # Seconds and microseconds given apart: timedelta(microseconds=...) normalises
    # through a slower path, and this runs once per entry read (30 % of it).
    seconds, micros = divmod(us, 1_000_000)
    return _EPOCH + _dt.timedelta(0, seconds, micros)


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


class Entry(Result):
    """A committed event and the seq the log gave it. Every key is always present;
    ``metadata`` is None for an event appended without metadata (or with ``{}``)."""

    seq: int
    app: str
    user: str
    session: str
    event: Event
    metadata: dict[str, str] | None


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


class AppendResult(Result):
    seq: int
    duplicate: bool


class SinceParams(Params, kw_only=True):
    from_seq: Seq = 0
    filter: Filter | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_SINCE_LIMIT)] = DEFAULT_SINCE_LIMIT


class SinceResult(Result):
    """``next_seq`` is the from_seq for the next page (the last entry's seq, or the
    request's from_seq when nothing matched). ``caught_up`` is true when no further
    matching entry existed when the page was read."""

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
    limit: Annotated[int, msgspec.Meta(ge=1)] | None = None


class BranchesResult(Result):
    branches: list[str]


# --- sessions --------------------------------------------------------------


class SessionCreateParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty | None = None
    state: dict[str, Any] | None = None


class Session(Result, kw_only=True):
    app: str
    user: str
    session: str
    state: dict[str, Any]
    created_at: _dt.datetime
    updated_at: _dt.datetime


class SessionWithEvents(Session, kw_only=True):
    events: list[Entry]


class SessionGetParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty
    after_seq: Seq = 0
    recent: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Only the newest N events (after ``after_seq``), still in seq order."""


class SessionListParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty | None = None


class SessionListResult(Result):
    sessions: list[Session]


class SessionDeleteParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty


# --- leases ----------------------------------------------------------------


class LockAcquireParams(Params, kw_only=True):
    app: NonEmpty
    user: NonEmpty
    session: NonEmpty
    stale_after_ms: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_STALE_AFTER_MS
    heartbeat_ms: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_HEARTBEAT_MS

    def __post_init__(self) -> None:
        # A lease that beats less often than it goes stale is stealable while its
        # holder is healthy; refuse it rather than hand out a lease that lies.
        if self.heartbeat_ms >= self.stale_after_ms:
            raise ValueError("heartbeat_ms must be less than stale_after_ms")


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
    acquired_at: _dt.datetime
    heartbeat_at: _dt.datetime


# --- boots -----------------------------------------------------------------


class BootRecordParams(Params):
    at: UtcTime
    attempted: list[str]


class BootRecordResult(Result):
    id: int


class BootUpdateParams(Params):
    id: int
    attempted: list[str]


class BootRecentParams(Params):
    since: UtcTime


class Boot(Result):
    """``attempted`` is None when the stored list cannot be parsed: a crash-loop
    breaker counts boots, so a damaged row must still be counted, never dropped."""

    id: int
    boot_at: _dt.datetime
    attempted: list[str] | None


class BootRecentResult(Result):
    boots: list[Boot]


class PingParams(Params):
    pass


class Empty(Result):
    pass


_T = TypeVar("_T", bound=msgspec.Struct)

_encoder = msgspec.json.Encoder()


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
