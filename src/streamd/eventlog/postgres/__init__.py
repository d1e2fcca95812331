"""The event log on PostgreSQL, through psycopg 3: everything that imports
``psycopg``, which is an optional extra (``recall-streamd[postgres]``).

The public face is the backend's three seams and its options:

* :class:`PostgresStore` - the :class:`~streamd.eventlog.store.backend.Backend`;
* :class:`PostgresRunner` - a store on its own worker thread, the Runner;
* :class:`PgChanges` - the :class:`~streamd.eventlog.store.backend.ChangeSource`
  (LISTEN/NOTIFY, with a poll while the listener is down);
* :class:`PostgresOptions`.

Inside: :mod:`.conninfo` (libpq connection strings, parsed without the
driver where it can), :mod:`.schema` (the schema and its migrations),
:mod:`.migrate` (how they are run beside other hosts' writes), :mod:`.store`,
:mod:`.runner`, :mod:`.changes`. The names are imported on first use (PEP
562), so that importing :mod:`.conninfo` (which the database target does for
every log) needs no psycopg. The storage rules both backends
share are in :mod:`streamd.eventlog.store`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamd.eventlog.postgres.changes import PgChanges as PgChanges
    from streamd.eventlog.postgres.runner import PostgresRunner as PostgresRunner
    from streamd.eventlog.postgres.store import PostgresOptions as PostgresOptions
    from streamd.eventlog.postgres.store import PostgresStore as PostgresStore

__all__ = ["PgChanges", "PostgresOptions", "PostgresRunner", "PostgresStore"]

_EXPORTS = {
    "PgChanges": "streamd.eventlog.postgres.changes",
    "PostgresOptions": "streamd.eventlog.postgres.store",
    "PostgresRunner": "streamd.eventlog.postgres.runner",
    "PostgresStore": "streamd.eventlog.postgres.store",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
