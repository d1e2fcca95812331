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
        return checks.verify(db.execute, "sqlite", (apsw.Error,))
    except apsw.Error as exc:
        raise checks.unreadable(exc) from None
