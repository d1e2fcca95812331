"""The synchronous MySQL/MariaDB store: the storage rules of the event log, on mysqlclient.

One :class:`MysqlStore` wraps one connection and is a
:class:`~streamd.eventlog.store.backend.Backend` with the same results as the
SQLite and PostgreSQL stores (the contract tests run all three). The shared
rules (:class:`~streamd.eventlog.store.operations.SqlOperations`) answer every
read and every write but the append, which is the backend's own because of how
seq is numbered. No driver exception leaves the store (:func:`_translated`),
and no message names the password: the database is named by its URL without
it, and every driver message is scrubbed of it.

* **Commit-ordered seq**, as on PostgreSQL: an append locks the one row of
  ``seq_counter``, numbers its events from it (the batch is planned in
  Python, :mod:`~streamd.eventlog.store.plan`), writes them with one
  multi-row insert per table and the counter back, and commits. Appenders on
  any number of hosts commit one after another in seq order; group commit
  makes them take turns per batch, not per event.
* **Refused, never cut**: the session runs with ``STRICT_ALL_TABLES``, and a
  key longer than its column (:data:`~streamd.eventlog.mysql.schema.KEY_LENGTHS`)
  is refused with -32602 naming the field before anything is sent.
* **Leases use the database's clock** (``NOW(6)``), with
  ``lease_clock="caller"`` for tests that move time by hand; either is read in
  a statement after the one that locks the lease's row (see
  :mod:`~streamd.eventlog.store.leases`).
* **Outages**, as on PostgreSQL: a broken connection is dropped and the next
  call reconnects, with backoff between failed attempts and
  ``source_unavailable`` at once in between; a write whose connection broke
  before the commit was acknowledged may or may not have committed, and says
  so. A cancelled call has its statement killed (``KILL QUERY`` from a
  connection of its own); a server that does not even answer that has the
  connection cut (:meth:`MysqlStore.sever`).
* **Durability is the server's**: MySQL has no per-session commit durability,
  so ``synchronous()`` reports ``innodb_flush_log_at_trx_commit`` (1: every
  commit is on disk when acknowledged).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import MySQLdb
from MySQLdb.constants import CLIENT

from streamd.errors import RpcError, invalid_params
from streamd.eventlog.model import AppendParams
from streamd.eventlog.mysql import packets, schema
from streamd.eventlog.mysql.migrate import check_version, migrate_schema, version_is_current
from streamd.eventlog.mysql.sql import DB_NOW_US, READ_PAGE, MySql, error_code, placeholders
from streamd.eventlog.mysql.url import MysqlUrl, connect_kwargs, parse
from streamd.eventlog.store import outages, rows, rules
from streamd.eventlog.store.backend import AppendGroup, CommitOutcome, Synchronous, closed_error
from streamd.eventlog.store.operations import SqlOperations
from streamd.eventlog.store.plan import (
    Known,
    Planned,
    SessionKey,
    commit_planned,
    event_ids,
    expected_sessions,
    fold_deltas,
    session_heads,
    sessions_to_lock,
)
from streamd.eventlog.store.reconnecting import Backoff, Reconnecting, boundary
from streamd.eventlog.store.sql import Sql

__all__ = ["MysqlOptions", "MysqlStore", "connect"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Error codes: the client's own (2xxx) and the server's.
# Gone away, lost during query, closed by the server; and a packet over
# max_allowed_packet (1153), after which the server closes the connection (the
# packets module keeps statements under it; should one pass, the next call
# must not be sent on the dead connection).
_LOST = frozenset({2006, 2013, 2055, 4031, 1153})
_KILLED = 1317  # the statement was interrupted (KILL QUERY)
_VALUE_REFUSED = frozenset({1406, 1366, 4025, 3819})  # too long, bad text, a CHECK (MariaDB, MySQL)


@dataclass(frozen=True)
class MysqlOptions:
    synchronous: Synchronous = "FULL"
    """Reported only: the server's ``innodb_flush_log_at_trx_commit`` decides."""
    lease_clock: Literal["database", "caller"] = "database"
    connect_timeout_s: int = 5
    """Used when the URL gives no ``connect_timeout``."""
    reconnect_min_s: float = 0.05
    reconnect_max_s: float = 5.0
    idle_check_s: float = 1.0
    """A call after this long without one first checks its connection with a
    ping (see :mod:`~streamd.eventlog.store.reconnecting`)."""
    unresponsive_s: float = 2.0
    """How long a cancelled call may go on after its statement was killed
    before the connection is cut under it."""
    lock_wait_timeout_s: int = 30
    """``innodb_lock_wait_timeout`` of each connection."""


def connect(url: MysqlUrl, opts: MysqlOptions, *, within_s: int | None = None) -> Any:
    """A connection set up the way every rule expects: utf8mb4, autocommit,
    matched-row counts, strict values, UTC, READ COMMITTED. ``within_s``:
    the connect and every read and write give up after that long at most,
    whatever the URL says (a ``connect_timeout`` of 0 is none)."""
    kw = connect_kwargs(url)
    kw.setdefault("connect_timeout", opts.connect_timeout_s)
    if within_s is not None:
        given = kw["connect_timeout"]
        kw["connect_timeout"] = within_s if given <= 0 else min(given, within_s)
        kw["read_timeout"] = kw["write_timeout"] = within_s
    conn = MySQLdb.connect(
        **kw, charset="utf8mb4", autocommit=True, client_flag=CLIENT.FOUND_ROWS
    )
    try:
        conn.query(
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,"
            "ERROR_FOR_DIVISION_BY_ZERO', time_zone = '+00:00',"
            f" innodb_lock_wait_timeout = {int(opts.lock_wait_timeout_s)}"
        )
        conn.query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    except BaseException:
        conn.close()
        raise
    return conn


def _store_link(store: MysqlStore) -> Reconnecting[Any]:
    return store._link


def _store_error(store: MysqlStore, exc: Exception) -> RpcError:
    assert isinstance(exc, MySQLdb.Error)
    return store._translate(exc)


_translated = boundary(MySQLdb.Error, _store_link, _store_error)
"""The storage boundary (:func:`~streamd.eventlog.store.reconnecting.boundary`):
no MySQLdb exception escapes a decorated method."""


class MysqlStore(SqlOperations):
    """The event log on one mysqlclient connection; see the module docstring."""

    def __init__(self, url: str, options: MysqlOptions | None = None) -> None:
        self._url = parse(url)
        self._opts = options or MysqlOptions()
        self._secrets = [self._url.password or "", os.environ.get("MYSQL_PWD", "")]
        self._where = f"MySQL database {self._url.description}"
        # Of the connection now, read when it is made: the driver refuses any
        # use of a connection from a second thread while a call runs on it, and
        # a cancel (KILL QUERY) or a cut (its socket) comes from another thread.
        self._thread = 0  # the server's id of the connection's session
        self._fd = -1  # its socket
        self._max_packet = packets.DEFAULT_MAX_PACKET  # its max_allowed_packet
        self._link: Reconnecting[Any] = Reconnecting(
            connect=self._connect,
            # A connection that failed is dropped by _translate; one held is usable.
            usable=lambda c: True,
            alive=lambda c: c.ping(),
            gone=lambda c, exc: error_code(exc) in _LOST or isinstance(exc, MySQLdb.InterfaceError),
            fileno=lambda c: self._fd,
            close=lambda c: c.close(),
            refused=self._connect_refused,
            errors=(MySQLdb.Error,),
            where=self._where,
            data_key="mysql_error",
            min_s=self._opts.reconnect_min_s,
            max_s=self._opts.reconnect_max_s,
            idle_check_s=self._opts.idle_check_s,
        )
        self._db_clock = self._opts.lease_clock == "database"

    # -- lifecycle --

    @classmethod
    def open(
        cls, url: str, options: MysqlOptions | None = None, *, migrate: bool = True
    ) -> MysqlStore:
        """Connect (and migrate, for the writer); an unreachable database or a
        schema that is not ours fails the open with source_unavailable."""
        store = cls(url, options)
        try:
            conn = store._connect()
        except MySQLdb.Error as exc:
            raise store._translate(exc, connecting=True) from None
        try:
            try:
                if migrate:
                    migrate_schema(conn, store._url.database)
                else:
                    check_version(conn, store._where)
            except BaseException:
                conn.close()
                raise
        except MySQLdb.Error as exc:
            raise outages.cannot_set_up(
                store._where, store._scrub(exc), {"mysql_error": error_code(exc)}) from None
        store._link.adopt(conn)
        return store

    def _connect(self) -> Any:
        conn = connect(self._url, self._opts)
        try:
            self._max_packet = packets.max_packet(conn)
        except BaseException:
            conn.close()
            raise
        self._thread, self._fd = conn.thread_id(), conn.fileno()
        return conn

    @property
    def where(self) -> str:
        return self._where

    @property
    def options(self) -> MysqlOptions:
        return self._opts

    @property
    def connection(self) -> Any:
        """The raw connection, for tests."""
        return self._link.get()

    def interrupt(self) -> None:
        """For close: every later call fails with ``closed``; never blocks
        (the runner sends :meth:`cancel_running` from a thread of its own)."""
        self._link.abort()

    def cancel_running(self) -> None:
        """Kill the statement running on the connection now, if any, from a
        connection of its own (MySQL's cancel); blocks until it was sent."""
        thread = self._thread
        if self._link.current is None or not thread:
            return
        try:
            # Within the grace: past it the call's connection is cut anyway,
            # and a server that accepts and never answers held this connect
            # (and its thread, one of Trio's few) for the URL's whole connect
            # timeout, for ever with connect_timeout=0.
            killer = connect(self._url, self._opts,
                             within_s=max(1, math.ceil(self._opts.unresponsive_s)))
            try:
                killer.query(f"KILL QUERY {int(thread)}")
            finally:
                killer.close()
        except MySQLdb.Error as exc:
            logger.debug("cancel on the %s failed: %s", self._where, self._scrub(exc))

    def cut_if_connecting(self) -> bool:
        """Cut the running call if it is in the driver's connect (reconnecting)."""
        return self._link.cut_if_connecting()

    def sever(self) -> None:
        """Cut the connection under a call the server no longer answers."""
        self._link.sever()

    def close(self) -> None:
        self._link.close()

    def _sql(self) -> MySql:
        conn = self._link.current
        if conn is None:
            raise closed_error()
        return MySql(conn, self._scrub, self._db_clock, self._max_packet)

    @_translated
    def _call(self, op: Callable[[Sql], _T]) -> _T:
        return op(self._sql())

    @property
    def attempts(self) -> Backoff:
        """Its connection's attempts (see :attr:`Reconnecting.attempts`)."""
        return self._link.attempts

    def _connect_refused(self, exc: Exception) -> RpcError:
        assert isinstance(exc, MySQLdb.Error)
        return self._translate(exc, connecting=True)

    def _scrub(self, exc: BaseException) -> str:
        text = exc.args[1] if len(exc.args) > 1 else str(exc)
        return outages.scrub(str(text), self._secrets)

    def _translate(self, exc: MySQLdb.Error, connecting: bool = False) -> RpcError:
        code = error_code(exc)
        data = {"mysql_error": code}
        link = self._link
        if not connecting and link.cut():
            link.drop()
            return outages.unresponsive(self._where, {"mysql_error": "unresponsive"})
        detail = self._scrub(exc)
        if not connecting and (code in _LOST or isinstance(exc, MySQLdb.InterfaceError)):
            link.drop()
            return outages.connection_lost(self._where, detail, data)
        if link.closed:
            return closed_error()
        if connecting:
            return outages.cannot_connect(self._where, detail, data)
        if code in _VALUE_REFUSED:
            return invalid_params(f"refused by the database: {detail}")
        if code == _KILLED:
            # Killed (a cancel) while it may have been committing.
            return outages.database_error(
                f"the statement was cancelled. {outages.RETRY_IS_SAFE}", data
            )
        return outages.database_error(detail, data)

    # -- appends --

    @_translated
    def append_commit(
        self, batch: Sequence[AppendParams | AppendGroup], now_us: int, capture: bool
    ) -> CommitOutcome:
        """Write every append in one transaction (the shared planned commit,
        :func:`~streamd.eventlog.store.plan.commit_planned`, on this connection)."""
        sql = self._sql()
        max_packet = self._max_packet

        def check(item: rows.Prepared) -> None:
            _refuse_too_long(item)
            packets.refuse_oversized(item, max_packet)

        return commit_planned(_MysqlWrite(sql, max_packet), rules.prepare_all(batch, now_us),
                              now_us, capture, check=check)

    # -- maintenance --

    def incremental_vacuum(self, pages: int) -> int:
        """Nothing to do: InnoDB reuses deleted rows' space in its tablespace."""
        return 0

    def full_vacuum(self) -> None:
        """Nothing: giving InnoDB's space back to the file system is ``OPTIMIZE
        TABLE``, which rebuilds the table; that is an administrator's call."""

    def checkpoint(self) -> bool:
        """Nothing to do: the redo log is the server's to checkpoint."""
        return True

    @_translated
    def pages(self) -> tuple[int, int, int]:
        """(16 KiB pages of the log's tables and indexes, free pages, 16 KiB)."""
        row = self._sql().one(
            "SELECT coalesce(sum(data_length + index_length), 0), coalesce(sum(data_free), 0)"
            " FROM information_schema.tables WHERE table_schema = DATABASE()"
        )
        used, free = (int(row[0]), int(row[1])) if row else (0, 0)
        return used // 16384, free // 16384, 16384

    @_translated
    def database_now_us(self) -> int:
        row = self._sql().one(f"SELECT {DB_NOW_US}")
        assert row is not None
        return int(row[0])

    @_translated
    def ping(self) -> None:
        """A real, bounded read: the schema version and the newest seq."""
        sql = self._sql()
        with sql.snapshot():
            version_is_current(sql, self._where)
            sql.rows("SELECT seq FROM events ORDER BY seq DESC LIMIT 1")

    def change_counter(self) -> int:
        return self.newest_seq()

    @_translated
    def synchronous(self) -> int:
        """2 (FULL) when the server writes every commit to disk, else 1."""
        row = self._sql().one("SELECT @@innodb_flush_log_at_trx_commit")
        return 2 if row is not None and int(row[0]) == 1 else 1


# --- the batch write ---------------------------------------------------------------


class _MysqlWrite:
    """The planned commit's statements on one connection
    (:class:`~streamd.eventlog.store.plan.PlannedWrite`)."""

    def __init__(self, sql: MySql, max_packet: int) -> None:
        self._sql = sql
        self._max_packet = max_packet
        self._savepoints = 0

    def transaction(self) -> AbstractContextManager[object]:
        return self._sql.write()

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        self._savepoints += 1
        name = f"sp{self._savepoints}"
        self._sql.run(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self._sql.run(f"ROLLBACK TO SAVEPOINT {name}")
            raise
        self._sql.run(f"RELEASE SAVEPOINT {name}")

    def locked_seq(self) -> int:
        return self._sql.newest_seq(lock=True)

    def known(self, items: list[rows.Prepared]) -> Known:
        sql = self._sql
        known: dict[str, tuple[int, bytes]] = {}
        ids = event_ids(items)
        for start in range(0, len(ids), READ_PAGE):
            part = ids[start:start + READ_PAGE]
            # FOR UPDATE: the table's metadata lock in the mode the insert
            # will need (SHARED_WRITE), not SHARED_READ. A transaction that
            # asked for the stronger after the weaker, while DDL waited to
            # have the table to itself (an index a migration adds), waited for
            # the DDL that waited for it, and the server failed the append
            # ("Deadlock found"). The rows it finds, retried events, are
            # locked too; READ COMMITTED takes no gap locks for those absent.
            for event_id, seq, digest in sql.rows(
                "SELECT event_id, seq, digest FROM events WHERE event_id IN"
                f" ({placeholders(part)}) FOR UPDATE", part,
            ):
                known[event_id] = (seq, bytes(digest))
        session_seq: dict[tuple[str, str, str], int | None] = dict.fromkeys(
            expected_sessions(items))
        for key in sessions_to_lock(items):
            # Locked, in key order, as on PostgreSQL (see there).
            row = sql.one("SELECT last_seq FROM sessions WHERE app_name = ? AND user_id = ?"
                          " AND session_id = ? FOR UPDATE", key)
            if row is not None and key in session_seq:
                session_seq[key] = row[0]
        return known, session_seq

    def from_seq(self, key: SessionKey, seq: int) -> list[int]:
        return [row[0] for row in self._sql.rows(
            "SELECT seq FROM events WHERE app_name = ? AND user_id = ?"
            " AND session_id = ? AND seq >= ? ORDER BY seq LIMIT 2", (*key, seq))]

    def write(self, events: list[Planned], now_us: int) -> None:
        if not events:
            return
        sql = self._sql
        newest = session_heads(events)
        # Assignments run left to right: last_event_time reads last_seq before it moves.
        sql.run(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at, updated_at,"
            " last_seq, last_event_time) VALUES "
            + ", ".join(["(?, ?, ?, '{}', ?, ?, ?, ?)"] * len(newest))
            + " ON DUPLICATE KEY UPDATE updated_at = GREATEST(updated_at, VALUES(updated_at)),"
            " last_event_time = IF(VALUES(last_seq) > last_seq, VALUES(last_event_time),"
            " last_event_time), last_seq = GREATEST(last_seq, VALUES(last_seq))",
            [v for (a, u, s), (seq, at) in newest.items()
             for v in (a, u, s, now_us, now_us, seq, at)],
        )
        for packet in packets.packets(events, self._max_packet):
            sql.run(
                "INSERT INTO events (seq, app_name, user_id, session_id, event_id, invocation_id,"
                " author, branch, event_time, content, metadata, state_delta, digest) VALUES "
                + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(packet)),
                [v for e in packet for v in (*e.row, e.digest)],
            )
        fold_deltas(sql, events, now_us)

    def advance(self, newest: int) -> None:
        self._sql.run("UPDATE seq_counter SET seq = ? WHERE one = 1", (newest,))

    def refusal(self, exc: BaseException) -> bool:
        if isinstance(exc, RpcError | MySQLdb.DataError | MySQLdb.IntegrityError):
            return True
        return isinstance(exc, MySQLdb.Error) and error_code(exc) in _VALUE_REFUSED

    def describe(self, exc: BaseException) -> str:
        return self._sql.describe(exc)


_FIELDS = (("app", "app_name"), ("user", "user_id"), ("session", "session_id"))


def _refuse_too_long(item: rows.Prepared) -> None:
    """A key longer than its column is refused naming the field (strict mode
    would refuse it too, naming the column, after a round trip)."""
    p, ev = item.params, item.params.event
    limits = schema.KEY_LENGTHS
    for name, value, column in (
        *((f, getattr(p, f), c) for f, c in _FIELDS),
        ("event.id", ev.id, "event_id"), ("event.author", ev.author, "author"),
        ("event.branch", ev.branch, "branch"),
    ):
        if len(value) > limits[column]:
            raise invalid_params(
                f"event rejected by the database: {name} is {len(value)} characters long,"
                f" longer than the {limits[column]} a MySQL log holds"
            )
