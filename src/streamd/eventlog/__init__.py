"""The durable event log: append-only, seq-numbered agent-session events.

The layers stack bottom-up, each importing only the ones below it:

* :mod:`~streamd.eventlog.dbtarget` - which database a ``--db`` or
  ``$STREAMD_DB`` names (a file, PostgreSQL, or a refusal), and its
  description without secrets (sans-I/O; :mod:`~streamd.eventlog.conninfo`
  reads libpq's connection strings for it).
* :mod:`~streamd.eventlog.model` - msgspec Structs for every param and result,
  and the time conversions (sans-I/O).
* :mod:`~streamd.eventlog.filters` - a Filter as SQL conjuncts (sans-I/O).
* :mod:`~streamd.eventlog.store` - the storage rules on one APSW connection,
  synchronous, behind the :class:`Backend` protocol; driver errors stop here.
* :mod:`~streamd.eventlog.lease` and :mod:`~streamd.eventlog.watch` - a lease
  and its heartbeat; a watch and its reader.
* :mod:`~streamd.eventlog.log` - :class:`EventLog`, the Trio API: group-commit
  writer, the tasks of watches and leases, retention (``compact`` and its
  background task), lazy open, close.

* :mod:`~streamd.eventlog.service` - the ``eventlog/*`` JSON-RPC methods over a
  shared :class:`EventLog` (imported by the daemon, not re-exported here, so the
  package does not pull in the RPC layer).
* :mod:`~streamd.eventlog.cli` - ``streamd log``, for people, on the same file.
"""

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
    "SCHEMA_VERSION": "streamd.eventlog.store",
    "Session": "streamd.eventlog.model",
    "SessionKey": "streamd.eventlog.model",
    "SessionListResult": "streamd.eventlog.model",
    "SessionsResult": "streamd.eventlog.model",
    "SessionTree": "streamd.eventlog.model",
    "SessionWithEvents": "streamd.eventlog.model",
    "SinceResult": "streamd.eventlog.model",
    "SqliteOptions": "streamd.eventlog.store",
    "SqliteStore": "streamd.eventlog.store",
    "StateDelta": "streamd.eventlog.model",
    "StateSnapshot": "streamd.eventlog.model",
    "Watch": "streamd.eventlog.watch",
    "closed_error": "streamd.eventlog.store",
    "new_holder_id": "streamd.eventlog.lease",
    "resolve_db_path": "streamd.eventlog.log",
}


def __getattr__(name: str):
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
