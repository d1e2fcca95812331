"""Reads of the log by filter: ``since`` and the newest seqs (the branches
are :mod:`~streamd.eventlog.store.branches`).

A filter becomes SQL once (:mod:`streamd.eventlog.filters`, in the
connection's dialect); which access path answers it is the backend's
business (:meth:`~streamd.eventlog.store.sql.Sql.events_source`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing

from streamd.errors import invalid_params
from streamd.eventlog import filters
from streamd.eventlog.model import Filter, SinceParams, SinceResult
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.backend import Committed, EventRow, ReadShape
from streamd.eventlog.store.sql import Args, Sql

__all__ = [
    "EVENT_ROWS_AFTER",
    "EVENT_ROW_COLUMNS",
    "event_rows",
    "event_rows_at",
    "latest_seq",
    "newest_removal",
    "nth_newest_seq",
    "removed_after",
    "since",
    "since_committed",
    "since_query",
]

EVENT_ROW_COLUMNS = (
    "seq, app_name, user_id, session_id, event_id, invocation_id, author, branch, "
    "event_time, content, state_delta"
)

# ``event_rows``' statement: (from_seq, limit).
EVENT_ROWS_AFTER = f"SELECT {EVENT_ROW_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"

# How many seqs one ``IN`` list names: far below every server's limit on
# placeholders, and an answer renders tens.
_AT_MOST = 500


def since_query(db: Sql, from_seq: int, flt: Filter | None, limit: int) -> tuple[str, Args]:
    """The SELECT of :func:`since`; one row past the limit tells whether more
    matched, without a count."""
    clauses = filters.where(flt, db.dialect)
    source = db.events_source(flt, from_seq) if clauses else "events"
    where, args = filters.render(clauses, [("seq > ?", (from_seq,))])
    sql = f"SELECT {rows.ENTRY_COLUMNS} FROM {source} WHERE {where} ORDER BY seq LIMIT ?"
    return sql, (*args, limit + 1)


def since(db: Sql, p: SinceParams, shape: ReadShape) -> SinceResult:
    """Up to ``limit`` matching entries after ``from_seq``, and (given
    ``shape.max_bytes``) no more than fit in that many bytes on the wire; a
    page cut short by either has ``caught_up`` false."""
    from_seq, limit = p.from_seq, p.limit
    rules.check_limit(limit)
    with closing(db.scan(*since_query(db, from_seq, p.filter, limit))) as found:
        entries, last, more = rows.take(found, limit, shape.entries, shape.max_bytes)
    return SinceResult(
        entries=entries, next_seq=from_seq if last is None else last, caught_up=not more
    )


def since_committed(
    db: Sql, from_seq: int, flt: Filter | None, limit: int, max_bytes: int
) -> tuple[list[Committed], bool]:
    """:func:`since` as a watch reads it: the entries as :class:`Committed`
    (encoded once, with the fields the fan-out filters on), and whether the
    page reached the end of the log."""
    rules.check_limit(limit)
    with closing(db.scan(*since_query(db, from_seq, flt, limit))) as found:
        entries, _, more = rows.take(found, limit, "committed", max_bytes)
    return entries, not more


def latest_seq(db: Sql, flt: Filter | None) -> int:
    where, args = filters.render(filters.where(flt, db.dialect))
    row = db.one(
        f"SELECT seq FROM {db.events_source(flt, None)} WHERE {where} ORDER BY seq DESC LIMIT 1",
        args,
    )
    return row[0] if row else 0


def nth_newest_seq(db: Sql, flt: Filter | None, offset: int) -> int:
    """The seq ``offset`` places behind the newest matching entry (0 = the
    newest), or 0 when fewer match: where ``tail -n`` starts. It counts the
    filtered rows themselves, because seqs are global and a busy sibling
    session would make ``latest - n`` cut a quiet session's history short."""
    if offset < 0:
        raise invalid_params(f"offset must not be negative, not {offset}")
    where, args = filters.render(filters.where(flt, db.dialect))
    row = db.one(
        f"SELECT seq FROM {db.events_source(flt, None)} WHERE {where}"
        " ORDER BY seq DESC LIMIT 1 OFFSET ?",
        (*args, offset),
    )
    return row[0] if row else 0


def event_rows(db: Sql, from_seq: int, limit: int) -> list[EventRow]:
    """Up to ``limit`` events after ``from_seq``, in seq order, as rows."""
    rules.check_limit(limit)
    return db.rows(EVENT_ROWS_AFTER, (from_seq, limit))


def event_rows_at(db: Sql, seqs: Sequence[int]) -> list[EventRow]:
    """The events still stored at ``seqs`` (at most 500), in seq order."""
    if len(seqs) > _AT_MOST:
        raise invalid_params(f"at most {_AT_MOST} seqs at once, not {len(seqs)}")
    if not seqs:
        return []
    marks = ", ".join("?" * len(seqs))
    return db.rows(
        f"SELECT {EVENT_ROW_COLUMNS} FROM events WHERE seq IN ({marks}) ORDER BY seq",
        tuple(seqs),
    )


def removed_after(db: Sql, mark: int, limit: int) -> list[tuple[int, int]]:
    """(mark, seq) of up to ``limit`` removed events recorded after ``mark``:
    what retention and session deletes took, in the order they took it."""
    rules.check_limit(limit)
    return db.rows(
        "SELECT mark, seq FROM removed_events WHERE mark > ? ORDER BY mark LIMIT ?", (mark, limit)
    )


def newest_removal(db: Sql) -> tuple[int, int]:
    """The newest and the oldest mark still recorded (0, 0 when none is)."""
    row = db.one("SELECT max(mark), min(mark) FROM removed_events")
    return (row[0] or 0, row[1] or 0) if row else (0, 0)
