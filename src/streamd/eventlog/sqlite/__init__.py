"""The event log on SQLite, through APSW: everything that imports ``apsw``.

The public face is the backend's three seams and its options:

* :class:`SqliteStore` - the :class:`~streamd.eventlog.store.backend.Backend`
  (and, opened synchronously, its own inline
  :class:`~streamd.eventlog.store.backend.Runner`);
* :class:`ConnectionRunner` - either of the log's connections as a Runner, and
  :class:`ThreadRunner` - a synchronously opened store on a worker thread;
* :class:`FileChanges` - the :class:`~streamd.eventlog.store.backend.ChangeSource`
  (inotify on the database and its WAL, else a poll);
* :class:`SqliteOptions`, :data:`SCHEMA_VERSION`.

Inside: :mod:`.connection` (opening a file, the busy handler, setup),
:mod:`.schema` (migrations), :mod:`.store`, :mod:`.runner`, :mod:`.changes`,
:mod:`.errors` (driver errors to RPC errors), :mod:`.file_identity` (no answer
from a file that is no longer at the path), :mod:`.backup` and :mod:`.frozen`
(a log on a read-only file system, read as the snapshot it is), :mod:`.lossy_text`
(text that is not UTF-8, read with U+FFFD).
The storage rules both backends share are in :mod:`streamd.eventlog.store`.
"""

from streamd.eventlog.sqlite.changes import FileChanges
from streamd.eventlog.sqlite.connection import SqliteOptions
from streamd.eventlog.sqlite.runner import ConnectionRunner, ThreadRunner
from streamd.eventlog.sqlite.schema import SCHEMA_VERSION
from streamd.eventlog.sqlite.store import SqliteStore

__all__ = [
    "SCHEMA_VERSION",
    "ConnectionRunner",
    "FileChanges",
    "SqliteOptions",
    "SqliteStore",
    "ThreadRunner",
]
