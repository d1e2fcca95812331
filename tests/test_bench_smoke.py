"""The bench harness still runs end to end (tiny sizes, no speed asserted).

Speed goals live in bench/ and are never asserted here; this only keeps the
harness from rotting: it generates a stream, drives a real daemon over
JSON-RPC through every phase, and writes its JSON report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "run_bench.py"


def test_the_bench_drives_a_real_daemon_through_every_phase(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "3000", "--queries", "3", "--expands", "2",
         "--restarts", "1", "--catchup-rounds", "1", "--data-dir", str(tmp_path / "data"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    (scenario,) = report["scenarios"]
    assert scenario["ok"] and not scenario["errors"] and not scenario["notes"]
    assert scenario["index"]["indexed_count"] == 3000
    assert set(scenario["search"]) >= {"exact_identifier", "rare_term", "common_term",
                                       "window_browse", "as_of"}
    assert set(scenario["expand"]) == {"summary", "excerpt", "full", "context"}
    assert scenario["restart"]["runs"][0]["generation"]
    assert "full index MB/s" in done.stdout  # the table was printed
