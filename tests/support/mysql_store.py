"""The MySQL tests' own values and helpers (their server and databases are
``mysql_server`` and ``mysql_db`` in ``tests/conftest.py``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamd.eventlog.model import AppendParams, Event, to_us
from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore

T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))


def ap(event_id: str, session: str = "s", content: Any = None, **kw: Any) -> AppendParams:
    return AppendParams(
        app=kw.pop("app", "app"), user=kw.pop("user", "u"), session=session,
        event=Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw),
    )


@pytest.fixture
def open_mysql_store(mysql_db: str) -> Iterator[Callable[..., MysqlStore]]:
    """Open stores on the test's database ("hosts": each its own connection)."""
    opened: list[MysqlStore] = []

    def open_(**kw: Any) -> MysqlStore:
        store = MysqlStore.open(mysql_db, MysqlOptions(**kw))
        opened.append(store)
        return store

    yield open_
    for s in opened:
        s.close()
