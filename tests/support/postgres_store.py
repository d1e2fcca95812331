"""The PostgreSQL tests' own values and helpers (their cluster and databases
are ``postgres_cluster`` and ``postgres_db`` in ``tests/conftest.py``)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamd.eventlog.model import AppendParams, Event, to_us
from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
HOUR = 3600 * 1_000_000
KEY = ("app", "u", "s")


def ap(event_id: str, session: str = "s", content: Any = None) -> AppendParams:
    return AppendParams(
        app="app",
        user="u",
        session=session,
        event=Event(id=event_id, author="agent", content=content),
    )


@pytest.fixture
def open_store(postgres_db: str) -> Iterator[Callable[..., PostgresStore]]:
    """Open stores on the test's database ("hosts": each its own connection)."""
    opened: list[PostgresStore] = []

    def open_(**kw: Any) -> PostgresStore:
        store = PostgresStore.open(postgres_db, PostgresOptions(**kw))
        opened.append(store)
        return store

    yield open_
    for s in opened:
        s.close()


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait for a real server to reach ``condition``, checking every 20 ms."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)
