"""A file system that fails under the event log is named as that, not as a
database fault ("database disk image is malformed", or a bare "disk I/O
error"), and no OSError leaves the store. A full disk fails the write that
found it, loses nothing acknowledged, and leaves the log serving.

A real EIO from the kernel: ``/proc/self/mem`` read at offset 0 fails with
EIO, so opening it as a database fails in SQLite's own read. A failure on a
later page of a database that opened fine is raised, as OSError(EIO), from
the read call site SQLite uses (a VFS over the default one, made the default
for the test), since a disk that fails on demand takes root-only device tricks.
"""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import apsw
import pytest
from support.faulty_disk import FaultyVFS

from streamd.errors import RpcError
from streamd.eventlog.model import AppendParams, Event, SinceParams
from streamd.eventlog.sqlite import errors as sqlite_errors
from streamd.eventlog.sqlite.store import SqliteStore

EIO_NAMED = "the file system failed: Input/output error (EIO)"


def test_a_database_the_kernel_cannot_read_is_named_by_its_errno() -> None:
    with pytest.raises(RpcError) as info:
        SqliteStore.open("/proc/self/mem")
    assert info.value.code == -32000
    assert EIO_NAMED in info.value.message, info.value.message
    assert info.value.data["errno"] == "EIO"


def test_a_file_that_cannot_be_opened_is_named_in_the_error(tmp_path: Path) -> None:
    # What a daemon's client reads at its first call: which file, and why.
    not_sqlite = tmp_path / "notes.db"
    not_sqlite.write_text("hello\n" * 100)
    with pytest.raises(RpcError) as info:
        SqliteStore.open(str(not_sqlite))
    assert info.value.message == (
        f"event log database {not_sqlite}: file is not a database")


def test_a_read_that_fails_with_eio_under_an_open_log_is_named(
    tmp_path: Path, faulty_disk: FaultyVFS
) -> None:
    path = str(tmp_path / "events.db")
    store = SqliteStore.open(path)
    for i in range(200):  # enough rows for several pages
        event = Event(id=f"e{i}", author="agent", content="x" * 200)
        store.append(AppendParams(app="app", user="u", session="s", event=event), i + 1)
    store.close()
    store = SqliteStore.open(path)  # nothing of the events cached
    try:
        faulty_disk.reads_fail = True
        with pytest.raises(RpcError) as info:
            store.since(SinceParams(from_seq=0, limit=1000))
        assert info.value.code == -32000
        assert EIO_NAMED in info.value.message, info.value.message
    finally:
        faulty_disk.reads_fail = False
        store.close()


def test_corruption_sqlite_reports_for_a_failed_read_names_the_errno_first() -> None:
    err = sqlite_errors.translate(apsw.CorruptError("database disk image is malformed"), errno.EIO)
    assert err.message == (
        "event log database error: the file system failed: Input/output "
        "error (EIO) (SQLite said: database disk image is malformed)"
    )
    plain = sqlite_errors.translate(apsw.CorruptError("database disk image is malformed"), 0)
    assert plain.message == "event log database error: database disk image is malformed"


def _event(event_id: str) -> AppendParams:
    return AppendParams(
        app="app", user="u", session="s", event=Event(id=event_id, author="a", content="x" * 300)
    )


def test_a_full_disk_fails_the_append_that_finds_it_and_loses_nothing(
    tmp_path: Path, faulty_disk: FaultyVFS
) -> None:
    store = SqliteStore.open(str(tmp_path / "events.db"))
    try:
        for i in range(5):
            store.append(_event(f"e{i}"), i + 1)
        faulty_disk.full = True
        for attempt in range(3):  # and again, while the disk stays full
            with pytest.raises(RpcError) as info:
                store.append(_event("on-a-full-disk"), 10 + attempt)
            assert info.value.code == -32000
            assert "database or disk is full" in info.value.message, info.value.message
            read = store.since(SinceParams(from_seq=0, limit=100))
            assert [e.event.id for e in read.entries] == [f"e{i}" for i in range(5)]
        faulty_disk.full = False
        assert store.append(_event("after"), 20).seq == 6
        read = store.since(SinceParams(from_seq=0, limit=100))
        assert [e.event.id for e in read.entries] == [*(f"e{i}" for i in range(5)), "after"]
    finally:
        faulty_disk.full = False
        store.close()


def test_a_log_on_a_read_only_file_system_is_named_as_that(read_only_mount: Path) -> None:
    # A log in WAL mode is read through its "-shm", which SQLite creates
    # beside it; on a read-only mount it cannot, and SQLite's last errno is
    # its read-only retry's ENOENT: every command, reads included, said "No
    # such file or directory" of a file that is there.
    db = read_only_mount / "ev.db"
    SqliteStore.open(str(db)).close()
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_mount)], check=True)
    with pytest.raises(RpcError) as info:
        SqliteStore.open(str(db), migrate=False)
    assert info.value.message == (
        f"event log database {db}: its directory {read_only_mount} is on a read-only file"
        " system (EROFS), and SQLite must create ev.db-shm there to read or write the log;"
        " `streamd log backup` can copy it from there (SQLite said: unable to open database"
        " file)")
    assert info.value.data == {"sqlite_error": "CantOpenError", "errno": "EROFS"}


def test_a_full_disk_under_a_batch_is_named_not_hidden_by_the_rollback(
    tmp_path: Path, faulty_disk: FaultyVFS
) -> None:
    # A batch larger than SQLite's page cache writes pages to the -wal before
    # its commit; the disk refusing one of those ends the transaction inside
    # SQLite, and the rollback on the way out then failed in turn. Its error
    # was the one reported: "cannot rollback - no transaction is active".
    store = SqliteStore.open(str(tmp_path / "events.db"))
    try:
        store.append(_event("before"), 1)
        faulty_disk.full = True
        batch = [AppendParams(app="app", user="u", session="s",
                              event=Event(id=f"b{i}", author="a", content="x" * 20_000))
                 for i in range(200)]
        with pytest.raises(RpcError) as info:
            store.append_batch(batch, 2)
        assert info.value.code == -32000
        assert "database or disk is full" in info.value.message, info.value.message
        faulty_disk.full = False
        read = store.since(SinceParams(from_seq=0, limit=1000))
        assert [e.event.id for e in read.entries] == ["before"]
        assert store.append_batch(batch[:2], 3)[1].seq == 3
    finally:
        faulty_disk.full = False
        store.close()
