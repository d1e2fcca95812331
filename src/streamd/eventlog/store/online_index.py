"""An index added to a table that other hosts are writing: a migration step of its own.

A migration runs when a newer streamd first opens an older log, and on a
server that log may hold millions of events that daemons on other machines
go on appending to meanwhile. Built like any other statement of a migration,
an index held those writers for the whole build: at a million events
PostgreSQL's ``CREATE INDEX`` (a SHARE lock on the table) held every append
for about 2.5 s, and MariaDB copies the table under a lock that excludes
writes when its server is set to (``alter_algorithm=COPY``). So a step that
adds an index to a table that may be large is not SQL text but this value,
and each server's migration builds it its own way without excluding writes
(:mod:`~streamd.eventlog.postgres.migrate`,
:mod:`~streamd.eventlog.mysql.migrate`). Their shared rule: the schema's
version moves past the step only once the index exists and is usable, so a
build cut short is taken up again by the next opener.

SQLite needs none of this: one writer at a time is its design, and its
migrations are one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OnlineIndex"]


@dataclass(frozen=True)
class OnlineIndex:
    """``CREATE INDEX name ON table (columns)``, built without holding writers.
    The names are the schema's own constants, never input: written as they are."""

    name: str
    table: str
    columns: tuple[str, ...]

    @property
    def column_list(self) -> str:
        return "(" + ", ".join(self.columns) + ")"

    def create(self) -> str:
        """The plain statement: for tables nobody else can see yet (a log being
        created in the same transaction), where building online would only wait."""
        return f"CREATE INDEX {self.name} ON {self.table} {self.column_list}"
