"""The distinct branch labels of the log (``eventlog/branches``), without reading the log.

A walk, not a scan
------------------
``SELECT DISTINCT branch FROM events WHERE app_name = ?`` read every event of
the app, each by a seek: at a million events it took 4.6 s
(``bench/eventlog_scale.py``) to find two labels. The labels are the keys of
``events_by_branch (branch, seq)``, so they are walked instead, each step one
seek for the least label above the one before (a loose index scan): the walk
costs a seek per distinct label, whatever the number of events under each.
SQLite and PostgreSQL take it as a recursive CTE; MariaDB runs such a CTE's
step as a read of the whole index (its subquery cannot seek to a value of the
row around it), but skips through the index by itself for a ``DISTINCT``
(:attr:`~streamd.eventlog.filters.Dialect.loose_distinct`). The filter's
branch prefixes bound the walk (:func:`~streamd.eventlog.filters.branch_segments`);
the empty label is never walked.

The other fields of a filter
----------------------------
A label is in the answer when one of its events passes the rest of the
filter. Which read decides that is chosen by the filter:

* **One session (or session tree)**: its events are a range of
  ``events_by_session``; their labels cost what the session holds.
* **Nothing but prefixes**: every walked label is in the answer.
* **Anything else** (an app, a user, an author, a suffix): each walked label
  is *probed*: its first :attr:`Costs.probe` events are tested. A hit decides
  it, and so does a label with no more events than that. A label with more
  and no hit among them (one that other apps or other authors fill: the
  worst case) decides nothing, and then one read answers the whole call: the
  app's (or user's) range of ``events_by_session`` when the filter names its
  app and that range is small, else one pass over the table in its own order.

Probes are seeks, and a row read by a seek costs several read by a pass over
the table (:attr:`Costs.scan_share`, measured); so the probes of one call
stop at the rows a pass would cost, and, when the filter names an app, at
the rows its range holds (counted in the index alone, only as far as the
probes have gone). A call therefore costs at most a few passes over the log,
where the scan it replaces read every event by a seek, out of table order
(3-15 s at a million events for an app and an author no event has), and, when
each label's first events decide it, a few rows per label.

The walk takes a stretch of labels per statement, and the statements of one
call run in one snapshot: the answer is of one state of the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from streamd.eventlog import filters
from streamd.eventlog.filters import Segment
from streamd.eventlog.model import Filter
from streamd.eventlog.store import rules
from streamd.eventlog.store.sql import Args, Sql

__all__ = ["COSTS", "Costs", "branches", "probe_sql", "walk_cte", "walk_sql"]


@dataclass(frozen=True, slots=True)
class Costs:
    """What the plans of :func:`branches` are tuned by."""

    probe: int = 64
    """Events of one label tested before it is left undecided."""
    scan_share: int = 8
    """How many rows a pass over the table reads in the time a seek reads one
    (at a million events, SQLite read them in about 0.5 µs by a pass and 4 to
    15 µs through ``events_by_session``)."""
    first_steps: int = 16
    """Labels walked by a call's first statement: most logs hold few, and a
    probing walk counts the app's range only as far as its next stretch may
    probe. Each later stretch is four times longer, up to :attr:`steps`."""
    steps: int = 100
    """Labels walked (and probed) per statement at most: a probe statement
    holds a ``UNION ALL`` arm per label, and SQLite takes 500 at most."""


COSTS = Costs()


def branches(
    db: Sql, flt: Filter | None, limit: int | None, costs: Costs | None = None
) -> list[str]:
    if limit is not None:
        rules.check_limit(limit)
    costs = costs or COSTS
    if _pins_a_session(flt):
        return _distinct(db, flt, limit, db.dialect.indexed("events", "events_by_session"))
    rest = filters.where(
        None if flt is None else msgspec.structs.replace(flt, branch_prefixes=None), db.dialect
    )
    if any(text == db.dialect.false for text, _ in rest):
        return []  # a text no event can hold (see filters.where)
    segments = filters.branch_segments(flt, db.dialect)
    with db.snapshot():
        if flt is None or not rest:
            found: list[str] = []
            for stretch in _stretches(db, segments, costs, limit):
                found += stretch[: None if limit is None else limit - len(found)]
                if len(found) == limit:
                    break
            return found
        return _probed(db, flt, segments, limit, filters.render(rest), costs)


def _pins_a_session(flt: Filter | None) -> bool:
    return flt is not None and (
        flt.session_tree is not None
        or (flt.app is not None and flt.user is not None and flt.session is not None)
    )


def _distinct(db: Sql, flt: Filter | None, limit: int | None, source: str) -> list[str]:
    """The labels of the events ``flt`` names, read from ``source``."""
    where, args = filters.render(filters.where(flt, db.dialect), [("branch <> ''", ())])
    sql = f"SELECT DISTINCT branch FROM {source} WHERE {where} ORDER BY branch"
    if limit is not None:
        sql += " LIMIT ?"
        args = (*args, limit)
    return [r[0] for r in db.rows(sql, args)]


def _stretches(
    db: Sql, segments: list[Segment], costs: Costs, limit: int | None = None
) -> Iterator[list[str]]:
    """The labels of ``segments`` in ascending order, a statement's stretch
    at a time (none empty)."""
    for segment in segments:
        after: str | None = None
        steps = costs.first_steps if limit is None else min(costs.first_steps, limit)
        while True:
            labels = [r[0] for r in db.rows(*walk_sql(db, segment, after, steps))]
            if labels:
                yield labels
            if len(labels) < steps:
                break
            after, steps = labels[-1], min(costs.steps, 4 * steps)


def _probed(
    db: Sql,
    flt: Filter,
    segments: list[Segment],
    limit: int | None,
    rest: tuple[str, Args],
    costs: Costs,
) -> list[str]:
    """The walked labels whose probe hits, while the probes cost less than
    the read that answers once one is undecided (see the module's essay)."""
    budget = _span(db) // costs.scan_share
    app_range = None if flt.app is None else _Range(db, flt.app, flt.user)

    def answer_by_read() -> list[str]:
        if app_range is not None and not app_range.holds(budget + 1):
            return _distinct(db, flt, limit, db.dialect.indexed("events", "events_by_session"))
        return _distinct(db, flt, limit, db.dialect.scanned("events"))

    found: list[str] = []
    probed = 0
    for labels in _stretches(db, segments, costs):
        probed += len(labels) * costs.probe
        if probed > budget or (app_range is not None and not app_range.holds(probed)):
            return answer_by_read()
        for label, (_, hits, beyond) in zip(
            labels, db.rows(*probe_sql(db, labels, rest, costs.probe)), strict=True
        ):
            if hits == 1:
                found.append(label)
                if len(found) == limit:
                    return found
            elif beyond is not None:
                return answer_by_read()  # undecided
    return found


def _span(db: Sql) -> int:
    """How many seqs lie between the oldest and the newest event: at least
    the number of events, from two seeks of the primary key (``min`` and
    ``max`` in one SELECT would make SQLite read the whole index)."""
    row = db.one(
        "SELECT (SELECT seq FROM events ORDER BY seq LIMIT 1),"
        " (SELECT seq FROM events ORDER BY seq DESC LIMIT 1)"
    )
    if row is None or row[0] is None:
        return 0
    return int(row[1]) - int(row[0]) + 1


class _Range:
    """How many events the app's (or the user's) range of ``events_by_session``
    holds, counted only as far as asked, in the index alone."""

    def __init__(self, db: Sql, app: str, user: str | None) -> None:
        self._db = db
        self._key = (app,) if user is None else (app, user)
        self._at_least = 0
        self._exactly: int | None = None

    def holds(self, n: int) -> bool:
        """Whether the range holds at least ``n`` events. Each count goes at
        least twice as far as the one before, so all of them together read
        at most twice the index entries the last one did."""
        if self._exactly is not None:
            return self._exactly >= n
        if self._at_least >= n:
            return True
        cap = max(n, 2 * self._at_least)
        key = " AND ".join(("app_name = ?", "user_id = ?")[: len(self._key)])
        source = self._db.dialect.indexed("events", "events_by_session")
        row = self._db.one(
            f"SELECT count(*) FROM (SELECT 1 AS one FROM {source} WHERE {key} LIMIT ?) AS r",
            (*self._key, cap),
        )
        counted = int(row[0]) if row else 0
        if counted < cap:
            self._exactly = counted
        self._at_least = counted
        return counted >= n


def walk_sql(db: Sql, segment: Segment, after: str | None, steps: int) -> tuple[str, Args]:
    """Up to ``steps`` labels of ``segment`` above ``after`` (from its start
    when None), in ascending order, one seek in ``events_by_branch`` each."""
    if db.dialect.loose_distinct:
        start, high, bounds = _bounds(segment, after)
        return (
            f"SELECT DISTINCT branch FROM events WHERE {start}{high} ORDER BY branch LIMIT ?",
            (*bounds, steps),
        )
    cte, args = walk_cte(db, "walk", segment, after, steps)
    return (
        f"WITH RECURSIVE {cte} SELECT branch FROM walk WHERE branch IS NOT NULL ORDER BY n",
        args,
    )


def walk_cte(
    db: Sql, name: str, segment: Segment, after: str | None, steps: int | None
) -> tuple[str, Args]:
    """The recursive CTE ``name (branch, n)`` of :func:`walk_sql`'s labels
    (its last row's branch NULL), every one of them when ``steps`` is None;
    for a dialect whose recursive step seeks (not
    :attr:`~streamd.eventlog.filters.Dialect.loose_distinct`)."""
    start, high, args = _bounds(segment, after)
    by_branch = db.dialect.indexed("events", "events_by_branch")
    bound = "" if steps is None else " AND n < ?"
    cte = (
        f"{name} (branch, n) AS ("
        f"SELECT (SELECT branch FROM {by_branch} WHERE {start}{high}"
        " ORDER BY branch LIMIT 1), 1"
        " UNION ALL "
        f"SELECT (SELECT branch FROM {by_branch} WHERE branch > {name}.branch{high}"
        " ORDER BY branch LIMIT 1), n + 1"
        f" FROM {name} WHERE {name}.branch IS NOT NULL{bound})"
    )
    high_args = args[1:]
    return cte, (*args, *high_args, *(() if steps is None else (steps,)))


def _bounds(segment: Segment, after: str | None) -> tuple[str, str, tuple[str, ...]]:
    """The first label's condition, the last's, and their args in that order."""
    if after is not None:
        start, low = "branch > ?", after
    else:
        start, low = ("branch > ?" if segment.low_open else "branch >= ?"), segment.low
    if segment.high is None:
        return start, "", (low,)
    high = " AND branch <= ?" if segment.high_closed else " AND branch < ?"
    return start, high, (low, segment.high)


_FILTERED = "app_name, user_id, session_id, author"
"""The columns the filter tests beside the branch (see filters.where)."""


def probe_sql(
    db: Sql, labels: list[str], rest: tuple[str, Args], probe: int
) -> tuple[str, Args]:
    """A row per label, in order: whether one of its first ``probe`` events
    passes ``rest`` (1, else 0), and the seq of its next event (NULL when it
    has no more).

    Each label is a constant of its own ``UNION ALL`` arm, and its first
    events a ``LIMIT`` of its range of ``events_by_branch``: a planner then
    has one way in. Correlated to a walk, the same test made PostgreSQL read
    the app's range of ``events_by_session`` (or the primary key) up to the
    label's last probed seq, and compile the statement (JIT) for that
    estimate, 0.3 s at a million events; and MariaDB reads every entry of
    the label for a bound on seq that comes from the row around it."""
    where, args = rest
    by_branch = db.dialect.indexed("events", "events_by_branch")
    arm = (
        "SELECT ? AS i, CASE WHEN EXISTS (SELECT 1 FROM"
        f" (SELECT {_FILTERED} FROM {by_branch} WHERE branch = ? ORDER BY seq LIMIT ?) AS probed"
        f" WHERE {where}) THEN 1 ELSE 0 END,"
        f" (SELECT seq FROM {by_branch} WHERE branch = ? ORDER BY seq LIMIT 1 OFFSET ?)"
    )
    sql = " UNION ALL ".join([arm] * len(labels)) + " ORDER BY 1"
    values: list[object] = []
    for i, label in enumerate(labels):
        values += [i, label, probe, *args, label, probe]
    return sql, values
