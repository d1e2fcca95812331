"""The database guard's file lookup: ``statx`` for the inode number alone.

It must name a file exactly as ``os.stat`` does (the guard compares what it
recorded at open with what the path names now), answer None for a path with
nothing at it, raise what ``os.stat`` raises otherwise, and fall back to
``os.stat`` where the kernel or a sandbox refuses ``statx``. Why it is not
``os.stat`` (the WAL's inode written at every durable commit) is measured in
``bench/adk_append_breakdown.py``, not here.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from streamd.eventlog.sqlite import inode


def stat_id(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_a_file_is_named_as_os_stat_names_it(tmp_path: Path) -> None:
    f = tmp_path / "events.db"
    f.write_bytes(b"x")
    assert inode.device_and_inode(str(f)) == stat_id(f)
    assert inode.device_and_inode(str(tmp_path)) == stat_id(tmp_path)


def test_a_replaced_file_is_another_file(tmp_path: Path) -> None:
    f, other = tmp_path / "events.db", tmp_path / "restored.db"
    f.write_bytes(b"old")
    other.write_bytes(b"new")
    before = inode.device_and_inode(str(f))
    os.replace(other, f)
    after = inode.device_and_inode(str(f))
    assert after is not None and after != before
    assert after == stat_id(f)


def test_a_symlink_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "real.db"
    target.write_bytes(b"x")
    link = tmp_path / "link.db"
    link.symlink_to(target)
    assert inode.device_and_inode(str(link)) == stat_id(target)


def test_nothing_at_the_path_is_none(tmp_path: Path) -> None:
    assert inode.device_and_inode(str(tmp_path / "gone.db")) is None
    assert inode.device_and_inode(str(tmp_path / "no-dir" / "gone.db")) is None


def test_other_errors_raise_as_os_stat_raises(tmp_path: Path) -> None:
    f = tmp_path / "plain"
    f.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        inode.device_and_inode(str(f / "child"))
    with pytest.raises(ValueError):
        inode.device_and_inode(str(tmp_path / "nul\0byte"))


def test_a_refused_statx_falls_back_to_os_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def refused(*args: object) -> int:
        calls.append(args)
        ctypes.set_errno(errno.ENOSYS)
        return -1

    monkeypatch.setattr(inode, "_statx", refused)
    f = tmp_path / "events.db"
    f.write_bytes(b"x")
    assert inode.device_and_inode(str(f)) == stat_id(f)
    assert inode.device_and_inode(str(tmp_path / "gone")) is None
    assert len(calls) == 1  # refused once, then stat alone


# --- identities: the guard's three paths in one call ------------------------

both_ways = pytest.mark.parametrize("native", ["1", "0"], ids=["compiled", "plain"])


@both_ways
def test_identities_name_each_path_as_os_stat_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    monkeypatch.setenv("STREAMD_NATIVE", native)
    db, wal = tmp_path / "events.db", tmp_path / "events.db-wal"
    db.write_bytes(b"x")
    wal.write_bytes(b"y")
    paths = [inode.encoded(str(p)) for p in (db, wal, tmp_path / "events.db-shm")]
    assert inode.identities(paths) == [stat_id(db), stat_id(wal), None]
    os.replace(wal, db)
    assert inode.identities(paths) == [stat_id(db), None, None]


@both_ways
def test_identities_raise_as_os_stat_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    monkeypatch.setenv("STREAMD_NATIVE", native)
    f = tmp_path / "plain"
    f.write_bytes(b"x")
    with pytest.raises(NotADirectoryError) as raised:
        inode.identities([inode.encoded(str(f)), inode.encoded(str(f / "child"))])
    assert raised.value.filename == str(f / "child")
    with pytest.raises(ValueError):
        inode.encoded(str(tmp_path / "nul\0byte"))


def test_the_compiled_lookup_is_used_where_built(tmp_path: Path) -> None:
    from streamd import _native

    if getattr(_native, "INODE_INTERFACE", None) != inode.INODE_INTERFACE:
        pytest.skip("no compiled core built from these sources")
    assert inode._compiled is _native.devices_and_inodes


def test_a_refused_compiled_lookup_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[bytes]] = []

    def refused(paths: list[bytes]) -> list[int]:
        calls.append(paths)
        return [errno.EPERM for _ in paths]  # a seccomp filter's answer

    monkeypatch.setenv("STREAMD_NATIVE", "1")
    monkeypatch.setattr(inode, "_compiled", refused)
    f = tmp_path / "events.db"
    f.write_bytes(b"x")
    paths = [inode.encoded(str(f)), inode.encoded(str(tmp_path / "gone"))]
    assert inode.identities(paths) == [stat_id(f), None]
    assert inode.identities(paths) == [stat_id(f), None]
    assert len(calls) == 1  # refused once, then the other lookups alone
