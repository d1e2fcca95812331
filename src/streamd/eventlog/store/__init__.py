"""The event log's storage core: the seams and the rules both backends share.

Nothing here imports a driver or a backend; the backends import this.

* :mod:`~streamd.eventlog.store.backend` - the three seams: :class:`Backend`
  (the storage operations only), :class:`Runner` (a backend as the Trio layer
  drives it) and :class:`ChangeSource` (how a backend hears other processes'
  commits).
* :mod:`~streamd.eventlog.store.sql` - the connection as the rules use it
  (statements in, rows out, a dialect), and
  :mod:`~streamd.eventlog.store.operations` - the Backend operations written
  once over it, from the rules by concept: :mod:`.sessions`, :mod:`.state`,
  :mod:`.leases`, :mod:`.boots`, :mod:`.retention`, :mod:`.reads`, :mod:`.branches`.
* :mod:`~streamd.eventlog.store.steps` - what a bounded retention step may do
  and did; :mod:`~streamd.eventlog.store.verify` - the checks of
  ``streamd log verify``.
* :mod:`~streamd.eventlog.store.rows` - values to columns and rows to Structs,
  total on damaged rows; :mod:`~streamd.eventlog.store.rules` - the checks and
  errors every backend gives alike; :mod:`~streamd.eventlog.store.storable` -
  text no database can store (a surrogate code point), refused before any SQL.
* :mod:`~streamd.eventlog.store.online_index` - a migration step that adds an
  index to a table others write, which each server backend builds online.

The backends are :mod:`streamd.eventlog.sqlite` and
:mod:`streamd.eventlog.postgres`, each the only importer of its driver.
"""

from streamd.eventlog.store.backend import (
    DECODED,
    AppendGroup,
    Backend,
    ChangeSource,
    CommitOutcome,
    Committed,
    EventRow,
    EventRows,
    LeaseKey,
    ReadShape,
    Role,
    Runner,
    Shape,
    StoreCall,
    Synchronous,
    closed_error,
)

__all__ = [
    "DECODED",
    "AppendGroup",
    "Backend",
    "ChangeSource",
    "CommitOutcome",
    "Committed",
    "EventRow",
    "EventRows",
    "LeaseKey",
    "ReadShape",
    "Role",
    "Runner",
    "Shape",
    "StoreCall",
    "Synchronous",
    "closed_error",
]
