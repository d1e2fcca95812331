"""Storage for the event log: synchronous, typed, and no driver error gets out.

* :mod:`~streamd.eventlog.store.backend` - the :class:`Backend` protocol (the
  storage operations only) and :class:`Runner` (a backend as the Trio layer
  drives it).
* :mod:`~streamd.eventlog.store.schema` - the SQLite schema, its migrations, and
  the refusal of a database that is newer or not ours.
* :mod:`~streamd.eventlog.store.connection` - opening a connection: the file,
  :class:`SqliteOptions`, the busy handler, the setup steps.
* :mod:`~streamd.eventlog.store.rows` - values to columns and rows to Structs,
  total on damaged rows.
* :mod:`~streamd.eventlog.store.sqlite` - :class:`SqliteStore`, the storage rules
  on one APSW connection.

Nothing here imports Trio; the store meets it only through ``apsw.aio``.
"""

from streamd.eventlog.store.backend import (
    AppendGroup,
    Backend,
    CommitOutcome,
    Committed,
    Runner,
    closed_error,
)
from streamd.eventlog.store.connection import SqliteOptions, Synchronous
from streamd.eventlog.store.schema import SCHEMA_VERSION
from streamd.eventlog.store.sqlite import SqliteStore

__all__ = [
    "SCHEMA_VERSION",
    "AppendGroup",
    "Backend",
    "CommitOutcome",
    "Committed",
    "Runner",
    "SqliteOptions",
    "SqliteStore",
    "Synchronous",
    "closed_error",
]
