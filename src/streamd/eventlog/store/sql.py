"""The connection as the storage rules use it: statements in, rows out.

The rules (:mod:`.sessions`, :mod:`.state`, :mod:`.leases`, :mod:`.boots`,
:mod:`.retention`, :mod:`.reads`) are written once, against :class:`Sql`, and
each backend gives them one: APSW's or psycopg's connection behind the same
few calls. What the protocol asks for is what truly differs between the
databases and nothing more:

* **Statements are written with ``?``.** SQLite takes them as they are; the
  PostgreSQL and MySQL connections turn each into ``%s`` (once per statement
  text, then from a cache), so a rule is one string for all three. The rules never use ``?``
  or ``%`` for anything else.
* **Spellings** that differ go through :attr:`Sql.dialect`
  (:class:`~streamd.eventlog.filters.Dialect`: a false condition, ``max`` or
  ``greatest``, row locks, index hints, a suffix test, an upsert); what is
  more than a spelling is a method here (an insert's generated id, an insert
  unless the key exists, a delete that says what it deleted: MySQL has no
  ``RETURNING`` and cannot delete from a table it reads in a subquery; an
  update of many rows by key that says which matched).
* **Transactions.** :meth:`Sql.write` is one write transaction (SQLite's
  ``BEGIN IMMEDIATE``, PostgreSQL's ``BEGIN``); ``single=True`` says the block
  is one statement, which PostgreSQL runs as its own transaction in autocommit
  (one round trip instead of three); ``removes=True`` that it deletes events,
  whose removal marks must commit in mark order. :meth:`Sql.snapshot` is a read
  transaction in which several statements see one state of the log.
* **The log's clock and counter.** :meth:`Sql.newest_seq` is the newest seq
  ever given (SQLite's ``sqlite_sequence``, PostgreSQL's ``seq_counter``,
  locked when asked so that state merges never interleave);
  :meth:`Sql.lease_now` is the time leases are judged by (the caller's
  ``now_us``, or PostgreSQL's own clock).
* **Which driver errors mean what.** :attr:`Sql.duplicate_key` (a unique key
  refused the row) and :attr:`Sql.bad_value` (the database refused a value),
  :meth:`Sql.describe` for a message without secrets.

Values only: no Trio, no driver import.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from streamd.eventlog.filters import Dialect
from streamd.eventlog.model import Filter

__all__ = ["MAX_SEQ", "Args", "Row", "Sql", "paged"]

Row = tuple[Any, ...]
Args = Sequence[Any]


class Rows(Protocol):
    """Rows read as far as they are used, and closed when their reader stops
    early (a reply cut by bytes reads no row beyond the cut): a driver's cursor
    or a generator."""

    def __iter__(self) -> Iterator[Row]: ...

    def __next__(self) -> Row: ...

    def close(self) -> None: ...
MAX_SEQ = 2**63 - 1
"""Larger than any seq: "keep nothing back"."""


class Sql(Protocol):
    """One connection of one backend, as the storage rules use it."""

    @property
    def dialect(self) -> Dialect:
        """How this database spells what differs (its ``param`` is ``?``)."""
        ...

    @property
    def duplicate_key(self) -> tuple[type[BaseException], ...]:
        """The driver errors of a row refused by a unique key."""
        ...

    @property
    def bad_value(self) -> tuple[type[BaseException], ...]:
        """The driver errors of a value the database refused (a check, a type)."""
        ...

    def rows(self, sql: str, args: Args = ()) -> list[Row]:
        """Every row of one statement."""
        ...

    def one(self, sql: str, args: Args = ()) -> Row | None:
        """The first row of one statement, or None."""
        ...

    def run(self, sql: str, args: Args = ()) -> int:
        """Run one statement; the rows it changed."""
        ...

    def insert_id(self, sql: str, args: Args = ()) -> int:
        """Run an INSERT of one row into a table keyed by a generated ``id``;
        that id (``RETURNING id`` where the database has it, the driver's last
        insert id where it does not)."""
        ...

    def insert_absent(self, sql: str, args: Args = ()) -> bool:
        """Run an INSERT of at most one row unless a row with its key exists
        (a unique key refuses it); whether it was inserted. Never an error
        for the existing key, and the transaction goes on either way."""
        ...

    def delete_returning(self, table: str, key: str, select: str, args: Args = ()) -> list[int]:
        """Delete the rows of ``table`` whose ``key`` is among the first column
        of ``select``'s rows (which may be ordered and limited); the keys
        deleted. Inside a write transaction."""
        ...

    def update_each(
        self, table: str, assignment: str, args: Args, columns: Sequence[str], keys: Sequence[Row]
    ) -> list[bool]:
        """``UPDATE table SET assignment`` (its ``?`` bound to ``args``) on the
        row whose ``columns`` (texts) equal each of ``keys``; for each key, in
        order, whether it matched a row (a key given twice answers alike).
        Inside a write transaction. In as few round trips as the database
        allows, since a log's heartbeats are thousands of keys a tick."""
        ...

    def delete_each(self, table: str, columns: Sequence[str], keys: Sequence[Row]) -> int:
        """``DELETE FROM table`` the row whose ``columns`` (texts) equal each of
        ``keys``; how many rows went. Inside a write transaction, in as few
        round trips as :meth:`update_each` takes: a log's close releases
        thousands of leases, within a grace."""
        ...

    def scan(self, sql: str, args: Args = ()) -> Rows:
        """The rows of one statement, read as the consumer takes them; closing
        the iterator stops the read (rows past a byte budget are never
        fetched where the driver allows)."""
        ...

    def scan_events(
        self, select: Callable[[int], tuple[str, Args]], after: int
    ) -> Rows:
        """The rows of ``select(after)`` (events after a seq, seq first, in
        seq order, no LIMIT), read lazily; a driver that fetches a whole
        result at once reads pages instead, each ``select(last seq read)``."""
        ...

    def events_source(self, flt: Filter | None, from_seq: int | None) -> str:
        """The FROM of a filtered read of events: after ``from_seq`` in seq
        order, or (None) from the newest back. SQLite names the index that
        answers it (its planner guesses without statistics); PostgreSQL's
        planner has them, so there it is ``events``."""
        ...

    def write(self, single: bool = False, removes: bool = False) -> AbstractContextManager[object]:
        """One write transaction; ``single``: the block is one statement.
        ``removes``: the block deletes events, so it records removal marks,
        and it keeps every other such writer from recording one until it
        ends (before any other lock it takes, so deleters wait only for each
        other, never in a cycle; appends never wait for it). Marks are
        handed out as rows are deleted: without this, two deleters could
        commit theirs out of mark order, and a reader that had read the later
        ones would skip the earlier ones for ever."""
        ...

    def snapshot(self) -> AbstractContextManager[None]:
        """One read transaction: its statements see one state of the log."""
        ...

    def newest_seq(self, lock: bool = False) -> int:
        """The newest seq ever given (deleted events still count); ``lock``:
        inside a write, also keep other writers from giving one until it ends."""
        ...

    def lease_now(self, now_us: int) -> tuple[str, tuple[Any, ...]]:
        """The lease clock as an SQL expression and its arguments."""
        ...

    def describe(self, exc: BaseException) -> str:
        """A driver error in words, without secrets."""
        ...


def paged(
    fetch: Callable[[str, Args], Sequence[Row]],
    select: Callable[[int], tuple[str, Args]],
    after: int,
    page: int,
) -> Generator[Row, None, None]:
    """:meth:`Sql.scan_events` for a driver that reads a result whole: pages of
    ``page`` rows, each ``select(last seq read) LIMIT page``, so a consumer
    that stops (its byte budget spent) stops the reads."""
    while True:
        sql, args = select(after)
        rows = fetch(sql + " LIMIT ?", (*args, page))
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1][0]
