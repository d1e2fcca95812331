"""Translate a :class:`~streamd.eventlog.model.Filter` into a SQL WHERE fragment.

Values in, values out: no connection, no trio. The output is a list of
``(sql, args)`` conjuncts over the ``events`` columns ``app_name``, ``user_id``,
``session_id``, ``branch`` and ``author``; the caller ANDs them with its own
cursor (``seq > ?``), ordering and limit.

Prefixes are matched with byte-range comparisons, not ``LIKE``
---------------------------------------------------------------
The contract says a branch prefix ``p`` matches ``p`` itself and branches that
start ``p.`` or ``p/``, and that ``%``, ``_`` and any escape character in user
input match literally. The obvious spelling, ``branch LIKE 'p.%' ESCAPE '!'``, has
three faults in SQLite: LIKE folds ASCII case (prefix ``Agent`` would match
``agent.x``), it can use an index only under ``NOCASE`` or the deprecated
``case_sensitive_like`` pragma, and every metacharacter has to be escaped with an
escape character that itself has to be escaped.

Under SQLite's BINARY collation (memcmp of UTF-8), a string ``x`` starts with
``p.`` or ``p/`` exactly when ``p + "." <= x < p + "0"``, because ``.`` (0x2E) and
``/`` (0x2F) are adjacent and ``0`` (0x30) follows them. So a prefix becomes
``branch = ? OR (branch >= ? AND branch < ?)``: case-sensitive, an index range
scan, and with no pattern language at all, ``%``, ``_``, ``!`` and ``\\`` are
ordinary bytes that match only themselves. The session tree is the same trick
with ``:sub:`` and ``:sub;`` (``;`` follows ``:``), and an author suffix is
``substr(author, -n) = ?``.

Dialects
--------
The rules are written once; a :class:`Dialect` only spells them: SQLite's
(``?``, ``0`` for false, ``substr(author, -n) = ?``) is the default, and
:data:`POSTGRES` spells the same conjuncts ``%s``, ``false`` and
``right(author, n) = %s`` for the PostgreSQL store, whose key columns are
``COLLATE "C"`` (locale collations do not order by bytes), so the ranges mean
the same there; :data:`MYSQL` spells them as PostgreSQL does, on columns whose
collation is binary and pads nothing (MariaDB's ``utf8mb4_nopad_bin``, MySQL's
``utf8mb4_0900_bin``). A new rule therefore reaches every store, or fails to
render on none.

Text a database cannot hold
---------------------------
PostgreSQL text cannot hold U+0000, and the server refuses a parameter that
does, failing the whole read. No event there holds one, so a field naming one
matches nothing: :func:`where` renders the filter as the dialect's false
condition without sending the text (a branch prefix holding one leaves its
group), and the read answers as on SQLite and MySQL for a value no row has.

Omitted versus empty
--------------------
``None`` is "no restriction" for every field. Among ``branch_prefixes`` an empty
string is dropped (it would otherwise match every root-branch event); a group that
ends up empty matches nothing, because the caller asked for a branch restriction
and dropping blanks must never widen the query to everything. An empty
``author_suffix`` is no restriction, as the contract says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from streamd.eventlog.model import Filter

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Clause",
    "Dialect",
    "Matchable",
    "Segment",
    "branch_prefixes",
    "branch_segments",
    "matches",
    "prefix_bounds",
    "render",
    "where",
]

Clause = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True)
class Dialect:
    """How one SQL dialect spells the conjuncts of :func:`where`."""

    name: str
    param: str
    """The placeholder of one argument."""
    false: str
    """A condition no row meets."""
    greatest: str = "max"
    """The function of the larger of its arguments."""
    for_update: str = ""
    """What ends a SELECT that locks the rows it reads (SQLite: nothing, its
    write transaction already excludes every other writer)."""
    index_hints: bool = False
    """Whether ``INDEXED BY`` pins a read to an index (SQLite's planner
    guesses without statistics; PostgreSQL's has them)."""
    holds_nul: bool = True
    """Whether the database's text can hold U+0000 (PostgreSQL's cannot)."""
    loose_distinct: bool = False
    """Whether ``SELECT DISTINCT`` of an index's first column skips from key
    to key (MariaDB's and MySQL's loose index scan) instead of reading every
    entry."""
    force_index: bool = False
    """Whether ``FORCE INDEX`` makes a read a range of an index (MariaDB's
    planner takes equality on a key's first columns for the whole read, and
    walks every entry under them past a bound on the next)."""

    def indexed(self, table: str, index: str) -> str:
        """``table`` read through ``index``, where the dialect says so."""
        return f"{table} INDEXED BY {index}" if self.index_hints else table

    def ranged(self, table: str, index: str) -> str:
        """``table`` read as a range of ``index``: pinned where the dialect
        pins reads (:meth:`indexed`), forced where its planner would read the
        index otherwise (:attr:`force_index`)."""
        if self.force_index:
            return f"{table} FORCE INDEX ({index})"
        return self.indexed(table, index)

    def scanned(self, table: str) -> str:
        """``table`` read in its own order, where the dialect says so."""
        return f"{table} NOT INDEXED" if self.index_hints else table

    def cannot_hold(self, *texts: str | None) -> bool:
        """Whether one of ``texts`` is text this database cannot store (U+0000
        where it holds none). No row holds such a text, so a read naming it
        finds nothing, and answers so without sending it: a server refuses
        the parameter, and the read failed as if the database were down."""
        return not self.holds_nul and any(t is not None and "\x00" in t for t in texts)

    def placed(self, text: str) -> str:
        """``text`` as a bound of an order comparison (``>``) with stored
        texts: itself, or, where the database cannot hold it, its part before
        the first U+0000, which every text the database holds is greater than
        exactly when it is greater than ``text`` (in byte order, U+0000 is
        the least character; no stored text equals either)."""
        return text.partition("\x00")[0] if self.cannot_hold(text) else text

    def marked(self, param: str) -> Dialect:
        """The same dialect with another placeholder."""
        return replace(self, param=param)

    def sql(self, template: str) -> str:
        """``template`` with each ``{}`` a placeholder."""
        return template.replace("{}", self.param)

    def on_conflict_update(self, key: str, columns: Sequence[str]) -> str:
        """What ends an INSERT whose row, when ``key`` already holds one, sets
        ``columns`` of that row to the values given instead."""
        if self.name == "mysql":
            # VALUES(): MariaDB has no row alias, MySQL 8 still takes this.
            return " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in columns)
        sets = ", ".join(f"{c} = excluded.{c}" for c in columns)
        return f" ON CONFLICT ({key}) DO UPDATE SET {sets}"

    def ends_with(self, column: str, suffix: str) -> Clause:
        """``column`` ends with ``suffix`` (counted in characters, as len() is)."""
        if self.name in ("postgres", "mysql"):
            return f"right({column}, {self.param}) = {self.param}", (len(suffix), suffix)
        return f"substr({column}, {self.param}) = {self.param}", (-len(suffix), suffix)


SQLITE = Dialect("sqlite", param="?", false="0", index_hints=True)
POSTGRES = Dialect(
    "postgres", param="%s", false="false", greatest="greatest", for_update=" FOR UPDATE",
    holds_nul=False,
)
MYSQL = Dialect(
    "mysql", param="%s", false="FALSE", greatest="GREATEST", for_update=" FOR UPDATE",
    loose_distinct=True, force_index=True,
)

# Every branch that continues a prefix at a segment boundary lies in
# [prefix + _SEGMENT_LOW, prefix + _SEGMENT_HIGH): '.' and '/' are adjacent bytes.
_SEGMENT_LOW = "."
_SEGMENT_HIGH = "0"
assert ord(_SEGMENT_HIGH) == ord("/") + 1 == ord(".") + 2

_SUB_MARK = ":sub:"
_SUB_MARK_END = ":sub;"  # ';' is the byte after ':'


def prefix_bounds(prefix: str) -> tuple[str, str]:
    """Half-open bounds of the branches below ``prefix`` (not ``prefix`` itself)."""
    return prefix + _SEGMENT_LOW, prefix + _SEGMENT_HIGH


def branch_prefixes(prefixes: Sequence[str]) -> list[str]:
    """The prefixes that take part in the OR group: blanks dropped, order kept,
    repeats removed (they would only repeat an index probe)."""
    return list(dict.fromkeys(p for p in prefixes if p))


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch of branch labels, in byte order: from ``low`` (itself
    included unless ``low_open``) up to ``high`` (itself included when
    ``high_closed``; None: no end)."""

    low: str
    high: str | None
    high_closed: bool = False
    low_open: bool = False

    def below(self, other: Segment) -> bool:
        """Whether this segment ends before ``other`` begins (they neither
        overlap nor touch: no label lies in both, and none between them is
        left out by joining them)."""
        if self.high is None:
            return False
        if self.high != other.low:
            return self.high < other.low
        return not self.high_closed and other.low_open


def branch_segments(flt: Filter | None, dialect: Dialect = SQLITE) -> list[Segment]:
    """The branch labels ``flt``'s ``branch_prefixes`` admit, as disjoint
    segments in ascending order, the empty label never among them (every
    non-empty label when the filter names no prefix; none when its group is
    left empty). A prefix ``p`` is the point ``p`` and the range of its
    children (:func:`prefix_bounds`); a prefix under another falls inside the
    other's range and is merged into it, so no label is walked twice."""
    if flt is None or flt.branch_prefixes is None:
        return [Segment("", None, low_open=True)]
    pieces: list[Segment] = []
    for p in branch_prefixes(flt.branch_prefixes):
        if dialect.cannot_hold(p):
            continue  # it starts no stored branch (see where)
        low, high = prefix_bounds(p)
        pieces += [Segment(p, p, high_closed=True), Segment(low, high)]
    pieces.sort(key=lambda s: s.low)
    merged: list[Segment] = []
    for piece in pieces:
        if not merged or merged[-1].below(piece):
            merged.append(piece)
            continue
        last = merged[-1]
        if last.high is not None and (
            piece.high is None or (piece.high, piece.high_closed) > (last.high, last.high_closed)
        ):
            merged[-1] = Segment(last.low, piece.high, piece.high_closed, last.low_open)
    return merged


def where(flt: Filter | None, dialect: Dialect = SQLITE) -> list[Clause]:
    """The conjuncts for ``flt`` in ``dialect``; an empty list means "every event"."""
    if flt is None:
        return []
    # The flag first: only PostgreSQL's text cannot hold U+0000, and every
    # filtered read and watch check comes here.
    if not dialect.holds_nul and dialect.cannot_hold(*_matched_exactly(flt)):
        return [(dialect.false, ())]
    q = dialect.sql
    clauses: list[Clause] = []
    if flt.session_tree is not None:
        # The tree names its own (app, user); it takes precedence over the
        # app/user/session equality fields rather than being ANDed with them.
        tree = flt.session_tree
        clauses.append((q("app_name = {}"), (tree.app,)))
        clauses.append((q("user_id = {}"), (tree.user,)))
        clauses.append(
            (
                q("(session_id = {} OR (session_id >= {} AND session_id < {}))"),
                (tree.parent, tree.parent + _SUB_MARK, tree.parent + _SUB_MARK_END),
            )
        )
    else:
        if flt.app is not None:
            clauses.append((q("app_name = {}"), (flt.app,)))
        if flt.user is not None:
            clauses.append((q("user_id = {}"), (flt.user,)))
        if flt.session is not None:
            clauses.append((q("session_id = {}"), (flt.session,)))
    if flt.branch_prefixes is not None:
        # A prefix the database cannot hold starts no stored branch: it leaves
        # the group as a blank does, and a group left empty matches nothing.
        prefixes = [p for p in branch_prefixes(flt.branch_prefixes) if not dialect.cannot_hold(p)]
        if not prefixes:
            clauses.append((dialect.false, ()))
        else:
            terms: list[str] = []
            args: list[Any] = []
            for p in prefixes:
                low, high = prefix_bounds(p)
                terms.append(q("branch = {} OR (branch >= {} AND branch < {})"))
                args.extend((p, low, high))
            clauses.append(("(" + " OR ".join(terms) + ")", tuple(args)))
    if flt.author is not None:
        clauses.append((q("author = {}"), (flt.author,)))
    if flt.author_suffix:
        # Counted in characters on both, as len() does, so multi-byte suffixes work.
        clauses.append(dialect.ends_with("author", flt.author_suffix))
    return clauses


def scans_the_log(flt: Filter | None) -> bool:
    """Whether a read of the events ``flt`` matches, in seq order, may cost in
    proportion to the whole log rather than to its answer: no filter walks the
    primary key from its cursor, and one session (or one session tree) is a
    range of ``events_by_session``; any other filter (an app, a user, an
    author, branch prefixes) may walk, or sort, rows of the whole log."""
    if flt is None or flt.session_tree is not None:
        return False
    return flt.app is None or flt.user is None or flt.session is None


def only_branches(flt: Filter | None) -> bool:
    """Whether ``flt`` restricts the branch and nothing else."""
    return (
        flt is not None
        and flt.branch_prefixes is not None
        and flt.session_tree is None
        and flt.app is None
        and flt.user is None
        and flt.session is None
        and flt.author is None
        and not flt.author_suffix
    )


def in_session_order(flt: Filter | None) -> bool:
    """Whether ``events_by_session (app_name, user_id, session_id, seq)``
    holds every field ``flt`` tests, in a range that is not in seq order: an
    app, or an app and a user (one session's range is in seq order already; a
    session tree is a few ranges of it, which SQLite reads as such only when
    it may read the rows too)."""
    if flt is None or flt.session_tree is not None or flt.app is None:
        return False
    if flt.branch_prefixes is not None or flt.author is not None or flt.author_suffix:
        return False
    return flt.session is None or flt.user is None


def _matched_exactly(flt: Filter) -> list[str | None]:
    """The texts of ``flt`` that a matching event's must equal, start or end
    with (the branch prefixes aside: they are an OR group). The session tree
    names its own (app, user), and then the app/user/session fields are not
    read."""
    tree = flt.session_tree
    keys = [tree.app, tree.user, tree.parent] if tree else [flt.app, flt.user, flt.session]
    return [*keys, flt.author, flt.author_suffix]


def render(clauses: Sequence[Clause], extra: Sequence[Clause] = ()) -> tuple[str, tuple[Any, ...]]:
    """Join conjuncts into ``"a AND b"`` plus their args (``"true"`` when none:
    a boolean in every dialect, where PostgreSQL refuses ``1``)."""
    parts = [*extra, *clauses]
    if not parts:
        return "true", ()
    sql = " AND ".join(part for part, _ in parts)
    args: tuple[Any, ...] = ()
    for _, a in parts:
        args += a
    return sql, args


class Matchable(Protocol):
    """The fields of an entry that a filter reads."""

    @property
    def app(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def session(self) -> str: ...
    @property
    def branch(self) -> str: ...
    @property
    def author(self) -> str: ...


def matches(flt: Filter | None, entry: Matchable) -> bool:
    """Whether ``entry`` passes ``flt``: :func:`where` evaluated in Python, for
    entries the watch fan-out hands over from memory. It must agree with the
    SQL exactly; Python compares strings by code point, which is the byte
    order of their UTF-8, so the range trick of the SQL is a plain prefix test
    here."""
    if flt is None:
        return True
    tree = flt.session_tree
    if tree is not None:
        if entry.app != tree.app or entry.user != tree.user:
            return False
        s = entry.session
        if s != tree.parent and not s.startswith(tree.parent + _SUB_MARK):
            return False
    else:
        if flt.app is not None and entry.app != flt.app:
            return False
        if flt.user is not None and entry.user != flt.user:
            return False
        if flt.session is not None and entry.session != flt.session:
            return False
    if flt.branch_prefixes is not None:
        b = entry.branch
        if not any(
            b == p or b.startswith(p + ".") or b.startswith(p + "/")
            for p in branch_prefixes(flt.branch_prefixes)
        ):
            return False
    if flt.author is not None and entry.author != flt.author:
        return False
    return not (flt.author_suffix and not entry.author.endswith(flt.author_suffix))
