"""The synchronous PostgreSQL store: the storage rules of the event log, on psycopg 3.

One :class:`PostgresStore` wraps one connection (autocommit; every unit of work
opens its own ``BEGIN``/``COMMIT``), and is a
:class:`~streamd.eventlog.store.backend.Backend` with the same results as the
SQLite store: the contract tests in ``tests/test_eventlog_store.py`` run both.
No ``psycopg`` exception leaves it (:func:`_translated`), and no message it
writes names the password of the database: every driver message is scrubbed of
it, and the database is named by :func:`describe` (its keywords without secrets) only.

Rules kept here, beyond the SQLite store's
-------------------------------------------
* **Commit-ordered seq.** An append locks the one row of ``seq_counter``
  (``SELECT ... FOR UPDATE``), numbers its events from it, and writes the new
  newest seq back in the same transaction (see
  :mod:`~streamd.eventlog.store.pg_schema` for why a sequence would not do).
  Appenders on any number of hosts commit one after another in seq order, and
  a reader that sees seq N+1 sees N. Group commit makes the lock cheap: the
  log's single writer sends everything queued as one transaction, so two
  daemons take turns per batch, not per event.
* **A batch costs a handful of statements, not a handful per event.** The
  duplicate check is one ``event_id = ANY(...)`` query; the numbering, the
  duplicate and conflict decisions, ``expected_seq`` and the groups' all-or-none
  are decided in Python (:class:`_Plan`); sessions and events are then written
  with one ``unnest`` insert each, and the counter with its ``pg_notify`` with
  one more. Should the database still refuse something (a value no check here
  foresaw), the transaction is rolled back and the batch is written again one
  event per savepoint, so that one event fails alone, as on SQLite.
* **One notification per committed batch** on the schema's channel
  (:func:`~streamd.eventlog.store.pg_schema.notify_channel`, :data:`NOTIFY_CHANNEL`
  for the default schema), payload the new newest seq, sent inside the
  transaction (PostgreSQL delivers it only if and when it commits). Watchers
  on every host wake on it.
* **Leases use the database's clock.** With ``lease_clock="database"`` (the
  default) a lease's heartbeat is stamped, and judged stale, by
  ``clock_timestamp()`` on the server, so hosts whose clocks disagree still
  agree on who holds what; ``now_us`` is ignored for leases. ``"caller"`` uses
  ``now_us`` as the SQLite store does (for tests that move time by hand).
  Taking a stale lease is the same conditional update on the old holder and
  its heartbeat; a heartbeat matching no row means the lease was stolen.
* **Outages.** A connection that breaks is dropped; the next operation
  reconnects, and while the database stays unreachable, attempts back off
  (``reconnect_min_s`` doubling to ``reconnect_max_s``) and calls in between fail
  at once with ``source_unavailable`` saying so, instead of each waiting out a
  connect timeout. An append whose connection broke before the commit was
  acknowledged may or may not have committed: the error says so, and a retry
  with the same event id is answered ``duplicate: true`` if it had. An
  acknowledged append was committed with ``synchronous_commit=on`` (the
  default, ``synchronous="FULL"``): it is on the server's disk.

Driver and dispatch (measured, ``bench/eventlog_pg_bench.py --dispatch``)
--------------------------------------------------------------------------
psycopg 3 is the standard driver, but its async API needs asyncio and the
daemon is Trio. The store therefore uses psycopg's synchronous API, one
connection per role, each driven from Trio by a worker thread one call at a
time (:class:`~streamd.eventlog.pg_runner.PostgresRunner`); a cancelled call
sends the server a cancel request for its statement. The alternatives were
measured against it: the reason is in the dependency table of docs/install.md
and in :mod:`~streamd.eventlog.pg_runner`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.string import TextLoader

from streamd.errors import (
    EVENT_CONFLICT,
    INVALID_PARAMS,
    SOURCE_UNAVAILABLE,
    STALE_SESSION,
    RpcError,
    invalid_params,
)
from streamd.eventlog import filters
from streamd.eventlog.dbtarget import DbTarget, DbTargetError, postgres_target
from streamd.eventlog.model import (
    AppendParams,
    AppendResult,
    Boot,
    Filter,
    LeaseInfo,
    RetentionPolicy,
    Session,
    SessionKey,
    SessionListResult,
    SessionsResult,
    SessionWithEvents,
    SinceResult,
    StateDelta,
    StateSnapshot,
    wire_size,
)
from streamd.eventlog.retention import Bounds, Step
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.backend import AppendGroup, CommitOutcome, Committed, closed_error
from streamd.eventlog.store.connection import Synchronous
from streamd.eventlog.store.pg_schema import (
    APPLICATION,
    MIGRATION_LOCK,
    NOTIFY_CHANNEL,
    SCHEMA_VERSION,
    describe_foreign,
    migration_sql,
    notify_channel,
)

__all__ = [
    "NOTIFY_CHANNEL",
    "PostgresOptions",
    "PostgresStore",
    "connect",
    "describe",
    "scrub",
    "target_of",
]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

MAX_SEQ = 2**63 - 1
_DB_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
"""The database's clock in microseconds: what leases are stamped and judged by."""
_READ_PAGE = 1000
"""Rows fetched per query by reads that have no limit of their own
(``sessions.get`` of a long session), so a read cut by its byte budget never
loads what it leaves out."""


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


def scrub(message: str, secrets: Sequence[str]) -> str:
    """``message`` with every secret replaced (libpq does not quote passwords,
    but a message built from a malformed conninfo could), on one line: libpq
    adds a tab-indented hint line, and a CLI error or a log entry is one line."""
    for s in secrets:
        if s:
            message = message.replace(s, "***")
    return re.sub(r"\s*\n\s*", " ", message.strip())


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


def _schema_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
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


def migrate_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Bring our schema to :data:`SCHEMA_VERSION`, creating it when absent; one
    transaction, serialized against other openers by an advisory lock."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        version = _schema_version(conn, schema)
        ident = pgsql.Identifier(schema)
        if version is None:
            exists = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
            ).fetchone()
            if exists is None:
                conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(ident))
            conn.execute(
                pgsql.SQL(
                    "CREATE TABLE {}.streamd_meta (one boolean PRIMARY KEY DEFAULT true"
                    " CHECK (one), application text NOT NULL, version integer NOT NULL)"
                ).format(ident)
            )
            conn.execute(
                pgsql.SQL("INSERT INTO {}.streamd_meta (application, version) VALUES (%s, 0)")
                .format(ident),
                (APPLICATION,),
            )
            version = 0
        _refuse_newer(version)
        if version == SCHEMA_VERSION:
            return
        conn.execute(pgsql.SQL("SET LOCAL search_path = {}").format(ident))
        for v in range(version, SCHEMA_VERSION):
            conn.execute(migration_sql(v).encode())
        conn.execute("UPDATE streamd_meta SET version = %s", (SCHEMA_VERSION,))


def _refuse_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"event log database has schema version {version}, newer than this streamd"
            f" understands ({SCHEMA_VERSION}); refusing to open it",
        )


# --- error translation -----------------------------------------------------------


def _translated(
    fn: Callable[Concatenate[PostgresStore, _P], _T],
) -> Callable[Concatenate[PostgresStore, _P], _T]:
    """The storage boundary: no psycopg exception escapes a decorated method,
    and a broken connection is dropped so the next call reconnects."""

    @functools.wraps(fn)
    def wrapper(store: PostgresStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if store._aborted or store._closed:
            raise closed_error()
        store._ensure_connected()
        try:
            return fn(store, *args, **kwargs)
        except psycopg.Error as exc:
            raise store._translate(exc) from None

    return wrapper


# --- the plan of one batch -----------------------------------------------------------


@dataclass
class _Planned:
    """One event the batch will insert, in :data:`rows.ENTRY_COLUMNS` order plus
    its digest, and its state delta."""

    row: tuple[Any, ...]
    digest: bytes
    delta: StateDelta | None


_MISSING = object()


@dataclass
class _Plan:
    """A batch decided in Python before anything is written: which events are
    new and their seqs, which are duplicates or conflicts, what ``expected_seq``
    says. ``mark``/``undo`` roll a refused group (or, in the one-by-one path, a
    refused event) back out of the plan, as a savepoint would."""

    last_seq: int
    known: dict[str, tuple[int, bytes]]
    """event id -> (seq, digest), stored or planned in this batch."""
    session_seq: dict[tuple[str, str, str], int | None]
    """sessions.last_seq of the sessions ``expected_seq`` asks about (None: no
    such session), moved along by the planned events."""
    events: list[_Planned] = field(default_factory=list)
    _undo: list[tuple[dict[Any, Any], Any, Any]] = field(default_factory=list)

    def mark(self) -> tuple[int, int, int]:
        return self.last_seq, len(self.events), len(self._undo)

    def undo(self, mark: tuple[int, int, int]) -> None:
        self.last_seq, n_events, n_undo = mark
        del self.events[n_events:]
        while len(self._undo) > n_undo:
            d, key, old = self._undo.pop()
            if old is _MISSING:
                d.pop(key, None)
            else:
                d[key] = old

    def _set(self, d: dict[Any, Any], key: Any, value: Any) -> None:
        self._undo.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    def add(self, item: rows.Prepared) -> AppendResult:
        p, ev = item.params, item.params.event
        seen = self.known.get(ev.id)
        if seen is not None:
            seq, digest = seen
            if digest == item.digest:
                return AppendResult(seq=seq, duplicate=True)
            raise RpcError(
                EVENT_CONFLICT,
                f"event {ev.id!r} was already appended with different content (seq {seq})",
                {"event_id": ev.id, "seq": seq},
            )
        _refuse_nul(item)
        key = (p.app, p.user, p.session)
        if p.expected_seq is not None:
            found = self.session_seq.get(key)
            if found is None:
                raise rules.not_found(*key)
            if found != p.expected_seq:
                raise _stale(p.session, p.expected_seq, found)
        self.last_seq += 1
        seq = self.last_seq
        self._set(self.known, ev.id, (seq, item.digest))
        if key in self.session_seq:
            self._set(self.session_seq, key, seq)
        self.events.append(
            _Planned(
                (seq, p.app, p.user, p.session, ev.id, ev.invocation_id, ev.author, ev.branch,
                 item.event_time, item.content, item.metadata, item.state_delta_text),
                item.digest,
                item.state_delta,
            )
        )
        return AppendResult(seq=seq, duplicate=False)


def _refuse_nul(item: rows.Prepared) -> None:
    """PostgreSQL text cannot hold U+0000 (SQLite's can): refused as the
    database would refuse it, before anything is sent. JSON texts escape it."""
    p, ev = item.params, item.params.event
    for name, value in (
        ("app", p.app), ("user", p.user), ("session", p.session), ("event.id", ev.id),
        ("event.author", ev.author), ("event.branch", ev.branch),
        ("event.invocation_id", ev.invocation_id),
    ):
        if "\x00" in value:
            raise invalid_params(
                f"event rejected by the database: {name} contains U+0000, which PostgreSQL"
                " text cannot store"
            )


_REFUSALS = (RpcError, psycopg.DataError, psycopg.IntegrityError, UnicodeEncodeError)
"""What the database (or a state merge) may still refuse of one event."""


class _Rewrite(Exception):
    """The bulk write was refused by the database (or by a state merge) for one
    event: write the batch again one event per savepoint."""


# --- the store -----------------------------------------------------------------------


class PostgresStore:
    """The event log on one psycopg connection; see the module docstring."""

    def __init__(self, conninfo: str, options: PostgresOptions | None = None) -> None:
        self._conninfo = conninfo
        self._opts = options or PostgresOptions()
        target = target_of(conninfo)
        self._secrets = list(target.secrets)  # password, sslpassword and the like
        self._where = f"PostgreSQL database {target.description}"
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()  # the connection slot, between worker and interrupt
        self._severed: psycopg.Connection[Any] | None = None  # cut by sever(): replace it
        self._closed = False
        self._aborted = False
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""
        self._db_clock = self._opts.lease_clock == "database"
        self._channel = notify_channel(self._opts.schema)

    # -- lifecycle --

    @classmethod
    def open(
        cls, conninfo: str, options: PostgresOptions | None = None, *, migrate: bool = True
    ) -> PostgresStore:
        """Connect (and migrate, for the writer); an unreachable database or a
        schema that is not ours fails the open with source_unavailable."""
        store = cls(conninfo, options)
        try:
            conn = connect(conninfo, store._opts)
            try:
                if migrate:
                    migrate_schema(conn, store._opts.schema)
                else:
                    version = _schema_version(conn, store._opts.schema)
                    _refuse_newer(version or 0)
                    if version != SCHEMA_VERSION:
                        raise RpcError(
                            SOURCE_UNAVAILABLE,
                            f"the event log schema in the {store._where} is at version"
                            f" {version or 0}, expected {SCHEMA_VERSION}; open it as a"
                            " writer first",
                        )
            except BaseException:
                conn.close()
                raise
        except psycopg.Error as exc:
            raise store._translate(exc, connecting=True) from None
        store._conn = conn
        return store

    def interrupt(self) -> None:
        """Abort what the connection is doing, for close; callable from any
        thread and never blocking it: the cancel request goes out from a thread
        of its own. Every later call fails with ``closed``."""
        self._aborted = True
        self.cancel_running()

    def cancel_running(self) -> None:
        """Ask the server to cancel the statement running now, if any (for a
        cancelled Trio call). Blocks until the request was delivered, so a
        later statement cannot be the one it cancels."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            conn.cancel_safe(timeout=2.0)
        except (psycopg.Error, OSError) as exc:
            logger.debug("cancel request to the %s failed: %s", self._where, self._scrub(exc))

    def sever(self) -> None:
        """Cut the connection under the call using it, for a server that does
        not answer (a stopped backend, a partition), which a cancel request
        cannot reach. Callable from any thread, never blocking: the socket is
        shut down (on a duplicate of its descriptor, so libpq's own stays
        valid), the call waiting on it fails at once, saying a write in flight
        may or may not have committed, and the next call reconnects."""
        with self._lock:  # the slot cannot be closed (its descriptor reused) meanwhile
            conn = self._conn
            if conn is None or conn.closed:
                return
            self._severed = conn
            try:
                fd = os.dup(conn.pgconn.socket)
            except (psycopg.Error, OSError):
                return
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected
        finally:
            sock.close()
        logger.warning("event log: the %s did not answer; its connection was cut", self._where)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conn, self._conn = self._conn, None
            self._severed = None
        if conn is not None:
            conn.close()

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The raw connection, for tests."""
        self._ensure_connected()
        assert self._conn is not None
        return self._conn

    @property
    def where(self) -> str:
        """The database in words (never the password)."""
        return self._where

    @property
    def options(self) -> PostgresOptions:
        return self._opts

    # -- connection keeping --

    def _ensure_connected(self) -> None:
        conn = self._conn
        if (conn is not None and conn is not self._severed and not conn.broken
                and not conn.closed):
            return
        if self._conn is not None:
            self._drop()
        now = time.monotonic()
        if now < self._retry_at:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"the event log's {self._where} is unreachable: {self._last_error} (next"
                f" reconnect attempt in {int((self._retry_at - now) * 1000)} ms)",
                {"postgres_error": "reconnecting"},
            )
        try:
            conn = connect(self._conninfo, self._opts)
        except (psycopg.Error, RpcError) as exc:
            self._failures += 1
            delay = min(
                self._opts.reconnect_max_s, self._opts.reconnect_min_s * 2 ** (self._failures - 1)
            )
            self._retry_at = time.monotonic() + delay
            error = exc if isinstance(exc, RpcError) else self._translate(exc, connecting=True)
            self._last_error = error.message
            raise error from None
        with self._lock:
            if self._closed or self._aborted:
                conn.close()
                raise closed_error()
            self._conn = conn
        if self._failures:
            logger.info("event log reconnected to the %s", self._where)
        self._failures = 0

    def _drop(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self._severed = None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    @property
    def _db(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None:
            raise closed_error()
        return conn

    def _scrub(self, exc: BaseException) -> str:
        return scrub(str(exc).strip(), self._secrets)

    def _translate(self, exc: psycopg.Error, connecting: bool = False) -> RpcError:
        state = getattr(exc, "sqlstate", None) or type(exc).__name__
        if not connecting and self._conn is not None and self._conn is self._severed:
            # Cut by sever(): the server stopped answering with this call in
            # flight. Not "closed" even when closing: that would say "not written".
            self._drop()
            return RpcError(
                SOURCE_UNAVAILABLE,
                f"the event log's {self._where} did not answer (not even a request to"
                " cancel), so its connection was cut. A write in flight may or may not"
                " have committed; retrying an append with the same event id is safe (it"
                " answers duplicate if it had)",
                {"postgres_error": "unresponsive"},
            )
        detail = self._scrub(exc)
        conn = self._conn
        if (
            not connecting
            and isinstance(exc, psycopg.OperationalError)
            and (conn is None or conn.broken)
        ):
            # Before the closing check: a connection that broke under a commit
            # (a TCP timeout while closing, say) may have committed, and
            # "closed" would tell the caller it was not written.
            self._drop()
            return RpcError(
                SOURCE_UNAVAILABLE,
                f"lost the connection to the event log's {self._where}: {detail}. A write in"
                " flight may or may not have committed; retrying an append with the same"
                " event id is safe (it answers duplicate if it had)",
                {"postgres_error": state},
            )
        if self._aborted or self._closed:
            return closed_error()
        if connecting:
            return RpcError(
                SOURCE_UNAVAILABLE,
                f"cannot connect to the event log's {self._where}: {detail}",
                {"postgres_error": state},
            )
        return RpcError(
            SOURCE_UNAVAILABLE,
            f"event log database error: {detail}",
            {"postgres_error": state},
        )

    @contextmanager
    def _snapshot(self) -> Iterator[psycopg.Connection[Any]]:
        """A read transaction: several statements see one state of the log."""
        db = self._db
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield db
        except BaseException:
            if not db.closed and not db.broken:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _now(self, now_us: int) -> tuple[str, tuple[Any, ...]]:
        """The lease clock as SQL: the database's, or the caller's ``now_us``."""
        return (_DB_NOW_US, ()) if self._db_clock else ("%s::bigint", (now_us,))

    # -- appends --

    def append(self, params: AppendParams, now_us: int) -> AppendResult:
        result = self.append_batch([params], now_us)[0]
        if isinstance(result, RpcError):
            raise result
        assert isinstance(result, AppendResult)
        return result

    def append_batch(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int
    ) -> list[AppendResult | list[AppendResult] | RpcError]:
        return self.append_commit(batch, now_us, capture=False).results

    @_translated
    def append_commit(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int, capture: bool
    ) -> CommitOutcome:
        """Write every append in one transaction; per-item outcomes in order,
        with the newest seq before and after (read under the counter's lock, so
        no other writer's commit falls between them) and, with ``capture``, the
        new events as a reader gets them."""
        prepared: list[rows.Prepared | list[rows.Prepared] | RpcError] = []
        for p in batch:
            try:
                if isinstance(p, AppendGroup):
                    prepared.append(rules.prepare_group(p, now_us))
                else:
                    prepared.append(rows.prepare(p, now_us))
            except RpcError as exc:
                prepared.append(exc)
        try:
            outcome = self._commit(prepared, now_us, capture, one_by_one=False)
        except _Rewrite:
            outcome = self._commit(prepared, now_us, capture, one_by_one=True)
        return outcome

    def _commit(
        self,
        prepared: list[rows.Prepared | list[rows.Prepared] | RpcError],
        now_us: int,
        capture: bool,
        one_by_one: bool,
    ) -> CommitOutcome:
        db = self._db
        out: list[AppendResult | list[AppendResult] | RpcError] = []
        with db.transaction():
            row = db.execute("SELECT seq FROM seq_counter FOR UPDATE").fetchone()
            assert row is not None
            before = row[0]
            plan = _Plan(before, *self._known(db, prepared))
            for item in prepared:
                if isinstance(item, RpcError):
                    out.append(item)
                    continue
                mark = plan.mark()
                try:
                    if isinstance(item, list):
                        result: AppendResult | list[AppendResult] = [
                            _in_group(plan, one, i) for i, one in enumerate(item)
                        ]
                    else:
                        result = plan.add(item)
                    if one_by_one:
                        self._write_alone(db, plan.events[mark[1]:], now_us, isinstance(item, list))
                except RpcError as exc:
                    plan.undo(mark)
                    out.append(exc)
                    continue
                out.append(result)
            if not one_by_one:
                try:
                    self._write(db, plan.events, now_us)
                except _REFUSALS as exc:
                    raise _Rewrite from exc
            after = plan.last_seq
            if after != before:
                db.execute(
                    "WITH bumped AS (UPDATE seq_counter SET seq = %s RETURNING seq)"
                    " SELECT pg_notify(%s, seq::text) FROM bumped",
                    (after, self._channel),
                )
        return CommitOutcome(
            results=out,
            before_seq=before,
            after_seq=after,
            entries=[rows.committed(e.row) for e in plan.events] if capture else None,
        )

    def _known(
        self,
        db: psycopg.Connection[Any],
        prepared: list[rows.Prepared | list[rows.Prepared] | RpcError],
    ) -> tuple[dict[str, tuple[int, bytes]], dict[tuple[str, str, str], int | None]]:
        """What the plan needs from the database: the stored events with the
        batch's ids, and ``last_seq`` of the sessions ``expected_seq`` names."""
        items = [
            one
            for item in prepared
            if not isinstance(item, RpcError)
            for one in (item if isinstance(item, list) else [item])
        ]
        known: dict[str, tuple[int, bytes]] = {}
        if items:
            ids = list(dict.fromkeys(one.params.event.id for one in items))
            for event_id, seq, digest in db.execute(
                "SELECT event_id, seq, digest FROM events WHERE event_id = ANY(%s)", (ids,)
            ):
                known[event_id] = (seq, bytes(digest))
        keys = list(
            dict.fromkeys(
                (one.params.app, one.params.user, one.params.session)
                for one in items
                if one.params.expected_seq is not None
            )
        )
        session_seq: dict[tuple[str, str, str], int | None] = dict.fromkeys(keys)
        if keys:
            found = db.execute(
                "SELECT app_name, user_id, session_id, last_seq FROM sessions"
                " WHERE (app_name, user_id, session_id) IN"
                " (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]))",
                ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]),
            )
            for app, user, session, last in found:
                session_seq[(app, user, session)] = last
        return known, session_seq

    def _write_alone(
        self, db: psycopg.Connection[Any], events: list[_Planned], now_us: int, group: bool
    ) -> None:
        """Write one item's events in a savepoint, each in one of its own, so
        the database's refusal fails that item alone and names the event."""
        with db.transaction():
            for i, e in enumerate(events):
                try:
                    with db.transaction():
                        self._write(db, [e], now_us)
                except _REFUSALS as exc:
                    error = exc if isinstance(exc, RpcError) else invalid_params(
                        f"event rejected by the database: {self._scrub(exc)}"
                    )
                    raise rules.refused_in_group(error, i) if group else error from None

    def _write(self, db: psycopg.Connection[Any], events: list[_Planned], now_us: int) -> None:
        """Insert the planned events with their sessions, then fold their state
        deltas in seq order; inside the caller's transaction."""
        if not events:
            return
        # The session rows first (the events' foreign key), one row per session:
        # ON CONFLICT may touch a row only once per statement.
        # Each session's newest event: its seq and its time (last_event_time).
        newest: dict[tuple[str, str, str], tuple[int, int]] = {}
        for e in events:
            newest[(e.row[1], e.row[2], e.row[3])] = (e.row[0], e.row[8])
        keys = list(newest)
        db.execute(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at, updated_at,"
            " last_seq, last_event_time) SELECT a, u, s, '{}', %s, %s, l, t"
            " FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[])"
            " AS x(a, u, s, l, t)"
            " ON CONFLICT (app_name, user_id, session_id) DO UPDATE SET"
            " updated_at = greatest(sessions.updated_at, excluded.updated_at),"
            " last_event_time = CASE WHEN excluded.last_seq > sessions.last_seq"
            " THEN excluded.last_event_time ELSE sessions.last_event_time END,"
            " last_seq = greatest(sessions.last_seq, excluded.last_seq)",
            (now_us, now_us, [k[0] for k in keys], [k[1] for k in keys],
             [k[2] for k in keys], [v[0] for v in newest.values()],
             [v[1] for v in newest.values()]),
        )
        # COPY: psycopg writes rows in C, where an unnest of text arrays
        # escapes every element in Python (measured: a third of a batch's time).
        with db.cursor().copy(
            "COPY events (seq, app_name, user_id, session_id, event_id, invocation_id,"
            " author, branch, event_time, content, metadata, state_delta, digest) FROM STDIN"
        ) as copy:
            for e in events:
                copy.write_row((*e.row, e.digest))
        for e in events:
            if e.delta is not None:
                seq, app, user, session = e.row[:4]
                _apply_delta(db, app, user, session, e.delta, seq, now_us)

    # -- reads --

    @_translated
    def since(
        self,
        from_seq: int,
        flt: Filter | None,
        limit: int,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
    ) -> SinceResult:
        rules.check_limit(limit)
        where, args = _where(flt, [("seq > %s", (from_seq,))])
        # fetchall: psycopg builds the rows in C in one go (900k rows/s here),
        # where iterating the cursor costs a Python call per row (400k rows/s).
        found = self._db.execute(
            f"SELECT {rows.ENTRY_COLUMNS} FROM events WHERE {where} ORDER BY seq LIMIT %s",
            (*args, limit + 1),
        ).fetchall()
        entries, last, more = rows.take(found, limit, rows.shape(raw_content, encoded), max_bytes)
        return SinceResult(
            entries=entries, next_seq=from_seq if last is None else last, caught_up=not more
        )

    @_translated
    def since_committed(
        self, from_seq: int, flt: Filter | None, limit: int, max_bytes: int
    ) -> tuple[list[Committed], bool]:
        """:meth:`since` as a watch reads it: :class:`Committed` entries, and
        whether the page reached the end of the log."""
        rules.check_limit(limit)
        where, args = _where(flt, [("seq > %s", (from_seq,))])
        found = self._db.execute(
            f"SELECT {rows.ENTRY_COLUMNS} FROM events WHERE {where} ORDER BY seq LIMIT %s",
            (*args, limit + 1),
        ).fetchall()
        entries, _, more = rows.take(found, limit, "committed", max_bytes)
        return entries, not more

    @_translated
    def latest_seq(self, flt: Filter | None) -> int:
        where, args = _where(flt)
        row = self._db.execute(
            f"SELECT seq FROM events WHERE {where} ORDER BY seq DESC LIMIT 1", args
        ).fetchone()
        return row[0] if row else 0

    @_translated
    def nth_newest_seq(self, flt: Filter | None, offset: int) -> int:
        if offset < 0:
            raise invalid_params(f"offset must not be negative, not {offset}")
        where, args = _where(flt)
        row = self._db.execute(
            f"SELECT seq FROM events WHERE {where} ORDER BY seq DESC LIMIT 1 OFFSET %s",
            (*args, offset),
        ).fetchone()
        return row[0] if row else 0

    @_translated
    def branches(self, flt: Filter | None, limit: int | None) -> list[str]:
        if limit is not None:
            rules.check_limit(limit)
        where, args = _where(flt, [("branch <> ''", ())])
        query = f"SELECT DISTINCT branch FROM events WHERE {where} ORDER BY branch"
        if limit is not None:
            query += " LIMIT %s"
            args = (*args, limit)
        return [r[0] for r in self._db.execute(query, args)]

    @_translated
    def newest_seq(self) -> int:
        """The newest seq ever given and committed (deleted events still count)."""
        row = self._db.execute("SELECT seq FROM seq_counter").fetchone()
        return row[0] if row else 0

    # -- sessions --

    @_translated
    def create_session(
        self,
        app: str,
        user: str,
        session: str | None,
        state: dict[str, Any] | None,
        now_us: int,
        app_state: dict[str, Any] | None = None,
        user_state: dict[str, Any] | None = None,
    ) -> Session:
        session_id = session if session is not None else uuid.uuid4().hex
        try:
            state_json = rows.json_text(state or {})
            delta = StateDelta(app=app_state, user=user_state, session=state).normalized()
            if delta is not None:
                rows.json_text(delta)
        except (TypeError, ValueError) as exc:
            raise invalid_params(f"session state is not JSON: {exc}") from None
        db = self._db
        try:
            with db.transaction():
                if delta is not None:
                    # The counter's lock: the deltas take their place after
                    # every seq committed, and state merges never interleave.
                    found = db.execute("SELECT seq FROM seq_counter FOR UPDATE").fetchone()
                db.execute(
                    "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
                    " updated_at, last_event_time) VALUES (%s, %s, %s, '{}', %s, %s, %s)",
                    (app, user, session_id, now_us, now_us, now_us),
                )
                if delta is not None:
                    assert found is not None
                    _apply_delta(db, app, user, session_id, delta, found[0], now_us)
        except psycopg.errors.UniqueViolation:
            raise RpcError(
                INVALID_PARAMS,
                f"session {session_id!r} already exists",
                {"app": app, "user": user, "session": session_id, "reason": "session_exists"},
            ) from None
        except psycopg.DataError as exc:
            raise invalid_params(f"session rejected by the database: {self._scrub(exc)}") from None
        return rows.to_session((app, user, session_id, state_json, now_us, now_us, 0, now_us))

    @_translated
    def get_session(
        self,
        app: str,
        user: str,
        session: str,
        after_seq: int,
        recent: int | None,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
        scoped_state: bool = False,
        after_time_us: int | None = None,
        content: bool = True,
    ) -> SessionWithEvents:
        rules.check_recent(recent)
        bounds = _EventBounds(after_seq, recent, after_time_us, content)
        with self._snapshot() as db:
            got = _session_with_events(
                db, app, user, session, bounds, rows.shape(raw_content, encoded),
                max_bytes, True, scoped_state,
            )
        if got is None:
            raise rules.not_found(app, user, session)
        return got

    @_translated
    def get_sessions(
        self,
        app: str,
        keys: Sequence[SessionKey],
        recent: int | None,
        after_time_us: int | None,
        raw_content: bool = False,
        max_bytes: int | None = None,
        encoded: bool = False,
        scoped_state: bool = False,
    ) -> SessionsResult:
        rules.check_recent(recent)
        shape = rows.shape(raw_content, encoded)
        found: list[SessionWithEvents] = []
        missing: list[SessionKey] = []
        left = max_bytes
        taken_any = False
        with self._snapshot() as db:
            for key in keys:
                bounds = _EventBounds(key.after_seq, recent, after_time_us)
                got = _session_with_events(
                    db, app, key.user, key.session, bounds, shape,
                    left, not taken_any, scoped_state,
                )
                if got is None:
                    missing.append(key)
                    continue
                found.append(got)
                taken_any = taken_any or bool(got.events)
                if left is not None:
                    left -= wire_size(got) + 1
        return SessionsResult(sessions=found, missing=missing)

    @_translated
    def list_sessions(self, app: str, user: str | None) -> list[Session]:
        query = f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE app_name = %s"
        args: tuple[Any, ...] = (app,)
        if user is not None:
            query += " AND user_id = %s"
            args += (user,)
        query += " ORDER BY user_id, session_id"
        return [rows.to_session(r) for r in self._db.execute(query, args)]

    @_translated
    def list_sessions_page(
        self,
        app: str,
        user: str | None,
        limit: int,
        after: SessionKey | None,
        scoped_state: bool = False,
    ) -> SessionListResult:
        rules.check_limit(limit)
        clauses: list[filters.Clause] = [("app_name = %s", (app,))]
        if user is not None:
            clauses.append(("user_id = %s", (user,)))
            if after is not None and after.user == user:
                clauses.append(("session_id > %s", (after.session,)))
            elif after is not None and after.user > user:
                clauses.append(("false", ()))
        elif after is not None:
            clauses.append(("(user_id, session_id) > (%s, %s)", (after.user, after.session)))
        where, args = _joined(clauses)
        with self._snapshot() as db:
            page = [
                rows.to_session(r)
                for r in db.execute(
                    f"SELECT {rows.SESSION_COLUMNS} FROM sessions WHERE {where}"
                    " ORDER BY user_id, session_id LIMIT %s",
                    (*args, limit + 1),
                )
            ]
            more = len(page) > limit
            page = page[:limit]
            app_state = user_states = None
            if scoped_state:
                app_state, _ = _shared_state(db, app, None)
                user_states = {}
                for u in dict.fromkeys(s.user for s in page):
                    user_states[u] = _shared_state(db, app, u)[1] or {}
        last = page[-1] if more else None
        return SessionListResult(
            sessions=page,
            next=SessionKey(user=last.user, session=last.session) if last else None,
            app_state=app_state,
            user_states=user_states,
        )

    @_translated
    def delete_session(self, app: str, user: str, session: str) -> None:
        # Idempotent; the foreign key cascades to the session's events.
        self._db.execute(
            "DELETE FROM sessions WHERE app_name = %s AND user_id = %s AND session_id = %s",
            (app, user, session),
        )

    # -- state --

    @_translated
    def get_state(
        self, app: str, user: str | None, session: str | None, as_of_seq: int | None
    ) -> StateSnapshot:
        if session is not None and user is None:
            raise invalid_params("state.get of a session needs its user")
        with self._snapshot() as db:
            if session is not None and not _session_exists(db, app, user or "", session):
                raise rules.not_found(app, user or "", session)
            row = db.execute("SELECT seq FROM seq_counter").fetchone()
            newest = row[0] if row else 0
            if as_of_seq is None or as_of_seq >= newest:
                app_state, user_state = _shared_state(db, app, user)
                session_state = None
                if session is not None:
                    found = db.execute(
                        "SELECT state FROM sessions"
                        " WHERE app_name = %s AND user_id = %s AND session_id = %s",
                        (app, user, session),
                    ).fetchone()
                    assert found is not None
                    session_state = rows.state_or_empty(found[0], f"session {session!r}")
                return StateSnapshot(
                    seq=newest if as_of_seq is None else as_of_seq,
                    app=app_state,
                    user=user_state,
                    session=session_state,
                )
            return StateSnapshot(
                seq=as_of_seq,
                app=_fold(db, "app", app, "", "", as_of_seq),
                user=None if user is None else _fold(db, "user", app, user, "", as_of_seq),
                session=(
                    None
                    if session is None
                    else _fold(db, "session", app, user or "", session, as_of_seq)
                ),
            )

    # -- retention --

    @_translated
    def set_retention(self, policy: RetentionPolicy, now_us: int) -> None:
        if policy.empty():
            self._db.execute("DELETE FROM retention WHERE app_name = %s", (policy.app,))
            return
        self._db.execute(
            "INSERT INTO retention (app_name, max_age_s, max_events, idle_s, updated_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (app_name) DO UPDATE SET"
            " max_age_s = excluded.max_age_s, max_events = excluded.max_events,"
            " idle_s = excluded.idle_s, updated_at = excluded.updated_at",
            (policy.app, policy.max_age_s, policy.max_events, policy.idle_s, now_us),
        )

    @_translated
    def retention_policies(self, app: str | None = None) -> list[RetentionPolicy]:
        query = "SELECT app_name, max_age_s, max_events, idle_s FROM retention"
        args: tuple[Any, ...] = ()
        if app is not None:
            query += " WHERE app_name = %s"
            args = (app,)
        return [
            RetentionPolicy(app=a, max_age_s=age, max_events=n, idle_s=idle)
            for a, age, n, idle in self._db.execute(query + " ORDER BY app_name", args)
        ]

    def _leased(self, table: str, now_us: int) -> tuple[str, tuple[Any, ...]]:
        """EXISTS a live lease on the row of ``table``, by the lease clock."""
        now, args = self._now(now_us)
        return (
            f"EXISTS (SELECT 1 FROM leases l WHERE l.app_name = {table}.app_name"
            f" AND l.user_id = {table}.user_id AND l.session_id = {table}.session_id"
            f" AND l.heartbeat_at + l.stale_after_ms * 1000 > {now})",
            args,
        )

    @_translated
    def leased_sessions(self, app: str, now_us: int) -> int:
        now, args = self._now(now_us)
        row = self._db.execute(
            "SELECT count(*) FROM leases WHERE app_name = %s"
            f" AND heartbeat_at + stale_after_ms * 1000 > {now}",
            (app, *args),
        ).fetchone()
        return row[0] if row else 0

    @_translated
    def drop_idle_sessions(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: int | None,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        keep = MAX_SEQ if keep_after_seq is None else keep_after_seq
        leased, largs = self._leased("s", now_us)
        db = self._db
        budget = bounds.events
        events = deltas = sessions = 0
        cursor: tuple[str, str] | None = None
        after = 0
        with db.transaction():
            idle = db.execute(
                "SELECT user_id, session_id FROM sessions s WHERE app_name = %s"
                f" AND updated_at < %s AND last_seq <= %s AND NOT {leased}"
                " ORDER BY user_id, session_id LIMIT %s",
                (app, cutoff_us, keep, *largs, bounds.sessions),
            ).fetchall()
            for user, session in idle:
                key = (app, user, session)
                done = previous.after_seq if previous and previous.cursor == (user, session) else 0
                # Its state history first, then its events from the oldest, and
                # the row in the transaction that deletes its newest event.
                n = db.execute(
                    "DELETE FROM state_deltas WHERE rev IN (SELECT rev FROM state_deltas"
                    " WHERE scope = 'session' AND app_name = %s AND user_id = %s"
                    " AND session_id = %s ORDER BY seq, rev LIMIT %s)",
                    (*key, budget),
                ).rowcount
                deltas, budget = deltas + n, budget - n
                if budget == 0:
                    cursor, after = (user, session), done
                    break
                gone = db.execute(
                    "DELETE FROM events WHERE seq IN (SELECT seq FROM events"
                    " WHERE app_name = %s AND user_id = %s AND session_id = %s AND seq > %s"
                    " ORDER BY seq LIMIT %s) RETURNING seq",
                    (*key, done, budget),
                ).fetchall()
                events, budget = events + len(gone), budget - len(gone)
                if budget == 0 and db.execute(
                    "SELECT 1 FROM events WHERE app_name = %s AND user_id = %s"
                    " AND session_id = %s AND seq > %s LIMIT 1",
                    (*key, max(seq for seq, in gone)),
                ).fetchone():
                    cursor, after = (user, session), max(seq for seq, in gone)
                    break
                db.execute(
                    "DELETE FROM sessions WHERE app_name = %s AND user_id = %s AND session_id = %s",
                    key,
                )
                sessions += 1
                if budget == 0:
                    break
        more = budget == 0 or len(idle) == bounds.sessions
        return Step(events=events, rows=events + deltas, sessions=sessions, more=more,
                    cursor=cursor, after_seq=after)

    @_translated
    def drop_old_events(
        self,
        app: str,
        cutoff_us: int,
        keep_after_seq: int | None,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        keep = MAX_SEQ if keep_after_seq is None else keep_after_seq
        leased, largs = self._leased("e", now_us)
        done = previous.after_seq if previous else 0
        gone = self._db.execute(
            "DELETE FROM events WHERE seq IN (SELECT seq FROM events e WHERE app_name = %s"
            f" AND event_time < %s AND seq > %s AND seq <= %s AND NOT {leased}"
            " ORDER BY seq LIMIT %s) RETURNING seq",
            (app, cutoff_us, done, keep, *largs, bounds.events),
        ).fetchall()
        n = len(gone)
        return Step(events=n, rows=n, more=n == bounds.events,
                    after_seq=max((seq for seq, in gone), default=done))

    @_translated
    def trim_sessions(
        self,
        app: str,
        max_events: int,
        keep_after_seq: int | None,
        now_us: int,
        previous: Step | None,
        bounds: Bounds,
    ) -> Step:
        keep = MAX_SEQ if keep_after_seq is None else keep_after_seq
        leased, largs = self._leased("s", now_us)
        db = self._db
        budget = bounds.events
        start = previous.cursor if previous else None
        cursor: tuple[str, str] | None = None
        after = 0
        with db.transaction():
            page = db.execute(
                "SELECT user_id, session_id FROM sessions s WHERE app_name = %s"
                f" AND (user_id, session_id) >= (%s, %s) AND NOT {leased}"
                " ORDER BY user_id, session_id LIMIT %s",
                (app, *(start or ("", "")), *largs, bounds.sessions + 1),
            ).fetchall()
            if len(page) > bounds.sessions:
                cursor = (page[-1][0], page[-1][1])
                del page[-1]
            walked = 0
            for user, session in page:
                # Finding a cut point reads up to max_events + 1 index entries:
                # bounded per step too (one session always, to move on).
                if walked and walked + max_events + 1 > bounds.events:
                    cursor = (user, session)
                    break
                walked += max_events + 1
                key = (app, user, session)
                cut = db.execute(
                    "SELECT seq FROM events WHERE app_name = %s AND user_id = %s"
                    " AND session_id = %s ORDER BY seq DESC LIMIT 1 OFFSET %s",
                    (*key, max_events),
                ).fetchone()
                if cut is None:
                    continue
                done = previous.after_seq if previous and start == (user, session) else 0
                gone = db.execute(
                    "DELETE FROM events WHERE seq IN (SELECT seq FROM events"
                    " WHERE app_name = %s AND user_id = %s AND session_id = %s"
                    " AND seq > %s AND seq <= %s AND seq <= %s ORDER BY seq LIMIT %s)"
                    " RETURNING seq",
                    (*key, done, cut[0], keep, budget),
                ).fetchall()
                budget -= len(gone)
                if budget == 0:
                    # It may have more to cut: again next step, after these.
                    cursor, after = (user, session), max(seq for seq, in gone)
                    break
        deleted = bounds.events - budget
        return Step(events=deleted, rows=deleted, more=cursor is not None, cursor=cursor,
                    after_seq=after)

    def incremental_vacuum(self, pages: int) -> int:
        """Nothing to do: PostgreSQL's autovacuum makes deleted rows' space
        reusable on its own schedule (pages freed: 0)."""
        return 0

    @_translated
    def full_vacuum(self) -> None:
        """``VACUUM`` of the log's tables (space reusable now, not at autovacuum's
        next visit). Not ``VACUUM FULL``: that locks out every appender."""
        for table in ("events", "sessions", "state_deltas", "leases", "boots"):
            self._db.execute(pgsql.SQL("VACUUM {}").format(pgsql.Identifier(table)))

    def checkpoint(self) -> bool:
        """Nothing to do: the write-ahead log is the server's to checkpoint."""
        return True

    @_translated
    def pages(self) -> tuple[int, int, int]:
        """(pages of the log's tables and indexes, 0 free, block size)."""
        row = self._db.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0),"
            " current_setting('block_size')::int"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        ).fetchone()
        assert row is not None
        size, block = int(row[0]), int(row[1])
        return size // block, 0, block

    # -- leases --

    @_translated
    def acquire_lease(
        self, app: str, user: str, session: str, holder: str, stale_after_ms: int, now_us: int
    ) -> None:
        """Take the lease for ``holder``; an existing lease is judged by the
        window its own holder declared, on the lease clock."""
        key = (app, user, session)
        now_sql, now_args = self._now(now_us)
        db = self._db
        with db.transaction():
            row = db.execute(
                f"SELECT holder, heartbeat_at, stale_after_ms, {now_sql} FROM leases"
                " WHERE app_name = %s AND user_id = %s AND session_id = %s FOR UPDATE",
                (*now_args, *key),
            ).fetchone()
            if row is None:
                taken = db.execute(
                    "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at,"
                    f" heartbeat_at, stale_after_ms) SELECT %s, %s, %s, %s, n, n, %s"
                    f" FROM (SELECT {now_sql} AS n) t ON CONFLICT DO NOTHING RETURNING 1",
                    (*key, holder, stale_after_ms, *now_args),
                ).fetchone()
                if taken is None:
                    # Another host inserted it first, between our read and insert.
                    other = db.execute(
                        f"SELECT holder, greatest(0, ({now_sql} - heartbeat_at) / 1000)"
                        " FROM leases WHERE app_name = %s AND user_id = %s AND session_id = %s",
                        (*now_args, *key),
                    ).fetchone()
                    who, age = other if other else ("unknown", 0)
                    raise rules.locked(session, who, int(age), "was taken by another requester")
                return
            old_holder, old_beat, old_window_ms, now = row
            age_ms = max(0, (now - old_beat) // 1000)
            if age_ms < old_window_ms:
                raise rules.locked(session, old_holder, age_ms, "is locked")
            if not _steal(db, key, old_holder, old_beat, holder, stale_after_ms, now):
                raise rules.locked(session, old_holder, age_ms, "was taken by another stealer")

    @_translated
    def heartbeat_lease(self, app: str, user: str, session: str, holder: str, now_us: int) -> bool:
        """True while we hold the lease; False means it was stolen (or released)."""
        now_sql, now_args = self._now(now_us)
        cur = self._db.execute(
            f"UPDATE leases SET heartbeat_at = {now_sql}"
            " WHERE app_name = %s AND user_id = %s AND session_id = %s AND holder = %s",
            (*now_args, app, user, session, holder),
        )
        return cur.rowcount == 1

    @_translated
    def release_lease(self, app: str, user: str, session: str, holder: str) -> bool:
        # Conditional on our holder: never delete a successor's lease.
        cur = self._db.execute(
            "DELETE FROM leases"
            " WHERE app_name = %s AND user_id = %s AND session_id = %s AND holder = %s",
            (app, user, session, holder),
        )
        return cur.rowcount == 1

    @_translated
    def list_leases(self, app: str | None = None, user: str | None = None) -> list[LeaseInfo]:
        clauses: list[filters.Clause] = []
        if app is not None:
            clauses.append(("app_name = %s", (app,)))
        if user is not None:
            clauses.append(("user_id = %s", (user,)))
        where, args = _joined(clauses)
        found = self._db.execute(
            f"SELECT {rows.LEASE_COLUMNS} FROM leases WHERE {where}"
            " ORDER BY app_name, user_id, session_id",
            args,
        )
        return [rows.to_lease(row) for row in found]

    @_translated
    def database_now_us(self) -> int:
        """The database's clock, in microseconds (what leases are judged by)."""
        row = self._db.execute(f"SELECT {_DB_NOW_US}").fetchone()
        assert row is not None
        return int(row[0])

    # -- boots --

    @_translated
    def record_boot(self, at_us: int, attempted: Sequence[str]) -> int:
        row = self._db.execute(
            "INSERT INTO boots (boot_at, attempted) VALUES (%s, %s) RETURNING id",
            (at_us, rows.json_text(list(attempted))),
        ).fetchone()
        assert row is not None
        return int(row[0])

    @_translated
    def update_boot(self, boot_id: int, attempted: Sequence[str]) -> None:
        cur = self._db.execute(
            "UPDATE boots SET attempted = %s WHERE id = %s",
            (rows.json_text(list(attempted)), boot_id),
        )
        if cur.rowcount == 0:
            raise RpcError(INVALID_PARAMS, f"no boot with id {boot_id}", {"id": boot_id})

    @_translated
    def recent_boots(self, since_us: int) -> list[Boot]:
        found = self._db.execute(
            "SELECT id, boot_at, attempted FROM boots WHERE boot_at >= %s ORDER BY boot_at, id",
            (since_us,),
        )
        return [rows.to_boot(row) for row in found]

    # -- health --

    @_translated
    def ping(self) -> None:
        """A real, bounded read: the schema version and the newest seq."""
        with self._snapshot() as db:
            row = db.execute("SELECT version FROM streamd_meta").fetchone()
            version = row[0] if row else 0
            if version != SCHEMA_VERSION:
                raise RpcError(
                    SOURCE_UNAVAILABLE,
                    f"event log schema version is {version}, expected {SCHEMA_VERSION}",
                )
            db.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1").fetchall()

    def change_counter(self) -> int:
        """What moves when another process commits an event: the newest seq
        (for a watcher's fallback poll; LISTEN/NOTIFY is the normal wake)."""
        return self.newest_seq()

    @_translated
    def synchronous(self) -> int:
        """2 (FULL) when commits wait for the server's disk, 1 (NORMAL) when not."""
        row = self._db.execute("SHOW synchronous_commit").fetchone()
        return 1 if row is not None and row[0] == "off" else 2


# --- helpers (they take the connection, so steps compose in one transaction) --------


def _where(
    flt: Filter | None, extra: Sequence[filters.Clause] = ()
) -> tuple[str, tuple[Any, ...]]:
    """``extra`` (in PostgreSQL's spelling) and the filter's conjuncts, ANDed."""
    return _joined([*extra, *filters.where(flt, filters.POSTGRES)])


def _joined(clauses: Sequence[filters.Clause]) -> tuple[str, tuple[Any, ...]]:
    if not clauses:
        return "true", ()
    args: tuple[Any, ...] = ()
    for _, a in clauses:
        args += a
    return " AND ".join(text for text, _ in clauses), args


def _stale(session: str, expected: int, found: int) -> RpcError:
    return RpcError(
        STALE_SESSION,
        f"session {session!r} has moved on: its last seq is {found}, the append was"
        f" computed at seq {expected}; nothing was written, read the session again",
        {"expected_seq": expected, "last_seq": found},
    )


def _steal(
    db: psycopg.Connection[Any],
    key: tuple[str, str, str],
    old_holder: str,
    old_beat: int,
    new_holder: str,
    new_window_ms: int,
    now_us: int,
) -> bool:
    """Take a stale lease only if it is still exactly the stale lease we saw:
    of two stealers on two hosts, one update matches."""
    cur = db.execute(
        "UPDATE leases SET holder = %s, acquired_at = %s, heartbeat_at = %s, stale_after_ms = %s"
        " WHERE app_name = %s AND user_id = %s AND session_id = %s"
        " AND holder = %s AND heartbeat_at = %s",
        (new_holder, now_us, now_us, new_window_ms, *key, old_holder, old_beat),
    )
    return cur.rowcount == 1


def _in_group(plan: _Plan, item: rows.Prepared, index: int) -> AppendResult:
    try:
        return plan.add(item)
    except RpcError as exc:
        raise rules.refused_in_group(exc, index) from None


def _session_exists(db: psycopg.Connection[Any], app: str, user: str, session: str) -> bool:
    return (
        db.execute(
            "SELECT 1 FROM sessions WHERE app_name = %s AND user_id = %s AND session_id = %s",
            (app, user, session),
        ).fetchone()
        is not None
    )


def _shared_state(
    db: psycopg.Connection[Any], app: str, user: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    found = db.execute("SELECT state FROM app_states WHERE app_name = %s", (app,)).fetchone()
    app_state = rows.state_or_empty(found[0] if found else None, f"app {app!r}")
    if user is None:
        return app_state, None
    found = db.execute(
        "SELECT state FROM user_states WHERE app_name = %s AND user_id = %s", (app, user)
    ).fetchone()
    return app_state, rows.state_or_empty(found[0] if found else None, f"user {user!r}")


def _fold(
    db: psycopg.Connection[Any], scope: str, app: str, user: str, session: str, as_of_seq: int
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for (text,) in db.execute(
        "SELECT delta FROM state_deltas"
        " WHERE scope = %s AND app_name = %s AND user_id = %s AND session_id = %s AND seq <= %s"
        " ORDER BY seq, rev",
        (scope, app, user, session, as_of_seq),
    ):
        state.update(rows.state_or_empty(text, f"{scope} delta"))
    return state


def _apply_delta(
    db: psycopg.Connection[Any],
    app: str,
    user: str,
    session: str,
    delta: StateDelta,
    at_seq: int,
    now_us: int,
) -> None:
    """Record each scope's delta at ``at_seq`` and fold it into that scope's
    current state, in the caller's transaction (which holds the counter's lock,
    so no other writer merges into the same state meanwhile)."""
    if delta.app:
        _merge(db, "app_states", ("app_name",), (app,), f"app {app!r}", delta.app, now_us)
        _record(db, "app", app, "", "", at_seq, delta.app)
    if delta.user:
        _merge(
            db, "user_states", ("app_name", "user_id"), (app, user), f"user {user!r}",
            delta.user, now_us,
        )
        _record(db, "user", app, user, "", at_seq, delta.user)
    if delta.session:
        found = db.execute(
            "SELECT state FROM sessions WHERE app_name = %s AND user_id = %s AND session_id = %s",
            (app, user, session),
        ).fetchone()
        assert found is not None  # the caller wrote the session row
        state = rules.parsed_for_merge(found[0], f"session {session!r}")
        state.update(delta.session)
        db.execute(
            "UPDATE sessions SET state = %s"
            " WHERE app_name = %s AND user_id = %s AND session_id = %s",
            (rows.json_text(state), app, user, session),
        )
        _record(db, "session", app, user, session, at_seq, delta.session)


def _merge(
    db: psycopg.Connection[Any],
    table: str,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    what: str,
    delta: dict[str, Any],
    now_us: int,
) -> None:
    where = " AND ".join(f"{c} = %s" for c in columns)
    found = db.execute(f"SELECT state FROM {table} WHERE {where}", key).fetchone()
    state = rules.parsed_for_merge(found[0], what) if found else {}
    state.update(delta)
    text = rows.json_text(state)
    if found:
        db.execute(f"UPDATE {table} SET state = %s, updated_at = %s WHERE {where}",
                   (text, now_us, *key))
    else:
        marks = ", ".join(["%s"] * (len(key) + 2))
        db.execute(
            f"INSERT INTO {table} ({', '.join(columns)}, state, updated_at) VALUES ({marks})",
            (*key, text, now_us),
        )


def _record(
    db: psycopg.Connection[Any],
    scope: str,
    app: str,
    user: str,
    session: str,
    at_seq: int,
    delta: dict[str, Any],
) -> None:
    db.execute(
        "INSERT INTO state_deltas (scope, app_name, user_id, session_id, seq, delta)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (scope, app, user, session, at_seq, rows.json_text(delta)),
    )


@dataclass(frozen=True, slots=True)
class _EventBounds:
    """Which of a session's events a read returns (as in the SQLite store):
    after a seq, at or after a time, the newest ``recent`` of those."""

    after_seq: int
    recent: int | None
    after_time_us: int | None
    content: bool = True

    def _where(self) -> str:
        where = "app_name = %s AND user_id = %s AND session_id = %s AND seq > %s"
        return where if self.after_time_us is None else where + " AND event_time >= %s"

    def _args(self, key: tuple[str, str, str], after: int) -> tuple[Any, ...]:
        args: tuple[Any, ...] = (*key, after)
        return args if self.after_time_us is None else (*args, self.after_time_us)

    def window_start(self, db: psycopg.Connection[Any], key: tuple[str, str, str]) -> int | None:
        """The first seq of the ``recent`` window, if there is a window."""
        if self.recent is None:
            return None
        row = db.execute(
            f"SELECT seq FROM events WHERE {self._where()} ORDER BY seq DESC LIMIT 1 OFFSET %s",
            (*self._args(key, self.after_seq), self.recent - 1),
        ).fetchone()
        return None if row is None else row[0]

    def read(
        self, db: psycopg.Connection[Any], key: tuple[str, str, str], after: int
    ) -> Iterator[tuple[Any, ...]]:
        """The events after ``after``, oldest first, a page of rows at a time,
        so a consumer that stops (its byte budget is spent) stops the reads."""
        where = self._where()
        columns = rows.ENTRY_COLUMNS if self.content else rows.ENTRY_COLUMNS_WITHOUT_CONTENT
        query = f"SELECT {columns} FROM events WHERE {where} ORDER BY seq LIMIT %s"
        while True:
            page = db.execute(query, (*self._args(key, after), _READ_PAGE)).fetchall()
            yield from page
            if len(page) < _READ_PAGE:
                return
            after = page[-1][0]


def _session_with_events(
    db: psycopg.Connection[Any],
    app: str,
    user: str,
    session: str,
    bounds: _EventBounds,
    shape: rows.Shape,
    max_bytes: int | None,
    min_one: bool,
    scoped_state: bool,
) -> SessionWithEvents | None:
    row = db.execute(
        f"SELECT {rows.SESSION_COLUMNS} FROM sessions"
        " WHERE app_name = %s AND user_id = %s AND session_id = %s",
        (app, user, session),
    ).fetchone()
    if row is None:
        return None
    base = rows.to_session(row)
    app_state = user_state = None
    if scoped_state:
        app_state, user_state = _shared_state(db, app, user)
    budget = None
    if max_bytes is not None:
        budget = max_bytes - wire_size(base)
        if scoped_state:
            budget -= wire_size([app_state, user_state])
    key = (app, user, session)
    start = bounds.after_seq
    events: list[Any] = []
    last, more = None, False
    if bounds.recent != 0:
        first = bounds.window_start(db, key)
        if first is not None:
            start = first - 1
        if budget is not None and budget <= 0 and not min_one:
            more = next(bounds.read(db, key, start), None) is not None
        else:
            events, last, more = rows.take(
                bounds.read(db, key, start), bounds.recent, shape, budget, min_one
            )
    return SessionWithEvents(
        app=base.app,
        user=base.user,
        session=base.session,
        state=base.state,
        created_at=base.created_at,
        updated_at=base.updated_at,
        last_seq=base.last_seq,
        last_event_time=base.last_event_time,
        events=events,
        truncated=more,
        next_seq=(start if last is None else last) if more else None,
        app_state=app_state,
        user_state=user_state,
    )
