"""The durable event log: append-only, seq-numbered agent-session events.

The layers stack bottom-up, each importing only the ones below it:

* :mod:`~streamd.eventlog.dbtarget` - which database a ``--db`` or
  ``$STREAMD_DB`` names (a file, PostgreSQL, or a refusal), and its
  description without secrets (sans-I/O; :mod:`~streamd.eventlog.postgres.conninfo`
  reads libpq's connection strings for it).
* :mod:`~streamd.eventlog.model` - msgspec Structs for every param and result,
  and the time conversions (sans-I/O).
* :mod:`~streamd.eventlog.filters` - a Filter as SQL conjuncts (sans-I/O).
* :mod:`~streamd.eventlog.store` - the storage core: the three seams
  (``Backend``, ``Runner``, ``ChangeSource``) and the rules both backends share,
  written once over a small connection protocol.
* :mod:`~streamd.eventlog.sqlite` and :mod:`~streamd.eventlog.postgres` - one
  folder per backend, each the only importer of its driver; driver errors stop
  there.
* :mod:`~streamd.eventlog.lease` and :mod:`~streamd.eventlog.watch` - a lease
  and its heartbeat; a watch and its reader.
* :mod:`~streamd.eventlog.opener`, :mod:`~streamd.eventlog.connections`,
  :mod:`~streamd.eventlog.writer`, :mod:`~streamd.eventlog.watch_hub` and
  :mod:`~streamd.eventlog.compaction` - choosing and opening the backend; the
  two connections and their one "not open yet"; the group-commit writer; the
  live watches, their fan-out and the change poller; retention applied and
  space given back.
* :mod:`~streamd.eventlog.requests` and :mod:`~streamd.eventlog.keywords` -
  the operations by params Struct (the wire's way in), and the keyword methods
  over them (the Python way in).
* :mod:`~streamd.eventlog.log` - :class:`EventLog`, the Trio API: the jobs
  above composed, lazy open and close.

* :mod:`~streamd.eventlog.service` - the ``eventlog/*`` JSON-RPC methods over a
  shared :class:`EventLog` (imported by the daemon, not re-exported here, so the
  package does not pull in the RPC layer).
* :mod:`~streamd.eventlog.cli` - ``streamd log``, for people, on the same file.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What the lazy names below resolve to, for type checkers (X as X:
    # an explicit re-export). Kept equal to _EXPORTS by a test.
    from streamd.eventlog.dbtarget import (
        DbTarget as DbTarget,
    )
    from streamd.eventlog.dbtarget import (
        DbTargetError as DbTargetError,
    )
    from streamd.eventlog.dbtarget import (
        resolve_db_path as resolve_db_path,
    )
    from streamd.eventlog.lease import (
        Lease as Lease,
    )
    from streamd.eventlog.lease import (
        new_holder_id as new_holder_id,
    )
    from streamd.eventlog.log import (
        EventLog as EventLog,
    )
    from streamd.eventlog.log import (
        EventLogStats as EventLogStats,
    )
    from streamd.eventlog.model import (
        DEFAULT_WATCH_BUFFER_BYTES as DEFAULT_WATCH_BUFFER_BYTES,
    )
    from streamd.eventlog.model import (
        DEFAULT_WATCH_INTERVAL as DEFAULT_WATCH_INTERVAL,
    )
    from streamd.eventlog.model import (
        AppendBatchParams as AppendBatchParams,
    )
    from streamd.eventlog.model import (
        AppendParams as AppendParams,
    )
    from streamd.eventlog.model import (
        AppendResult as AppendResult,
    )
    from streamd.eventlog.model import (
        Boot as Boot,
    )
    from streamd.eventlog.model import (
        CompactResult as CompactResult,
    )
    from streamd.eventlog.model import (
        Entry as Entry,
    )
    from streamd.eventlog.model import (
        Event as Event,
    )
    from streamd.eventlog.model import (
        Filter as Filter,
    )
    from streamd.eventlog.model import (
        LeaseInfo as LeaseInfo,
    )
    from streamd.eventlog.model import (
        RetentionPolicy as RetentionPolicy,
    )
    from streamd.eventlog.model import (
        Session as Session,
    )
    from streamd.eventlog.model import (
        SessionKey as SessionKey,
    )
    from streamd.eventlog.model import (
        SessionListResult as SessionListResult,
    )
    from streamd.eventlog.model import (
        SessionsResult as SessionsResult,
    )
    from streamd.eventlog.model import (
        SessionTree as SessionTree,
    )
    from streamd.eventlog.model import (
        SessionWithEvents as SessionWithEvents,
    )
    from streamd.eventlog.model import (
        SinceResult as SinceResult,
    )
    from streamd.eventlog.model import (
        StateDelta as StateDelta,
    )
    from streamd.eventlog.model import (
        StateSnapshot as StateSnapshot,
    )
    from streamd.eventlog.sqlite import (
        SCHEMA_VERSION as SCHEMA_VERSION,
    )
    from streamd.eventlog.sqlite import (
        SqliteOptions as SqliteOptions,
    )
    from streamd.eventlog.sqlite import (
        SqliteStore as SqliteStore,
    )
    from streamd.eventlog.store import (
        AppendGroup as AppendGroup,
    )
    from streamd.eventlog.store import (
        Backend as Backend,
    )
    from streamd.eventlog.store import (
        closed_error as closed_error,
    )
    from streamd.eventlog.watch import (
        Watch as Watch,
    )

# Imported on first use (PEP 562): the daemon imports the package for its
# defaults, and a Recall-only process must not pay for SQLite.
_EXPORTS = {
    "AppendBatchParams": "streamd.eventlog.model",
    "AppendGroup": "streamd.eventlog.store",
    "AppendParams": "streamd.eventlog.model",
    "AppendResult": "streamd.eventlog.model",
    "Backend": "streamd.eventlog.store",
    "Boot": "streamd.eventlog.model",
    "DbTarget": "streamd.eventlog.dbtarget",
    "DbTargetError": "streamd.eventlog.dbtarget",
    "CompactResult": "streamd.eventlog.model",
    "DEFAULT_WATCH_BUFFER_BYTES": "streamd.eventlog.model",
    "DEFAULT_WATCH_INTERVAL": "streamd.eventlog.model",
    "Entry": "streamd.eventlog.model",
    "Event": "streamd.eventlog.model",
    "EventLog": "streamd.eventlog.log",
    "EventLogStats": "streamd.eventlog.log",
    "Filter": "streamd.eventlog.model",
    "Lease": "streamd.eventlog.lease",
    "LeaseInfo": "streamd.eventlog.model",
    "RetentionPolicy": "streamd.eventlog.model",
    "SCHEMA_VERSION": "streamd.eventlog.sqlite",
    "Session": "streamd.eventlog.model",
    "SessionKey": "streamd.eventlog.model",
    "SessionListResult": "streamd.eventlog.model",
    "SessionsResult": "streamd.eventlog.model",
    "SessionTree": "streamd.eventlog.model",
    "SessionWithEvents": "streamd.eventlog.model",
    "SinceResult": "streamd.eventlog.model",
    "SqliteOptions": "streamd.eventlog.sqlite",
    "SqliteStore": "streamd.eventlog.sqlite",
    "StateDelta": "streamd.eventlog.model",
    "StateSnapshot": "streamd.eventlog.model",
    "Watch": "streamd.eventlog.watch",
    "closed_error": "streamd.eventlog.store",
    "new_holder_id": "streamd.eventlog.lease",
    "resolve_db_path": "streamd.eventlog.dbtarget",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_WATCH_BUFFER_BYTES",
    "DEFAULT_WATCH_INTERVAL",
    "SCHEMA_VERSION",
    "AppendBatchParams",
    "AppendGroup",
    "AppendParams",
    "AppendResult",
    "Backend",
    "Boot",
    "CompactResult",
    "DbTarget",
    "DbTargetError",
    "Entry",
    "Event",
    "EventLog",
    "EventLogStats",
    "Filter",
    "Lease",
    "LeaseInfo",
    "RetentionPolicy",
    "Session",
    "SessionKey",
    "SessionListResult",
    "SessionTree",
    "SessionWithEvents",
    "SessionsResult",
    "SinceResult",
    "SqliteOptions",
    "SqliteStore",
    "StateDelta",
    "StateSnapshot",
    "Watch",
    "closed_error",
    "new_holder_id",
    "resolve_db_path",
]
