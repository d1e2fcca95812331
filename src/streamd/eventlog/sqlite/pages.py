"""Pages of event rows read by the compiled core on the store's own connection.

An index of the log reads every row once, a page of 10,000 at a time. Read
through APSW, each row is a tuple of eleven Python objects that the
compiled builder takes apart again: about 1.1 us an event under the GIL,
and garbage for the cyclic collector. The compiled core can read the page
itself, into one buffer (``streamd._native.EventPage``), with the GIL
released.

It must do so through APSW's own SQLite (a second SQLite library in the
process would not see this one's POSIX locks on the same file), which
exports no symbols: so the compiled core is loaded into the connection as a
SQLite extension once, which hands it that library's entry points, and then
reads on the connection by its address (``native/src/python/sqlite.rs``).

Rules:

* Only an optimisation: where the compiled core is absent or built from
  other sources, ``STREAMD_NATIVE=0`` is set, the library refuses
  extensions, or the core declines a page (an error, a value of an unusual
  type, text that is not UTF-8), the page is read through APSW as before,
  with the same rows or the same error.
* Loading is allowed for that one call: the connection's
  ``load_extension`` switch (which also governs SQL's ``load_extension()``)
  is off again before anything else runs on it.
* Called where the connection may be used (its worker thread, inside the
  store's boundary), as every other read.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import apsw

from streamd import plain

if TYPE_CHECKING:
    from streamd._native import EventPage

__all__ = ["ENTRY_POINT", "read_page"]

log = logging.getLogger(__name__)

ENTRY_POINT = "sqlite3_streamd_init"

_lock = threading.Lock()
_refused = False  # the library would not load the extension: never tried again

try:
    import streamd._native as _core
except ImportError:  # built without a Rust toolchain
    _usable = False
else:
    _usable = hasattr(_core, "read_event_page")


def _loaded(db: apsw.Connection) -> bool:
    """Whether the compiled core has the library's entry points, loading it
    into ``db`` the first time."""
    global _refused
    if _core.sqlite_extension_loaded():
        return True
    with _lock:
        if _refused:
            return False
        if _core.sqlite_extension_loaded():
            return True
        try:
            db.enable_load_extension(True)
            try:
                db.load_extension(_core.__file__, ENTRY_POINT)
            finally:
                db.enable_load_extension(False)
        except (apsw.Error, AttributeError, OSError) as exc:
            _refused = True
            log.info("event-log pages are read through APSW: the compiled core "
                     "could not be loaded as a SQLite extension (%s)", exc)
            return False
    return bool(_core.sqlite_extension_loaded())


def read_page(db: apsw.Connection, sql: str, from_seq: int, limit: int) -> EventPage | None:
    """The page of ``sql`` (``reads.EVENT_ROWS_AFTER``) read by the compiled
    core on ``db``, or None where the caller reads it through APSW."""
    if not _usable or plain.asked() or not _loaded(db):
        return None
    return _core.read_event_page(db.sqlite3_pointer(), sql, from_seq, limit)
