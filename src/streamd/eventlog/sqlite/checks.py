"""``streamd log verify`` on a SQLite log: the shared checks of
:mod:`streamd.eventlog.store.verify` over this store's connection, with APSW's
errors translated here, where the driver is known."""

from __future__ import annotations

import apsw

from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store import verify as checks

__all__ = ["verify"]


def verify(store: SqliteStore) -> checks.Report:
    db = store.connection
    try:
        # Text that is not UTF-8 (another program's, or a damaged page's),
        # which APSW refuses to decode, is a check's finding as the driver's
        # errors are: it ended verify in a traceback.
        return checks.verify(db.execute, "sqlite", (apsw.Error, UnicodeDecodeError))
    except apsw.Error as exc:
        raise checks.unreadable(exc) from None
