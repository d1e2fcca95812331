"""A log kept on a read-only file system is backed up and verified as it is.

SQLite cannot create the ``-shm`` a WAL log is read through on a read-only
mount; ``log backup`` and ``log verify`` read such a log as the snapshot it is
(:mod:`streamd.eventlog.sqlite.frozen`), and refuse what they cannot read whole
or read unchanged. Every test mounts a tmpfs: root only, skipped elsewhere.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from support.eventlog import ev

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import maintenance
from streamd.eventlog.model import AppendParams, checked
from streamd.eventlog.sqlite import SqliteStore, backup
from streamd.eventlog.sqlite.frozen import read_frozen

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
NOW_US = 1_700_000_000_000_000


def streamd_log(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO / "src"))}
    return subprocess.run([sys.executable, "-m", "streamd", "log", "--db", str(db), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def ap(event_id: str, session: str = "s") -> AppendParams:
    return checked(AppendParams, app="app", user="u", session=session, event=ev(event_id))


def build_log(path: Path, n: int) -> None:
    """``n`` events over 4 sessions, the file closed (so no ``-wal`` is left)."""
    store = SqliteStore.open(str(path))
    store.append_batch([ap(f"e{i}", f"s{i % 4}") for i in range(n)], NOW_US)
    store.close()


def remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def events_in(path: Path) -> list[str]:
    """The event ids of a log file, read with a bare connection."""
    db = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [row[0] for row in db.execute("SELECT event_id FROM events ORDER BY seq")]
    finally:
        db.close()


def test_a_log_on_a_read_only_file_system_is_backed_up_and_verified_whole(
    read_only_mount: Path, tmp_path: Path
) -> None:
    # Before: both said the directory is on a read-only file system and
    # SQLite must create ev.db-shm there, so a log kept on a snapshot could
    # not be copied off it with streamd at all.
    db = read_only_mount / "ev.db"
    build_log(db, 30)
    remount_read_only(read_only_mount)
    dest = tmp_path / "copy.db"
    done = streamd_log(db, "backup", str(dest))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("backed up 30 events (newest seq 30)")
    assert events_in(dest) == [f"e{i}" for i in range(30)]
    checked = streamd_log(db, "verify")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == f"ok: {db}: 30 events, newest seq 30, 4 sessions\n"


def test_a_read_only_log_whose_wal_holds_commits_is_refused_not_copied_short(
    read_only_mount: Path, tmp_path: Path
) -> None:
    # An immutable open ignores the -wal: the copy would have left out the
    # newest events without a word.
    live = tmp_path / "live.db"
    build_log(live, 10)
    holder = apsw.Connection(str(live))  # keeps the -wal from being folded in at close
    store = SqliteStore.open(str(live))
    store.append_batch([ap("newest")], NOW_US)
    for suffix in ("", "-wal"):  # what a copy without the -shm holds
        shutil.copy(f"{live}{suffix}", read_only_mount / f"ev.db{suffix}")
    store.close()
    holder.close()
    remount_read_only(read_only_mount)
    dest = tmp_path / "copy.db"
    done = streamd_log(read_only_mount / "ev.db", "backup", str(dest))
    assert done.returncode == 2
    assert "ev.db-wal holds commits" in done.stderr
    assert "copy ev.db and ev.db-wal to a writable directory" in done.stderr
    assert not dest.exists()


@pytest.fixture
def read_only_view(read_only_mount: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``(writable, read_only)``: one directory, and the same directory seen
    through a read-only bind mount (a live log's read-only volume)."""
    view = tmp_path / "view"
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(read_only_mount), str(view)]).returncode != 0:
        pytest.skip("needs a bind mount")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        yield read_only_mount, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_a_read_only_view_of_a_log_written_meanwhile_is_refused(
    read_only_view: tuple[Path, Path],
) -> None:
    writable, view = read_only_view
    build_log(writable / "ev.db", 10)
    with pytest.raises(RpcError) as info, read_frozen(str(view / "ev.db")) as read:
        assert read.store.connection.execute("SELECT count(*) FROM events").fetchall() == [(10,)]
        writer = SqliteStore.open(str(writable / "ev.db"))
        writer.append_batch([ap("meanwhile")], NOW_US)
        writer.close()
    assert info.value.message == (
        f"event log database {view / 'ev.db'} changed while it was read as a read-only"
        " snapshot (it is written through another mount): what was read is not used; copy"
        " it with a daemon or command that can open it for writing")


def test_a_backup_of_a_read_only_view_written_meanwhile_leaves_no_copy_at_dest(
    read_only_view: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the copy was published at DEST, then the look after the read
    # failed the command (exit 2, which promises nothing at DEST), and the
    # copy of pages that may have been read mid-write stayed there.
    writable, view = read_only_view
    build_log(writable / "ev.db", 10)
    copy_then_write = backup.snapshot

    def snapshot(*args: Any, **kwargs: Any) -> backup.BackupResult:
        done = copy_then_write(*args, **kwargs)
        writer = SqliteStore.open(str(writable / "ev.db"))
        writer.append_batch([ap("meanwhile")], NOW_US)
        writer.close()
        return done

    monkeypatch.setattr(backup, "snapshot", snapshot)
    dest = tmp_path / "copy.db"
    args = argparse.Namespace(db=str(view / "ev.db"), log_command="backup", dest=str(dest),
                              method="backup", json=False)
    assert maintenance.run(args) == 2
    assert not dest.exists()


def test_a_backup_puts_nothing_at_dest_when_the_check_before_publishing_fails(
    tmp_path: Path,
) -> None:
    # A log read as a snapshot is looked at again once the copy is made and
    # checked, before the copy takes the name DEST; before, the look came after,
    # and the copy of pages that may have been read mid-write was at DEST for a
    # moment (and for good, before the command learned to remove it).
    build_log(tmp_path / "ev.db", 3)
    source = apsw.Connection(str(tmp_path / "ev.db"))
    dest = tmp_path / "copy.db"
    seen_at_dest: list[bool] = []

    def changed() -> None:
        seen_at_dest.append(dest.exists())
        raise RpcError(SOURCE_UNAVAILABLE, "changed")

    try:
        with pytest.raises(RpcError, match="changed"):
            backup.snapshot(source, dest, before_publish=changed)
    finally:
        source.close()
    assert seen_at_dest == [False]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.db"]
