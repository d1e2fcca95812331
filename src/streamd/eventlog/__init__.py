"""The durable event log: append-only, seq-numbered agent-session events.

The layers stack bottom-up, each importing only the ones below it:

* :mod:`~streamd.eventlog.model` - msgspec Structs for every param and result,
  and the time conversions (sans-I/O).
* :mod:`~streamd.eventlog.filters` - a Filter as SQL conjuncts (sans-I/O).
* :mod:`~streamd.eventlog.store` - the storage rules on one APSW connection,
  synchronous, behind the :class:`Backend` protocol; driver errors stop here.
* :mod:`~streamd.eventlog.lease` and :mod:`~streamd.eventlog.watch` - a lease
  and its heartbeat; a watch and its reader.
* :mod:`~streamd.eventlog.log` - :class:`EventLog`, the Trio API: group-commit
  writer, the tasks of watches and leases, lazy open, close.

* :mod:`~streamd.eventlog.service` - the ``eventlog/*`` JSON-RPC methods over a
  shared :class:`EventLog` (imported by the daemon, not re-exported here, so the
  package does not pull in the RPC layer).
* :mod:`~streamd.eventlog.cli` - ``streamd log``, for people, on the same file.
"""

from streamd.eventlog.lease import Lease, new_holder_id
from streamd.eventlog.log import (
    DEFAULT_WATCH_INTERVAL,
    EventLog,
    EventLogStats,
    resolve_db_path,
)
from streamd.eventlog.model import (
    DEFAULT_WATCH_BUFFER_BYTES,
    AppendParams,
    AppendResult,
    Boot,
    Entry,
    Event,
    Filter,
    LeaseInfo,
    Session,
    SessionTree,
    SessionWithEvents,
    SinceResult,
)
from streamd.eventlog.store import (
    SCHEMA_VERSION,
    Backend,
    SqliteOptions,
    SqliteStore,
    closed_error,
)
from streamd.eventlog.watch import Watch

__all__ = [
    "DEFAULT_WATCH_BUFFER_BYTES",
    "DEFAULT_WATCH_INTERVAL",
    "SCHEMA_VERSION",
    "AppendParams",
    "AppendResult",
    "Backend",
    "Boot",
    "Entry",
    "Event",
    "EventLog",
    "EventLogStats",
    "Filter",
    "Lease",
    "LeaseInfo",
    "Session",
    "SessionTree",
    "SessionWithEvents",
    "SinceResult",
    "SqliteOptions",
    "SqliteStore",
    "Watch",
    "closed_error",
    "new_holder_id",
    "resolve_db_path",
]
