"""A workdir the index cannot be written to is named with the system's own
reason (a full disk is not a permission problem): ``index`` fails (2) having
indexed, ``search`` answers (0) and says it below its hits. The kernel's error is real:
a file-size limit on the command makes every write past it fail (EFBIG), as a
full disk fails one (ENOSPC)."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "streamd", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=no_room)


def stream(tmp_path: Path) -> Path:
    path = tmp_path / "a.jsonl"
    path.write_text("".join(
        f'{{"schema":2,"id":"r{i}","event_time":"2026-05-02T10:00:00Z","text":"alpha {i}"}}\n'
        for i in range(50)))
    return path


def test_index_names_why_the_workdir_took_nothing(tmp_path: Path) -> None:
    done = run("index", str(stream(tmp_path)), "--workdir", "wd", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith("gen-1: 50 records indexed")
    assert done.stderr.splitlines()[-1] == (
        f"streamd: --workdir wd: the index was not saved: {os.strerror(errno.EFBIG)}")


def test_search_answers_and_says_why_nothing_was_saved(tmp_path: Path) -> None:
    done = run("search", "alpha", str(stream(tmp_path)), "--workdir", "wd", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "r0" in done.stdout
    assert f"the index was not saved: {os.strerror(errno.EFBIG)}" in done.stderr
