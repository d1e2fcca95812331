"""Migrating the PostgreSQL schema while other hosts go on appending to it.

A newer streamd that opens an older log brings it to :data:`SCHEMA_VERSION`
one step (an entry of :data:`~streamd.eventlog.postgres.schema.MIGRATIONS`)
at a time, each step's new version written by the transaction that completes
it: a migration cut short is taken up at the step where it stopped.

* **An index is built concurrently.** A step that adds one
  (:class:`~streamd.eventlog.store.online_index.OnlineIndex`) runs ``CREATE
  INDEX CONCURRENTLY``, whose locks exclude no writer; a plain ``CREATE
  INDEX`` takes a SHARE lock for the whole build, and every append of every
  host waited for it (about 2.5 s at a million events). It cannot run in a
  transaction block, so it runs alone in autocommit, and a transaction after
  it checks that the index is valid before it moves the version.
* **A build cut short leaves an INVALID index**, which writes keep up to date
  and no read uses. The next opener drops it (concurrently as well) and builds
  it again; one that finds it valid (the build finished, the version had not
  moved) only moves the version.
* **Openers take turns by an advisory lock held by the session**
  (:data:`~streamd.eventlog.postgres.schema.MIGRATION_LOCK`, the lock that
  earlier streamds took for their one transaction), across the step's
  transactions. It is asked for with ``pg_try_advisory_lock`` again and
  again, never waited for in ``pg_advisory_lock``: a statement waiting there
  holds a snapshot, a concurrent build waits for every older snapshot to
  end before it finishes, and the two would wait for each other until the
  deadlock detector cancelled one of them, the build as likely as not.
* **A log that does not exist yet is made in one transaction**, its indexes
  built plainly: nobody can see its tables before it commits, and a
  concurrent build would only wait for every older transaction in the
  database, which may be another application's.
* **A migration has no time limit of the database's.** A role's or
  database's ``statement_timeout`` or ``lock_timeout`` (an application's role
  often has them) cancelled a build that outlasted it (a big log, an older
  transaction to wait out) at every open: built again, cancelled again, the
  log never opened. The migration's session sets both to 0, and back to the
  database's once it ends, for the calls the connection then serves.
* An opener that finds the schema current takes no lock and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql as pgsql

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.postgres.connection import refuse_newer, schema_version
from streamd.eventlog.postgres.schema import (
    APPLICATION,
    MIGRATION_LOCK,
    MIGRATIONS,
    SCHEMA_VERSION,
    migration_sql,
)
from streamd.eventlog.store.online_index import OnlineIndex

__all__ = ["Pause", "migrate_schema"]

Pause = Callable[[float], None]
"""How an opener waits between two asks for the migration lock (tests see the waits)."""

_FIRST_ASK_S = 0.01
_LAST_ASK_S = 0.5
"""The waits between asks double from the first to the last: an opener behind
a short migration goes on within milliseconds, one behind an index build asks
twice a second."""


def migrate_schema(conn: psycopg.Connection[Any], schema: str, pause: Pause = time.sleep) -> None:
    """Bring our schema to :data:`SCHEMA_VERSION`, creating it when absent.
    ``conn`` is an autocommit connection; raises psycopg's errors, and
    :class:`RpcError` for a schema that is someone else's or newer."""
    version = schema_version(conn, schema)
    if version is not None:
        refuse_newer(version)
        if version == SCHEMA_VERSION:
            return
    with _no_time_limits(conn), _turn(conn, pause):
        version = _created(conn, schema)
        refuse_newer(version)
        ident = pgsql.Identifier(schema)
        for v in range(version, SCHEMA_VERSION):
            step = MIGRATIONS[v]
            if isinstance(step, OnlineIndex):
                _build(conn, schema, step)
            with conn.transaction():
                if isinstance(step, OnlineIndex):
                    _require_valid(conn, schema, step, v)
                else:
                    conn.execute(pgsql.SQL("SET LOCAL search_path = {}").format(ident))
                    conn.execute(step.encode())
                conn.execute(
                    pgsql.SQL("UPDATE {}.streamd_meta SET version = %s").format(ident), (v + 1,)
                )


@contextmanager
def _no_time_limits(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The session without the database's statement and lock timeouts
    (see the module's text), until the block ends."""
    conn.execute("SET statement_timeout = 0")
    conn.execute("SET lock_timeout = 0")
    try:
        yield
    finally:
        if not conn.broken and not conn.closed:
            conn.execute("RESET statement_timeout")
            conn.execute("RESET lock_timeout")


@contextmanager
def _turn(conn: psycopg.Connection[Any], pause: Pause) -> Iterator[None]:
    """The migration lock, held by this session until the block ends."""
    wait = _FIRST_ASK_S
    while not _ask(conn):
        pause(wait)
        wait = min(wait * 2, _LAST_ASK_S)
    try:
        yield
    finally:
        # A session that is gone has let go of it already (the server did).
        if not conn.broken and not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


def _ask(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATION_LOCK,)).fetchone()
    return bool(row and row[0])


def _created(conn: psycopg.Connection[Any], schema: str) -> int:
    """The schema's version; a log that does not exist is made whole, in one
    transaction, and is then current."""
    with conn.transaction():
        version = schema_version(conn, schema)
        if version is not None:
            return version
        ident = pgsql.Identifier(schema)
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        if exists.fetchone() is None:
            conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(
            pgsql.SQL(
                "CREATE TABLE {}.streamd_meta (one boolean PRIMARY KEY DEFAULT true"
                " CHECK (one), application text NOT NULL, version integer NOT NULL)"
            ).format(ident)
        )
        conn.execute(pgsql.SQL("SET LOCAL search_path = {}").format(ident))
        for v in range(SCHEMA_VERSION):
            conn.execute(migration_sql(v).encode())
        conn.execute(
            pgsql.SQL("INSERT INTO {}.streamd_meta (application, version) VALUES (%s, %s)")
            .format(ident),
            (APPLICATION, SCHEMA_VERSION),
        )
        return SCHEMA_VERSION


def _index_valid(conn: psycopg.Connection[Any], schema: str, name: str) -> bool | None:
    """Whether the index is usable; None when there is none."""
    row = conn.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    ).fetchone()
    return None if row is None else bool(row[0])


def _build(conn: psycopg.Connection[Any], schema: str, step: OnlineIndex) -> None:
    found = _index_valid(conn, schema, step.name)
    if found:
        return  # built by an opener cut short before it moved the version
    ident, name = pgsql.Identifier(schema), pgsql.Identifier(step.name)
    if found is False:
        conn.execute(pgsql.SQL("DROP INDEX CONCURRENTLY {}.{}").format(ident, name))
    conn.execute(
        pgsql.SQL("CREATE INDEX CONCURRENTLY {} ON {}.{} " + step.column_list).format(
            name, ident, pgsql.Identifier(step.table)
        )
    )


def _require_valid(conn: psycopg.Connection[Any], schema: str, step: OnlineIndex,
                   version: int) -> None:
    if not _index_valid(conn, schema, step.name):
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"index {step.name} of the event log is missing or invalid right after it was"
            f" built (was it dropped meanwhile?); the schema stays at version {version},"
            " and the next open builds it again",
        )
