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

The Structs live by domain, in :mod:`~streamd.eventlog.model.base` (limits,
scalar types, time conversion, the bases), ``events``, ``sessions``,
``state``, ``retention``, ``leases`` and ``boots``; this face re-exports
them all, so ``from streamd.eventlog.model import Event`` is the one way in.

No I/O here, and no trio.
"""


from __future__ import annotations

from streamd.eventlog.model.base import (
    DEFAULT_SINCE_LIMIT as DEFAULT_SINCE_LIMIT,
)
from streamd.eventlog.model.base import (
    DEFAULT_STALE_AFTER_MS as DEFAULT_STALE_AFTER_MS,
)
from streamd.eventlog.model.base import (
    DEFAULT_WATCH_BUFFER_BYTES as DEFAULT_WATCH_BUFFER_BYTES,
)
from streamd.eventlog.model.base import (
    DEFAULT_WATCH_INTERVAL as DEFAULT_WATCH_INTERVAL,
)
from streamd.eventlog.model.base import (
    MAX_DERIVED_HEARTBEAT_MS as MAX_DERIVED_HEARTBEAT_MS,
)
from streamd.eventlog.model.base import (
    MAX_ENTRY_BYTES as MAX_ENTRY_BYTES,
)
from streamd.eventlog.model.base import (
    MAX_INT as MAX_INT,
)
from streamd.eventlog.model.base import (
    MAX_SINCE_LIMIT as MAX_SINCE_LIMIT,
)
from streamd.eventlog.model.base import (
    MAX_STATE_BYTES as MAX_STATE_BYTES,
)
from streamd.eventlog.model.base import (
    MIN_HEARTBEAT_MS as MIN_HEARTBEAT_MS,
)
from streamd.eventlog.model.base import (
    MIN_STALE_AFTER_MS as MIN_STALE_AFTER_MS,
)
from streamd.eventlog.model.base import (
    REPLY_BUDGET_BYTES as REPLY_BUDGET_BYTES,
)
from streamd.eventlog.model.base import (
    TIME_RANGE as TIME_RANGE,
)
from streamd.eventlog.model.base import (
    Count as Count,
)
from streamd.eventlog.model.base import (
    Empty as Empty,
)
from streamd.eventlog.model.base import (
    Millis as Millis,
)
from streamd.eventlog.model.base import (
    NonEmpty as NonEmpty,
)
from streamd.eventlog.model.base import (
    Params as Params,
)
from streamd.eventlog.model.base import (
    PingParams as PingParams,
)
from streamd.eventlog.model.base import (
    Result as Result,
)
from streamd.eventlog.model.base import (
    Seq as Seq,
)
from streamd.eventlog.model.base import (
    UtcTime as UtcTime,
)
from streamd.eventlog.model.base import (
    check_renderable as check_renderable,
)
from streamd.eventlog.model.base import (
    checked as checked,
)
from streamd.eventlog.model.base import (
    from_us as from_us,
)
from streamd.eventlog.model.base import (
    from_us_or_none as from_us_or_none,
)
from streamd.eventlog.model.base import (
    to_us as to_us,
)
from streamd.eventlog.model.base import (
    validated as validated,
)
from streamd.eventlog.model.base import (
    wire_size as wire_size,
)
from streamd.eventlog.model.boots import (
    Boot as Boot,
)
from streamd.eventlog.model.boots import (
    BootRecentParams as BootRecentParams,
)
from streamd.eventlog.model.boots import (
    BootRecentResult as BootRecentResult,
)
from streamd.eventlog.model.boots import (
    BootRecordParams as BootRecordParams,
)
from streamd.eventlog.model.boots import (
    BootRecordResult as BootRecordResult,
)
from streamd.eventlog.model.boots import (
    BootUpdateParams as BootUpdateParams,
)
from streamd.eventlog.model.events import (
    MAX_BATCH_APPENDS as MAX_BATCH_APPENDS,
)
from streamd.eventlog.model.events import (
    AppendBatchParams as AppendBatchParams,
)
from streamd.eventlog.model.events import (
    AppendBatchResult as AppendBatchResult,
)
from streamd.eventlog.model.events import (
    AppendParams as AppendParams,
)
from streamd.eventlog.model.events import (
    AppendResult as AppendResult,
)
from streamd.eventlog.model.events import (
    BranchesParams as BranchesParams,
)
from streamd.eventlog.model.events import (
    BranchesResult as BranchesResult,
)
from streamd.eventlog.model.events import (
    Entry as Entry,
)
from streamd.eventlog.model.events import (
    EntryNotification as EntryNotification,
)
from streamd.eventlog.model.events import (
    Event as Event,
)
from streamd.eventlog.model.events import (
    Filter as Filter,
)
from streamd.eventlog.model.events import (
    LatestSeqParams as LatestSeqParams,
)
from streamd.eventlog.model.events import (
    LatestSeqResult as LatestSeqResult,
)
from streamd.eventlog.model.events import (
    SessionTree as SessionTree,
)
from streamd.eventlog.model.events import (
    SinceParams as SinceParams,
)
from streamd.eventlog.model.events import (
    SinceResult as SinceResult,
)
from streamd.eventlog.model.events import (
    StateDelta as StateDelta,
)
from streamd.eventlog.model.events import (
    WatchParams as WatchParams,
)
from streamd.eventlog.model.events import (
    WatchResult as WatchResult,
)
from streamd.eventlog.model.leases import (
    LeaseAcquireParams as LeaseAcquireParams,
)
from streamd.eventlog.model.leases import (
    LeaseAcquireResult as LeaseAcquireResult,
)
from streamd.eventlog.model.leases import (
    LeaseInfo as LeaseInfo,
)
from streamd.eventlog.model.leases import (
    LeaseLostNotification as LeaseLostNotification,
)
from streamd.eventlog.model.leases import (
    LeaseReleaseParams as LeaseReleaseParams,
)
from streamd.eventlog.model.leases import (
    LockAcquireParams as LockAcquireParams,
)
from streamd.eventlog.model.leases import (
    LockAcquireResult as LockAcquireResult,
)
from streamd.eventlog.model.leases import (
    LockLostNotification as LockLostNotification,
)
from streamd.eventlog.model.leases import (
    LockReleaseParams as LockReleaseParams,
)
from streamd.eventlog.model.retention import (
    CompactParams as CompactParams,
)
from streamd.eventlog.model.retention import (
    CompactResult as CompactResult,
)
from streamd.eventlog.model.retention import (
    RetentionGetParams as RetentionGetParams,
)
from streamd.eventlog.model.retention import (
    RetentionPolicy as RetentionPolicy,
)
from streamd.eventlog.model.retention import (
    RetentionResult as RetentionResult,
)
from streamd.eventlog.model.sessions import (
    MAX_BULK_SESSIONS as MAX_BULK_SESSIONS,
)
from streamd.eventlog.model.sessions import (
    Session as Session,
)
from streamd.eventlog.model.sessions import (
    SessionCreateParams as SessionCreateParams,
)
from streamd.eventlog.model.sessions import (
    SessionDeleteParams as SessionDeleteParams,
)
from streamd.eventlog.model.sessions import (
    SessionGetParams as SessionGetParams,
)
from streamd.eventlog.model.sessions import (
    SessionKey as SessionKey,
)
from streamd.eventlog.model.sessions import (
    SessionListParams as SessionListParams,
)
from streamd.eventlog.model.sessions import (
    SessionListResult as SessionListResult,
)
from streamd.eventlog.model.sessions import (
    SessionsGetParams as SessionsGetParams,
)
from streamd.eventlog.model.sessions import (
    SessionsResult as SessionsResult,
)
from streamd.eventlog.model.sessions import (
    SessionWithEvents as SessionWithEvents,
)
from streamd.eventlog.model.sessions import (
    with_event_time as with_event_time,
)
from streamd.eventlog.model.state import (
    StateGetParams as StateGetParams,
)
from streamd.eventlog.model.state import (
    StateSnapshot as StateSnapshot,
)

__all__ = [
    "DEFAULT_SINCE_LIMIT",
    "DEFAULT_STALE_AFTER_MS",
    "DEFAULT_WATCH_BUFFER_BYTES",
    "MAX_BATCH_APPENDS",
    "MAX_BULK_SESSIONS",
    "MAX_DERIVED_HEARTBEAT_MS",
    "MAX_ENTRY_BYTES",
    "MAX_INT",
    "MAX_SINCE_LIMIT",
    "MAX_STATE_BYTES",
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
    "LeaseAcquireParams",
    "LeaseAcquireResult",
    "LeaseInfo",
    "LeaseLostNotification",
    "LeaseReleaseParams",
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
    "with_event_time",
]
