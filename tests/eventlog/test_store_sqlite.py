"""What only the SQLite store has: its file's setup, migrations, files that are
not ours, a busy file, and the query plans of its reads.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import apsw
import pytest
from support.store_contract import KEY, SECOND, T0, ap, ev

from streamd.errors import (
    SOURCE_UNAVAILABLE,
    RpcError,
    is_session_locked,
)
from streamd.eventlog.model import (
    Filter,
    LeaseAcquireParams,
    SessionTree,
    SinceParams,
)
from streamd.eventlog.sqlite import SCHEMA_VERSION, SqliteOptions, SqliteStore

# --- SQLite specifics -----------------------------------------------------------


def test_sqlite_setup_is_wal_full_fk_and_versioned(tmp_path: Path) -> None:
    store = SqliteStore.open(str(tmp_path / "x.db"))
    db = store.connection
    assert db.pragma("journal_mode") == "wal"
    assert db.pragma("synchronous") == 2  # FULL by default
    assert db.pragma("foreign_keys") == 1
    assert db.pragma("auto_vacuum") == 2  # INCREMENTAL: retention gives disk back
    assert db.pragma("user_version") == SCHEMA_VERSION
    assert db.transaction_mode == "IMMEDIATE"
    store.close()
    normal = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    assert normal.connection.pragma("synchronous") == 1
    normal.close()


def test_a_version_1_database_migrates_and_its_leases_keep_the_default_window(
    tmp_path: Path,
) -> None:
    from streamd.eventlog.sqlite.schema import MIGRATIONS

    path = str(tmp_path / "v1.db")
    db = apsw.Connection(path)
    with db:
        db.execute(MIGRATIONS[0])
        db.pragma("user_version", 1)
        db.execute(
            "INSERT INTO leases (app_name, user_id, session_id, holder, acquired_at,"
            " heartbeat_at) VALUES ('app', 'u', 's', 'old/1/aaaaaaaa', ?, ?)",
            (T0, T0),
        )
    db.close()
    store = SqliteStore.open(path)
    assert store.connection.pragma("user_version") == SCHEMA_VERSION == 8
    (info,) = store.list_leases()
    assert (info.holder, info.stale_after_ms) == ("old/1/aaaaaaaa", 30_000)
    with pytest.raises(RpcError) as raised:
        store.acquire_lease(
            LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=150),
            "new",
            T0 + 29 * SECOND,
        )
    assert is_session_locked(raised.value)
    store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=150),
        "new",
        T0 + 30 * SECOND,
    )
    store.close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_another_programs_database_is_refused_before_anything_in_it_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "theirs.db"
    db = apsw.Connection(str(path))
    db.execute(
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL);"
        " INSERT INTO invoices (total) VALUES (9.5);"
    )
    db.close()
    before = _sha256(path)
    for migrate in (True, False):  # the writer's open and a reader's
        with pytest.raises(RpcError) as info:
            SqliteStore.open(str(path), migrate=migrate)
        assert info.value.code == SOURCE_UNAVAILABLE
        assert info.value.message.startswith(f"{path} is not a streamd event log")
        assert "invoices" in info.value.message
        assert info.value.data == {"path": str(path)}
    assert _sha256(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["theirs.db"]  # no -wal, no -shm
    db = apsw.Connection(str(path))
    assert db.pragma("journal_mode") == "delete"
    assert db.pragma("user_version") == 0
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_schema")] == ["invoices"]
    db.close()


def test_a_tableless_database_with_someone_elses_user_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "theirs.db"
    db = apsw.Connection(str(path))
    db.pragma("user_version", 7)
    db.close()
    before = _sha256(path)
    with pytest.raises(RpcError) as info:
        SqliteStore.open(str(path))
    assert "application_id 0, user_version 7" in info.value.message
    assert _sha256(path) == before


def test_an_empty_file_becomes_ours_and_is_stamped_with_our_application_id(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new.db"
    path.touch()
    SqliteStore.open(str(path)).close()
    db = apsw.Connection(str(path))
    assert db.pragma("application_id") == 0x53544D44
    db.close()
    SqliteStore.open(str(path)).close()  # and is accepted again


def test_a_newer_schema_is_refused_not_downgraded(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    SqliteStore.open(path).close()
    db = apsw.Connection(path)
    db.pragma("user_version", SCHEMA_VERSION + 1)
    db.close()
    with pytest.raises(RpcError) as info:
        SqliteStore.open(path)
    assert info.value.code == SOURCE_UNAVAILABLE
    assert "newer" in info.value.message


def test_a_file_that_is_not_a_database_is_source_unavailable_not_a_driver_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"this is not a database file" * 200)
    with pytest.raises(RpcError) as info:
        SqliteStore.open(str(path))
    assert info.value.code == SOURCE_UNAVAILABLE
    assert isinstance(info.value.__cause__, apsw.Error)


def test_busy_database_is_source_unavailable(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    store = SqliteStore.open(path, SqliteOptions(busy_timeout_ms=50))
    other = apsw.Connection(path)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(RpcError) as info:
            store.append(ap(ev("e1")), T0)
        assert info.value.code == SOURCE_UNAVAILABLE
        assert info.value.data == {"sqlite_error": "BusyError"}
    finally:
        other.execute("ROLLBACK")
        other.close()
    # Nothing half-written, and the store still works.
    assert store.append(ap(ev("e1")), T0).seq == 1
    store.close()


def _many(store: SqliteStore, n: int) -> None:
    batch = [ap(ev(f"e{i}", branch=f"b{i % 50}.x"), session=f"s{i % 50}") for i in range(n)]
    store.append_batch(batch, T0)


@pytest.mark.parametrize(
    ("flt", "index"),
    [
        (Filter(app="app", user="u", session="s7"), "events_by_session"),
        (Filter(session_tree=SessionTree(app="app", user="u", parent="s7")), "events_by_session"),
        (Filter(branch_prefixes=["b7"]), "events_by_branch"),
    ],
)
def test_replaying_history_with_a_filter_is_an_index_range_scan(
    tmp_path: Path, flt: Filter, index: str
) -> None:
    store = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    _many(store, 5000)
    plan = store.explain_since(0, flt, 1000)
    assert any(f"USING INDEX {index}" in d or f"COVERING INDEX {index}" in d for d in plan), plan
    assert not any(d.startswith("SCAN events") for d in plan), plan
    # And the plan answers correctly.
    assert len(store.since(SinceParams(from_seq=0, filter=flt, limit=10_000)).entries) == 100
    store.close()


def test_a_caught_up_cursor_reads_only_rows_past_it_by_primary_key(tmp_path: Path) -> None:
    store = SqliteStore.open(str(tmp_path / "x.db"), SqliteOptions(synchronous="NORMAL"))
    _many(store, 5000)
    tip = store.latest_seq(None)
    plan = store.explain_since(tip - 10, Filter(branch_prefixes=["b7"]), 1000)
    assert any("INTEGER PRIMARY KEY (rowid>?)" in d for d in plan), plan
    got = store.since(
        SinceParams(from_seq=tip - 60, filter=Filter(branch_prefixes=["b7"]), limit=1000)
    ).entries
    assert [e.event.branch for e in got] == ["b7.x"]
    store.close()
