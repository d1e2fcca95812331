"""``SqliteStore.try_open_without_waiting``: what an event loop may call.

It opens a current log at once, and gives up (None) instead of waiting for
another connection's lock or migrating a schema (a migration can take as long
as the log is big); ``SqliteStore.open`` then does either, on a thread.
"""

from __future__ import annotations

from pathlib import Path

import apsw

from streamd.eventlog.sqlite import SqliteStore
from streamd.eventlog.sqlite.schema import SCHEMA_VERSION


def user_version(path: Path) -> int:
    db = apsw.Connection(str(path))
    try:
        return int(db.pragma("user_version"))
    finally:
        db.close()


def test_a_current_log_opens_at_once(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    SqliteStore.open(str(path)).close()
    store = SqliteStore.try_open_without_waiting(str(path))
    assert store is not None
    store.ping()
    store.close()


def test_a_schema_to_migrate_is_left_to_an_open_that_may_wait(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    path.touch()  # new: the whole schema to create
    assert SqliteStore.try_open_without_waiting(str(path)) is None
    assert user_version(path) == 0  # nothing was migrated
    SqliteStore.open(str(path)).close()
    assert user_version(path) == SCHEMA_VERSION


def test_another_connections_lock_is_not_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    SqliteStore.open(str(path)).close()
    other = apsw.Connection(str(path))
    other.pragma("locking_mode", "exclusive")
    other.execute("BEGIN EXCLUSIVE")  # held until COMMIT, then kept (exclusive mode)
    try:
        # busy_timeout would make a waiting open sit here for 60 s.
        from streamd.eventlog.sqlite import SqliteOptions

        waits = SqliteOptions(busy_timeout_ms=60_000)
        assert SqliteStore.try_open_without_waiting(str(path), waits) is None
    finally:
        other.execute("COMMIT")
        other.close()
    store = SqliteStore.try_open_without_waiting(str(path))
    assert store is not None
    store.close()
