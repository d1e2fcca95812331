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
