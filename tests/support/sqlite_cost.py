"""What a read costs a SQLite store, counted by SQLite itself: costs no
clock, and no other load on the machine, changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import apsw

from streamd.eventlog.sqlite import SqliteStore

_T = TypeVar("_T")

_PAGE_COUNTERS = (apsw.SQLITE_DBSTATUS_CACHE_HIT, apsw.SQLITE_DBSTATUS_CACHE_MISS)


def pages_read(store: SqliteStore, read: Callable[[], _T]) -> tuple[_T, int]:
    """What ``read`` answers, and how many pages of the file it took on the
    store's connection (each page each time, cached or not): a seek is a few
    pages, the next row of a pass seldom one."""
    db = store.connection
    for counter in _PAGE_COUNTERS:
        db.status(counter, True)
    answer = read()
    return answer, sum(db.status(counter)[0] for counter in _PAGE_COUNTERS)


def vm_steps(store: SqliteStore, read: Callable[[], _T]) -> tuple[_T, int]:
    """What ``read`` answers, and how many steps SQLite's virtual machine took
    for the statements it ran on the store's connection: each row visited,
    in a table or an index, costs a few."""
    steps: list[int] = []

    def profiled(event: dict[str, Any]) -> None:
        steps.append(event["stmt_status"]["SQLITE_STMTSTATUS_VM_STEP"])

    db = store.connection
    db.trace_v2(apsw.SQLITE_TRACE_PROFILE, profiled)
    try:
        answer = read()
    finally:
        db.trace_v2(0, None)
    return answer, sum(steps)


def statements(store: SqliteStore, op: Callable[[], _T]) -> tuple[_T, int]:
    """What ``op`` answers, and how many statements it ran on the store's
    connection (each execution once)."""
    ran: list[None] = []
    db = store.connection
    db.trace_v2(apsw.SQLITE_TRACE_PROFILE, lambda event: ran.append(None))
    try:
        answer = op()
    finally:
        db.trace_v2(0, None)
    return answer, len(ran)
