"""The stop mark (``streamd.resident.stopmark``): a stop asked of a directory's
daemon keeps the daemons a client spawned before it from serving afterwards."""

from __future__ import annotations

import os
from pathlib import Path

from streamd.resident import stopmark

ENV = stopmark.SPAWNED_AT_ENV


def test_a_daemon_spawned_before_the_last_stop_is_held_back_and_one_after_is_not(
    tmp_path: Path,
) -> None:
    stopmark.mark_stopped(str(tmp_path), at=1_000.0)
    assert stopmark.stopped_since(str(tmp_path), {ENV: "999.5"})
    assert not stopmark.stopped_since(str(tmp_path), {ENV: "1000.5"})
    # A later stop moves the mark on.
    stopmark.mark_stopped(str(tmp_path), at=2_000.0)
    assert stopmark.stopped_since(str(tmp_path), {ENV: "1000.5"})


def test_a_daemon_no_client_spawned_always_serves(tmp_path: Path) -> None:
    stopmark.mark_stopped(str(tmp_path))
    assert not stopmark.stopped_since(str(tmp_path), {})
    assert not stopmark.stopped_since(str(tmp_path), {ENV: "not a time"})


def test_no_mark_a_damaged_mark_or_one_of_another_boot_holds_nothing_back(
    tmp_path: Path,
) -> None:
    early = {ENV: "1.0"}
    assert not stopmark.stopped_since(str(tmp_path), early)  # never stopped
    mark = Path(stopmark.mark_path(str(tmp_path)))
    for damaged in (b"", b"garbage", b"\xff\xfe 5.0", b"one two three"):
        mark.write_bytes(damaged)
        assert not stopmark.stopped_since(str(tmp_path), early), damaged
    # Boot-time seconds start again at a reboot: a mark of another boot is no mark.
    mark.write_bytes(b"00000000-0000-0000-0000-000000000000 1000000.0\n")
    assert not stopmark.stopped_since(str(tmp_path), early)
    mark.write_bytes(f"{stopmark.boot_id()} 1000000.0\n".encode())
    assert stopmark.stopped_since(str(tmp_path), early)


def test_the_mark_is_replaced_whole_and_private(tmp_path: Path) -> None:
    before = stopmark.now()
    stopmark.mark_stopped(str(tmp_path))
    boot, when = Path(stopmark.mark_path(str(tmp_path))).read_text().split()
    assert boot == stopmark.boot_id() != ""
    assert before <= float(when) <= stopmark.now()
    assert os.stat(stopmark.mark_path(str(tmp_path))).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [stopmark.MARK_NAME]
