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
from streamd.eventlog.store import branches, rows, rules
from streamd.eventlog.store.backend import Committed, EventRow, ReadShape
from streamd.eventlog.store.sql import MAX_SEQ, Args, Sql

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
    matched, without a count.

    SQLite's planner has no statistics (see ``events_source``), and two
    filters are read there in a way of their own, for the same rows:

    * **An app, or an app's user** (:func:`filters.in_session_order`): the
      page's seqs are chosen in ``events_by_session`` alone, then its rows read
      by seq. Sorted whole, the range's rows were read, content and all, to
      keep a page of them: for a user of a million-event log (10,000 events)
      19-47 ms, now 6-10 ms; for an app of all of it 190-320 ms, now 90-120 ms.
    * **Branch prefixes alone**: each label under them (the walk of
      :mod:`~streamd.eventlog.store.branches`) gives its first ``limit + 1``
      seqs after the cursor, in order in ``events_by_branch`` already, and the
      page is the least of those: at most that many index entries a label.
      Read as one range, every event under the prefixes was read and sorted:
      65-175 ms for a label of half a million events, now 1.5-4.5 ms.

    PostgreSQL's and MariaDB's planners choose well for these filters, and
    less well for these statements: on PostgreSQL the first made an app that
    fills the log 5 ms slower (a join where the primary key was read), the
    second ran each label's bound once per row (0.2 s).
    """
    clauses = filters.where(flt, db.dialect)
    if not clauses:
        sql = f"SELECT {rows.ENTRY_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
        return sql, (from_seq, limit + 1)
    source = db.events_source(flt, from_seq)
    where, args = filters.render(clauses, [("seq > ?", (from_seq,))])
    # Only where the backend names the index it reads (SQLite), and not when
    # it reads the primary key from a cursor near the newest seq, which costs
    # less than either.
    if db.dialect.index_hints:
        by_branch = source == db.dialect.indexed("events", "events_by_branch")
        segments = filters.branch_segments(flt, db.dialect)
        if by_branch and filters.only_branches(flt) and segments:
            return _label_by_label(db, from_seq, segments, limit)
        by_session = source == db.dialect.indexed("events", "events_by_session")
        if by_session and filters.in_session_order(flt):
            page = f"SELECT seq FROM {source} WHERE {where} ORDER BY seq LIMIT ?"
            sql = (
                f"SELECT {rows.ENTRY_COLUMNS} FROM events"
                f" WHERE seq IN (SELECT seq FROM ({page}) AS page) ORDER BY seq"
            )
            return sql, (*args, limit + 1)
    sql = f"SELECT {rows.ENTRY_COLUMNS} FROM {source} WHERE {where} ORDER BY seq LIMIT ?"
    return sql, (*args, limit + 1)


def _label_by_label(
    db: Sql, from_seq: int, segments: list[filters.Segment], limit: int
) -> tuple[str, Args]:
    """:func:`since_query` for branch prefixes: the first ``limit + 1`` seqs
    of each label after ``from_seq`` (those up to the label's
    ``limit + 1``-th), the least ``limit + 1`` of them, then their rows. At
    most that many index entries a label, and never more than the labels
    hold after the cursor."""
    ctes: list[str] = []
    args: list[object] = []
    for i, segment in enumerate(segments):
        cte, cte_args = branches.walk_cte(db, f"walk{i}", segment, None, None)
        ctes.append(cte)
        args += cte_args
    labels = " UNION ALL ".join(
        f"SELECT branch FROM walk{i} WHERE branch IS NOT NULL" for i in range(len(segments))
    )
    by_branch = db.dialect.indexed("events", "events_by_branch")
    last = (
        f"(SELECT seq FROM {by_branch} WHERE branch = labels.branch AND seq > ?"
        " ORDER BY seq LIMIT 1 OFFSET ?)"
    )
    sql = (
        f"WITH RECURSIVE {', '.join(ctes)}, labels (branch) AS ({labels})"
        f" SELECT {rows.ENTRY_COLUMNS} FROM events WHERE seq IN ("
        f"SELECT events.seq FROM labels JOIN {by_branch} ON events.branch = labels.branch"
        f" AND events.seq > ? AND events.seq <= coalesce({last}, ?))"
        " ORDER BY seq LIMIT ?"
    )
    return sql, (*args, from_seq, from_seq, limit, MAX_SEQ, limit + 1)


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
