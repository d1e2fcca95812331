"""Connecting to PostgreSQL: the address, the options, the setup of each
connection, and the schema's version (its migrations are
:mod:`~streamd.eventlog.postgres.migrate`).

Nothing here writes a secret: the database is named by :func:`describe` (its
keywords without secrets) and every driver message is :func:`scrub`-bed of
the passwords the address holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.string import TextLoader

from streamd.errors import SOURCE_UNAVAILABLE, RpcError, invalid_params
from streamd.eventlog.dbtarget import DbTarget, DbTargetError, postgres_target
from streamd.eventlog.postgres.schema import APPLICATION, SCHEMA_VERSION, describe_foreign
from streamd.eventlog.store.backend import Synchronous
from streamd.eventlog.store.outages import scrub

__all__ = [
    "CONNECTION_SETUP",
    "TCP_KEEPALIVES",
    "PostgresOptions",
    "connect",
    "connect_params",
    "describe",
    "refuse_newer",
    "schema_version",
    "scrub",
    "target_of",
]


def _params(conninfo: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        # libpq's parse error can quote the malformed part, password included.
        raise RpcError(
            SOURCE_UNAVAILABLE,
            "the event log database address is not a valid PostgreSQL URL or conninfo",
        ) from None


def describe(conninfo: str) -> str:
    """The database in words, for messages and logs: never a secret (see
    :mod:`streamd.eventlog.dbtarget`, which this defers to)."""
    return f"PostgreSQL database {target_of(conninfo).description}"


def target_of(conninfo: str) -> DbTarget:
    """The connection string classified; an unreadable one is source_unavailable."""
    try:
        return postgres_target(conninfo)
    except DbTargetError as exc:
        raise RpcError(SOURCE_UNAVAILABLE, str(exc)) from None


# --- options and connection setup ------------------------------------------------


@dataclass(frozen=True)
class PostgresOptions:
    synchronous: Synchronous = "FULL"
    """FULL is ``synchronous_commit=on``: an acknowledged append is on the
    server's disk. NORMAL is ``off``: it survives the daemon, not a crash of
    the server (which may lose the last few hundred milliseconds)."""
    schema: str = "streamd"
    """The PostgreSQL schema that holds the log's tables."""
    lease_clock: Literal["database", "caller"] = "database"
    connect_timeout_s: int = 5
    """Used when the conninfo and ``PGCONNECT_TIMEOUT`` give none."""
    reconnect_min_s: float = 0.05
    reconnect_max_s: float = 5.0
    idle_check_s: float = 1.0
    """A call after this long without one first checks its connection with a
    round trip (see :mod:`~streamd.eventlog.store.reconnecting`)."""
    application_name: str = "streamd"
    """Used when the conninfo and ``PGAPPNAME`` give none (it shows in
    ``pg_stat_activity``)."""
    unresponsive_s: float = 2.0
    """How long a call that was cancelled (or interrupted by close) may go on
    after its server was asked to cancel it: past that the server is taken to be
    unresponsive (stopped, partitioned away), the connection is cut
    (:meth:`PostgresStore.sever`) and the call fails at once; a write in flight
    then may or may not have committed, as the error says."""
    tcp_user_timeout_ms: int = 30_000
    """``tcp_user_timeout`` of every connection over TCP, used when the conninfo
    gives none: how long sent data may go unacknowledged before the connection
    counts as broken (a network partition fails a call within it, not after the
    kernel's retransmission timeout of a quarter of an hour)."""


def _load_json_as_text(conn: psycopg.Connection[Any], opts: PostgresOptions) -> None:
    # Content is copied to the wire as the stored text; psycopg would parse it.
    conn.adapters.register_loader("json", TextLoader)


def _require_utf8(conn: psycopg.Connection[Any], opts: PostgresOptions) -> None:
    # Byte-order comparisons (COLLATE "C") equal SQLite's only on UTF-8 bytes,
    # and SQL_ASCII would store whatever bytes arrive.
    encoding = conn.execute("SHOW server_encoding").fetchone()
    if encoding is None or encoding[0].upper() not in ("UTF8", "UTF-8"):
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"the event log database must use UTF8 encoding, not {encoding and encoding[0]}",
        )


def _speak_utf8(conn: psycopg.Connection[Any], opts: PostgresOptions) -> None:
    # A role's or database's client_encoding (ALTER ROLE ... SET client_encoding
    # = 'LATIN1') is what psycopg encodes every string to: an event holding a
    # character outside it was refused as a bad value (-32602), and a stored one
    # could not be read back. The database is UTF8 (above), so UTF8 converts nothing.
    conn.execute("SET client_encoding = 'UTF8'")


def _read_committed(conn: psycopg.Connection[Any], opts: PostgresOptions) -> None:
    # A write transaction is a plain BEGIN, whose isolation a role's or
    # database's default_transaction_isolation would set: under REPEATABLE READ
    # or SERIALIZABLE, an append waiting for the seq counter that another
    # writer moved failed "could not serialize access" (half the appends of two
    # daemons on one log). Every rule here is written for READ COMMITTED: the
    # counter's row lock orders the writers and each reads the row as committed.
    # A snapshot names its own level (PgSql.snapshot).
    conn.execute("SET default_transaction_isolation = 'read committed'")


def _set_search_path(conn: psycopg.Connection[Any], opts: PostgresOptions) -> None:
    # Our tables first; pg_catalog is always searched.
    conn.execute(pgsql.SQL("SET search_path = {}").format(pgsql.Identifier(opts.schema)))


def _set_synchronous_commit(conn: psycopg.Connection[Any], opts: PostgresOptions) -> None:
    if opts.synchronous not in ("FULL", "NORMAL"):
        raise invalid_params(f"synchronous must be FULL or NORMAL, not {opts.synchronous!r}")
    conn.execute(
        "SET synchronous_commit = " + ("on" if opts.synchronous == "FULL" else "off")
    )


CONNECTION_SETUP: tuple[Callable[[psycopg.Connection[Any], PostgresOptions], None], ...] = (
    _load_json_as_text,
    _require_utf8,
    _speak_utf8,
    _read_committed,
    _set_search_path,
    _set_synchronous_commit,
)


# TCP keepalives, used when the conninfo sets none: an idle connection (a LISTEN,
# a query waiting on a lock) otherwise notices a vanished server only after the
# kernel's default of two hours. libpq ignores them on a Unix socket.
TCP_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                  "keepalives_count": 3}


def connect_params(conninfo: str, opts: PostgresOptions) -> dict[str, Any]:
    """What :func:`connect` adds to ``conninfo``: the defaults it gives none of."""
    given = _params(conninfo)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
        extra["connect_timeout"] = opts.connect_timeout_s
    if "application_name" not in given and not os.environ.get("PGAPPNAME"):
        extra["application_name"] = opts.application_name
    extra.update({k: v for k, v in TCP_KEEPALIVES.items() if k not in given})
    # tcp_user_timeout is libpq 12's (the binary wheel bundles a newer one);
    # an older libpq would refuse the unknown option.
    if "tcp_user_timeout" not in given and psycopg.pq.version() >= 120000:
        extra["tcp_user_timeout"] = opts.tcp_user_timeout_ms
    return extra


def connect(conninfo: str, opts: PostgresOptions) -> psycopg.Connection[Any]:
    """A configured autocommit connection; raises psycopg's errors.

    Credentials come the way every libpq program takes them (the URL or
    conninfo, ``PG*`` environment variables, ``~/.pgpass`` or ``PGPASSFILE``,
    a ``service=`` in ``pg_service.conf``): nothing here reads them. Over TCP
    it has keepalives and a ``tcp_user_timeout`` (:func:`connect_params`)
    unless the conninfo sets its own."""
    conn = psycopg.connect(conninfo, autocommit=True, **connect_params(conninfo, opts))
    try:
        for step in CONNECTION_SETUP:
            step(conn, opts)
    except BaseException:
        conn.close()
        raise
    return conn


def schema_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """Our schema's version; None when there is no ``streamd_meta`` row yet.
    Raises when the schema holds someone else's tables."""
    found = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
        (schema,),
    ).fetchall()
    tables = [r[0] for r in found]
    if "streamd_meta" in tables:
        row = conn.execute(
            pgsql.SQL("SELECT application, version FROM {}.streamd_meta").format(
                pgsql.Identifier(schema)
            )
        ).fetchone()
        if row is not None and row[0] == APPLICATION:
            return int(row[1])
    if not tables:
        return None
    raise RpcError(
        SOURCE_UNAVAILABLE,
        f"schema {schema!r} of the database is not a streamd event log (it holds tables"
        f" {describe_foreign(tables)}); refusing to open it, and it was not changed",
        {"schema": schema},
    )


def refuse_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"event log database has schema version {version}, newer than this streamd"
            f" understands ({SCHEMA_VERSION}); refusing to open it",
        )
