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

import pytest

import streamd

pytestmark = pytest.mark.subprocess

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
    # The report names what it measured by the distribution's name.
    assert report["machine"]["versions"]["recall-streamd"] == streamd.__version__


LOAD = BENCH.parent / "eventlog_load.py"


def _run_load(tmp_path, *extra):
    out = tmp_path / "load.json"
    done = subprocess.run(
        [sys.executable, str(LOAD), "--quick", "--workdir", str(tmp_path / "work"),
         "--out", str(out), *extra],
        capture_output=True, text=True, timeout=120,
    )
    return done, json.loads(out.read_text())


def test_the_load_bench_runs_every_scenario_and_checks_exactly_once(tmp_path):
    done, report = _run_load(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert report["ok"] and {"cpus", "python", "kernel", "commit"} <= set(report["machine"])
    results = report["results"]
    assert set(results) == {"table", "p99", "burst", "cross"}
    rows = [*results["table"], results["p99"], results["burst"], results["cross"]]
    assert [r["watchers"] for r in results["table"]] == [0, 1]
    for row in rows:
        assert "error" not in row and not row.get("notes"), row
        assert row["appends"] == row["writers"] * row["events_per_writer"]
        assert row["appends_per_s"] > 0 and row["daemon_peak_mib"] > 0
        assert {"p50_ms", "p99_ms", "max_ms"} <= set(row["append"])
        assert len(row["watcher_detail"]) == row["watchers"]
        for watcher in row["watcher_detail"]:
            assert watcher["exactly_once"], watcher
            assert watcher["received"] == watcher["expected"] == row["appends"]
        assert row["exactly_once_ok"]
    assert results["cross"]["watcher_lag"]["p50_ms"] is not None
    assert {t["target"].split(":")[0] for t in report["targets"]} >= {
        "2 writers, no watcher", "4 x 5 + 1 watcher", "cross-process watch latency p50 <= 10 ms"
    }
    assert "| table-1w | 2 x 50 | 1 |" in done.stdout  # the table was printed
    assert not list((tmp_path / "work").iterdir())  # the run dir was removed


def test_the_load_bench_says_loudly_when_a_watcher_loses_an_entry(tmp_path):
    # The first watcher drops one entry on purpose: the check must catch it.
    done, report = _run_load(tmp_path, "--scenarios", "table", "--watchers", "2",
                             "--inject-fault", "drop")
    assert done.returncode == 1
    (row,) = report["results"]["table"]
    first, second = row["watcher_detail"]
    assert not first["exactly_once"] and first["missing"] == 1
    assert second["exactly_once"] and not row["exactly_once_ok"] and not report["ok"]
    assert "EXACTLY-ONCE VIOLATED" in done.stdout


SOURCE_BENCH = BENCH.parent / "eventlog_source_bench.py"


def test_the_eventlog_source_bench_measures_every_phase(tmp_path):
    out = tmp_path / "source.json"
    done = subprocess.run([sys.executable, str(SOURCE_BENCH), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["index"]["events"] == 3000
    assert set(report["search"]) == {"event_id", "rare_term", "common_term"}
    # Freshness is counted, not timed: every query found its event.
    for trials in report["freshness"].values():
        assert trials["found"] == trials["of"] > 0
