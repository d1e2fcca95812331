"""The cancellation matrix, live: streamd passes every row in process and through attach.

A row of streamd's that is "observed" rather than "pass" is a failure here:
every behaviour the kit reports as open is one streamd has decided
(docs/cancellation.md), so anything but a pass is a regression. Trials per
race offset are few (the CLI's default is more); nothing here reads a time.
Each test gets its own runtime and state directories (support.resident), so
no engineer's daemon or event log is reached, and the daemon started for the
attach test is killed with the world.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from support.resident import World, make_world, point_clients_at

from streamd.conformance.cancel import matrix
from streamd.conformance.cancel.cli import main as cancel_main

pytestmark = pytest.mark.subprocess

TRIALS = "2"
ROWS = len(matrix())


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _not_passed(rows: list[dict]) -> list[str]:
    return [f"{r['scenario']}: {r['verdict']}: {r['detail']}" for r in rows
            if r["verdict"] != "pass"]


def test_streamd_in_process_passes_every_row_and_records_its_cases(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    record = tmp_path / "cases"
    code = cancel_main(["--json", "--trials", TRIALS, "--record", str(record)])
    out, err = capsys.readouterr()
    rows = _rows(out)
    assert len(rows) == ROWS
    assert not _not_passed(rows), _not_passed(rows)
    assert code == 0, err
    recordable = [sc.name for sc in matrix() if sc.case is not None]
    assert sorted(p.name for p in record.iterdir()) == sorted(recordable)
    assert err.count("RECORDED") == len(recordable), err
    for name in recordable:
        assert (record / name / "response.jsonl").read_bytes()


def test_streamd_through_attach_passes_every_row(world: World, capsys: pytest.CaptureFixture[str]):
    world.start_daemon()
    adapter = shlex.join([sys.executable, "-m", "streamd", "attach"])
    code = cancel_main(["--adapter", adapter, "--json", "--trials", TRIALS])
    out, err = capsys.readouterr()
    rows = _rows(out)
    assert len(rows) == ROWS
    assert not _not_passed(rows), _not_passed(rows)
    assert code == 0, err


def test_a_failing_adapter_fails_the_command(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    # An adapter that answers every request with a result at once, cancels
    # included as if they were requests, and never -32007: rows must fail.
    script = tmp_path / "eager.py"
    script.write_text(
        "import json, sys\n"
        "for raw in sys.stdin:\n"
        "    msg = json.loads(raw)\n"
        "    rid = msg.get('id', (msg.get('params') or {}).get('id'))\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'id': rid, 'result': {}}), flush=True)\n"
    )
    adapter = shlex.join([sys.executable, str(script)])
    code = cancel_main(["--adapter", adapter, "--trials", "1", "cancel-inflight", "cancel-twice"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("FAIL") == 2, out


def test_a_record_dir_that_cannot_be_made_is_a_usage_error_before_any_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    (tmp_path / "afile").write_text("")
    record = tmp_path / "afile" / "cases"
    # No adapter could start: the refusal comes before the first run.
    code = cancel_main(["--adapter", str(tmp_path / "no-such-adapter"), "--record", str(record)])
    assert code == 2
    assert capsys.readouterr().err == (
        f"streamd conformance cancel: --record: cannot make {record}: Not a directory\n"
    )


async def test_a_case_that_cannot_be_written_fails_its_scenario_and_the_rest_are_recorded(
    tmp_path: Path,
):
    from streamd.conformance.cancel.record import record_scenarios

    chosen = [sc for sc in matrix(trials=1) if sc.name in ("cancel-inflight", "cancel-twice")]
    (tmp_path / "cancel-inflight").mkdir()
    (tmp_path / "cancel-inflight" / "fixture").write_text("a file where a directory goes")
    with trio.fail_after(120):
        results = await record_scenarios(
            chosen, tmp_path, [sys.executable, "-m", "streamd"], timeout=60
        )
    assert [(r.name, r.ok, r.detail) for r in results] == [
        ("cancel-inflight", False,
         f"cannot write the case: Not a directory: {tmp_path / 'cancel-inflight' / 'fixture'}"),
        ("cancel-twice", True, "3 responses"),
    ]
