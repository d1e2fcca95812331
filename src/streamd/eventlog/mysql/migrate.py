"""Migrating the MySQL/MariaDB schema while other hosts go on appending to it.

Openers take turns by ``GET_LOCK`` (named for the database), since MySQL
commits around every ``CREATE``/``ALTER`` and a migration cannot be one
transaction (see :mod:`~streamd.eventlog.mysql.schema`); the version row
moves after each migration's last statement, and every statement may run
again, so a migration cut short is finished by the next opener.

**An index is added online, or not at all.** A step that adds one
(:class:`~streamd.eventlog.store.online_index.OnlineIndex`) runs ``ALTER
TABLE ... ADD INDEX ..., ALGORITHM=INPLACE, LOCK=NONE``. Without the clause
the server picks how: InnoDB builds in place while writes go on, unless the
server is set to copy tables (MariaDB's ``alter_algorithm=COPY``, the older
``old_alter_table``), and then the copy holds a lock that excludes writes
(``SHARED_NO_WRITE``) for as long as it takes, every host's appends waiting.
With it a server that cannot build online says so instead, and the opener
fails naming the index, having locked nothing: an operator adds it at a
quiet hour. Online still takes the table to itself for a moment as it
starts and as it ends, each waiting for the transactions open on the table,
new writes queueing behind it meanwhile (see docs/mysql.md).

An index build that is killed leaves no index (InnoDB rolls the DDL back):
the next opener builds it again; one that finds it made (the version row had
not moved) goes on.

**No statement time limit of the server's.** MariaDB's ``max_statement_time``
(global, or a user's ``MAX_STATEMENT_TIME``) interrupted a build that
outlasted it at every open, so a newer streamd could never open the log; the
migration's session lifts it and puts the session's own value back after.
The wait for the table's metadata lock (``lock_wait_timeout``) stays the
server's: that wait holds up every host's appends queued behind it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import MySQLdb

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.mysql import schema
from streamd.eventlog.mysql.sql import MySql, error_code, placeholders
from streamd.eventlog.store.online_index import OnlineIndex

__all__ = ["check_version", "migrate_schema", "version_is_current"]

DUPLICATE_KEY_NAME = 1061
"""The error of an index created again: the statement was done before."""
NOT_ONLINE = frozenset({1845, 1846})
"""ER_ALTER_OPERATION_NOT_SUPPORTED(_REASON): the server cannot build it as asked."""


def migrate_schema(conn: Any, database: str) -> None:
    """Bring the schema to :data:`~schema.SCHEMA_VERSION` under ``GET_LOCK``;
    raises the driver's errors, and :class:`RpcError` for a database that is
    not a log's, is newer, or cannot take an index online."""
    sql = MySql(conn, str, True)
    lock = f"streamd-migrate:{database}"[:64]
    row = sql.one("SELECT GET_LOCK(?, 60)", (lock,))
    if row is None or row[0] != 1:
        raise RpcError(SOURCE_UNAVAILABLE,
                       "another process held the event log's migration lock for 60 s")
    try:
        with _no_statement_time_limit(sql):
            _migrate(sql)
    finally:
        sql.one("SELECT RELEASE_LOCK(?)", (lock,))


UNKNOWN_SYSTEM_VARIABLE = 1193
"""MySQL has no ``max_statement_time`` (its ``max_execution_time`` limits only
a SELECT)."""


@contextmanager
def _no_statement_time_limit(sql: MySql) -> Iterator[None]:
    """The session without MariaDB's ``max_statement_time`` until the block
    ends, then with its own value again (see the module's text)."""
    try:
        row = sql.one("SELECT @@SESSION.max_statement_time")
    except MySQLdb.Error as exc:
        if error_code(exc) != UNKNOWN_SYSTEM_VARIABLE:
            raise
        row = None
    if row is None:
        yield
        return
    sql.run("SET SESSION max_statement_time = 0")
    yield
    # Not after a failure: the open closes that connection.
    sql.run("SET SESSION max_statement_time = ?", (row[0],))


def _migrate(sql: MySql) -> None:
    """The migration itself, under the lock."""
    version = _version(sql)
    if version is None:
        tables = sql.rows("SELECT table_name FROM information_schema.tables"
                          " WHERE table_schema = DATABASE()")
        if tables:
            names = ", ".join(sorted(str(t[0]) for t in tables)[:5])
            raise RpcError(SOURCE_UNAVAILABLE,
                           f"the database holds tables that are not an event log's"
                           f" ({names}); refusing to write to it")
        sql.run("CREATE TABLE streamd_meta (one TINYINT PRIMARY KEY, application"
                " VARCHAR(64) NOT NULL, version INT NOT NULL) ENGINE=InnoDB")
        sql.run("INSERT INTO streamd_meta VALUES (1, ?, 0)", (schema.APPLICATION,))
        version = 0
    _refuse_newer(version)
    collation = _nopad_collation(sql)
    for v in range(version, schema.SCHEMA_VERSION):
        step = schema.MIGRATIONS[v]
        if isinstance(step, OnlineIndex):
            _add_online(sql, step)
        else:
            for statement in schema.migration_statements(step, collation):
                sql.run(statement)
        sql.run("UPDATE streamd_meta SET version = ?", (v + 1,))


def _add_online(sql: MySql, step: OnlineIndex) -> None:
    statement = f"ALTER TABLE {step.table} ADD INDEX {step.name} {step.column_list}"
    try:
        sql.run(statement + ", ALGORITHM=INPLACE, LOCK=NONE")
    except MySQLdb.Error as exc:
        code = error_code(exc)
        if code == DUPLICATE_KEY_NAME:
            return  # made by an opener cut short before the version row moved
        if code not in NOT_ONLINE:
            raise
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"this server cannot add the event log's index {step.name} while writes go on"
            f" ({exc.args[1] if len(exc.args) > 1 else exc}), and streamd does not lock the"
            f" {step.table} table for it: add it at a quiet hour with `{statement}`, then"
            " open the log again",
            {"index": step.name},
        ) from None


def _version(sql: MySql) -> int | None:
    row = sql.one("SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE()"
                  " AND table_name = 'streamd_meta'")
    if row is None:
        return None
    found = sql.one("SELECT application, version FROM streamd_meta")
    if found is None or found[0] != schema.APPLICATION:
        raise RpcError(SOURCE_UNAVAILABLE,
                       "the database's streamd_meta is not an event log's; refusing it")
    return int(found[1])


def _refuse_newer(version: int) -> None:
    if version > schema.SCHEMA_VERSION:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"event log database has schema version {version}, newer than this streamd"
            f" understands ({schema.SCHEMA_VERSION}); refusing to open it",
        )


def check_version(conn: Any, where: str) -> None:
    """A reader's open: the schema must be this streamd's, migrated by a writer."""
    version_is_current(MySql(conn, str, True), where)


def version_is_current(sql: MySql, where: str) -> None:
    version = _version(sql) or 0
    _refuse_newer(version)
    if version != schema.SCHEMA_VERSION:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"the event log schema in the {where} is at version {version}, expected"
            f" {schema.SCHEMA_VERSION}; open it as a writer first",
        )


def _nopad_collation(sql: MySql) -> str:
    found = {r[0] for r in sql.rows(
        "SELECT collation_name FROM information_schema.collations WHERE collation_name IN"
        f" ({placeholders(schema.NOPAD_COLLATIONS)})", schema.NOPAD_COLLATIONS)}
    for name in schema.NOPAD_COLLATIONS:
        if name in found:
            return name
    raise RpcError(
        SOURCE_UNAVAILABLE,
        "the server has no binary no-pad utf8mb4 collation (utf8mb4_nopad_bin,"
        " MariaDB 10.2 and later; utf8mb4_0900_bin, MySQL 8): the log needs one",
    )
