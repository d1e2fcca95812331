"""Fixtures several event-log test modules share."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.store_contract import T0, ap, ev

from streamd.eventlog.sqlite import SqliteOptions, SqliteStore


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs mounted read-only once ``remount`` is called.
    Only root may mount (and not in every container): skipped elsewhere."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True
    ).returncode != 0:
        pytest.skip("needs a tmpfs mount (root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def six_thousand_events(tmp_path: Path) -> Iterator[SqliteStore]:
    """A SQLite log of 6,000 events of one app (seven users, fifty sessions),
    dealt in turn to three labels (``root.a``, ``root.b``, ``root.c``), each with
    300 bytes of content: enough that reading every event costs many times
    the pages a read of a few rows does."""
    store = SqliteStore.open(str(tmp_path / "events.db"), SqliteOptions(synchronous="NORMAL"))
    text = "lorem " * 50
    store.append_batch(
        [
            ap(ev(f"e{i}", {"text": text}, branch=("root.a", "root.b", "root.c")[i % 3]),
               user=f"u{i % 7}", session=f"s{i % 50}")
            for i in range(6000)
        ],
        T0,
    )
    yield store
    store.close()

