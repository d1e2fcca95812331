"""Rows whose stored text is not UTF-8, read with U+FFFD for each bad byte.

streamd never stores such text (``store.storable`` refuses it at append), but
a SQLite file can hold it: written by another program, or damaged on disk.
SQLite does not check it (its JSON check passes an invalid byte inside a
string), while APSW decodes every TEXT value strictly, so a read that met one
such row raised ``UnicodeDecodeError`` out of the store. An event-log Recall
source then failed every round for as long as the row was there (each search
answered -32603 ``index round failed``), and ``streamd log since`` ended in a
traceback.

Only a fallback, so the hot path is unchanged: a store call runs as it is,
and only when it meets such a row is it run again with its statements wrapped
(:func:`rows`), so that each text value comes back as bytes (``CAST ... AS
BLOB``) and is decoded here with ``errors="replace"``, the rule a stream's
records follow (records.md). The wrapper is a CTE that names the statement's
columns by position; a plain ``SELECT`` of it keeps the statement's own order
(SQLite drops a subquery's ORDER BY only where the outer query orders,
groups or joins: tests/eventlog/test_not_utf8.py checks the orders the reads
use). Sans-I/O but for the connection it is handed.
"""

from __future__ import annotations

from collections.abc import Generator

import apsw

from streamd.eventlog.store.sql import Args, Row

__all__ = ["rows", "wrapped"]

# Statements that only read: only those are run a second time to learn their
# width (a write run twice would write twice).
_READS = ("SELECT", "WITH", "VALUES")


def wrapped(sql: str, width: int) -> str:
    """``sql`` (``width`` columns) with each value as a pair: whether it is
    text, and the value (text as its bytes)."""
    names = ", ".join(f"c{i}" for i in range(width))
    pairs = ", ".join(
        f"typeof(c{i}) = 'text', CASE WHEN typeof(c{i}) = 'text' THEN CAST(c{i} AS BLOB)"
        f" ELSE c{i} END"
        for i in range(width)
    )
    return f"WITH _lossy ({names}) AS ({sql}) SELECT {pairs} FROM _lossy"


def rows(db: apsw.Connection, sql: str, args: Args) -> Generator[Row, None, None]:
    """The rows of the read ``sql``, its text decoded with U+FFFD for each
    byte that is not UTF-8; any other statement runs as it is."""
    if not sql.lstrip().upper().startswith(_READS):
        yield from db.execute(sql, args)
        return
    probe = db.execute(sql, args)
    try:
        width = len(probe.description)
    except apsw.ExecutionCompleteError:
        return  # no row at all
    finally:
        probe.close()
    for row in db.execute(wrapped(sql, width), args):
        yield tuple(
            row[i + 1].decode("utf-8", "replace") if row[i] else row[i + 1]
            for i in range(0, len(row), 2)
        )
