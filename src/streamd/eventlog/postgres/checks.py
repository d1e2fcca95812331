"""``streamd log verify`` on a PostgreSQL log: the shared checks of
:mod:`streamd.eventlog.store.verify` on a connection of their own (the schema is
never migrated by a check), with psycopg's errors translated here."""

from __future__ import annotations

from typing import Any

import psycopg

from streamd.eventlog.postgres.store import PostgresStore
from streamd.eventlog.store import verify as checks

__all__ = ["verify"]


def verify(conninfo: str) -> checks.Report:
    store = PostgresStore.open(conninfo, migrate=False)
    try:
        conn = store.connection

        def query(sql: str) -> list[Any]:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []  # BEGIN has no rows

        try:
            return checks.verify(query, "postgres", (psycopg.Error,))
        except psycopg.Error as exc:
            raise checks.unreadable(exc) from None
    finally:
        store.close()
