"""The kill -9 crash matrix still runs end to end (two small trials, no speed
asserted): a SIGKILLed daemon loses no acknowledged append. The full run is
``bench/crash_matrix.py`` (30+ trials)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "crash_matrix.py"


def test_two_kill_9_trials_lose_no_acknowledged_append(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--trials", "2", "--appends", "300", "--inflight", "50",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    trials = [line for line in lines if line.startswith("trial ")]
    assert len(trials) == 2 and all(line.endswith(": ok") for line in trials), trials
    assert all("exit -9" in line for line in trials)  # each daemon really was killed
    assert "losses 0, duplicates 0, mismatches 0" in lines[-2]
    assert lines[-1] == "PASS: 0 of 2 trials failed"
    assert list(tmp_path.iterdir()) == []  # its temp dir is gone
