"""Fixtures several event-log test modules share."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


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
