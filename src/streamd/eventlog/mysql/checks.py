"""``streamd log verify`` on a MySQL log: the shared checks of
:mod:`streamd.eventlog.store.verify` on a connection of their own (the schema is
never migrated by a check), with the driver's errors translated here."""

from __future__ import annotations

from typing import Any

import MySQLdb

from streamd.eventlog.mysql.store import MysqlStore
from streamd.eventlog.store import verify as checks

__all__ = ["verify"]


def verify(url: str) -> checks.Report:
    store = MysqlStore.open(url, migrate=False)
    try:
        conn = store.connection

        def query(sql: str) -> list[Any]:
            cursor = conn.cursor()
            cursor.execute(sql)
            return list(cursor.fetchall() or ())

        try:
            # The snapshot the checks begin is REPEATABLE READ's; the
            # connection's own level is READ COMMITTED.
            query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return checks.verify(query, "mysql", (MySQLdb.Error,))
        except MySQLdb.Error as exc:
            raise checks.unreadable(exc) from None
    finally:
        store.close()
