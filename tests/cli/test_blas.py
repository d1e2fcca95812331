"""The ``streamd`` command starts none of numpy's OpenBLAS threads, which
spin for about 0.1 s of CPU at numpy's import and are never used; a number
the caller set is kept (``streamd.blas``).

Each command runs in a fresh interpreter as ``python -m streamd`` does, and
reports at its end whether numpy was loaded and how many threads it has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import as_main

pytestmark = pytest.mark.subprocess

REPORT = as_main.script(
    'threads = len(os.listdir("/proc/self/task"))\n'
    'sys.stderr.write("NUMPY=%d THREADS=%d\\n" % ("numpy" in sys.modules, threads))')

LINE = ('{"schema":2,"id":"r1","kind":"event","event_time":"2026-05-02T10:00:00Z",'
        '"title":"kakamora","text":"kakamora snapshot"}\n')


def run(tmp_path: Path, blas_threads: str | None) -> tuple[bool, int]:
    stream = tmp_path / "s.jsonl"
    stream.write_text(LINE)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = blas_threads
    done = subprocess.run(
        [sys.executable, "-c", REPORT, "search", "kakamora", str(stream),
         "--workdir", str(tmp_path / "wd")],
        env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = [ln for ln in done.stderr.decode().splitlines() if ln.startswith("NUMPY=")]
    assert report, done.stderr
    numpy, threads = (int(part.split("=")[1]) for part in report[-1].split())
    return bool(numpy), threads


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_the_command_starts_no_blas_threads_and_keeps_a_callers_number(tmp_path: Path) -> None:
    numpy, default = run(tmp_path, None)
    assert numpy, "the search no longer loads numpy: this test needs another command"
    assert run(tmp_path, "1") == (True, default)
    if (os.cpu_count() or 1) >= 2:
        # OpenBLAS starts (number - 1) threads, at most one a core.
        assert run(tmp_path, "2") == (True, default + 1)


@pytest.mark.parametrize(("callers", "foreign"), [(None, None), ("1", "1"), ("4", "4")])
def test_a_program_started_for_the_caller_gets_the_callers_setting_not_ours(
        callers: str | None, foreign: str | None) -> None:
    # An adapter under test (conformance verify) is not streamd: our tuning
    # must not reach it, the caller's own setting must.
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if callers is not None:
        env["OPENBLAS_NUM_THREADS"] = callers
    code = ("import os; from streamd import blas; blas.one_thread(); "
            "print(os.environ['OPENBLAS_NUM_THREADS'], "
            "blas.foreign_env().get('OPENBLAS_NUM_THREADS'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [callers or "1", str(foreign)]
