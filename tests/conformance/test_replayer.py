"""The conformance replayer and recorder.

The pure core is tested on values; the driver is tested against tiny adapter
scripts written here, each misbehaving in one way the harness must catch. None
of these run streamd itself.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import trio
from support.conformance import (
    INIT,
    REFERENCE_SUITE,
    WANT,
    make_case,
    write_jsonl,
)

from streamd import conformance as c

pytestmark = pytest.mark.subprocess



# Answers every request with the frame the reference recorded for its id. The
# case is found from the bound ${FIXTURE}, so this also proves the binding.
PLAYBACK = r"""
import json, os, sys

frames = None
for raw in sys.stdin.buffer:
    msg = json.loads(raw)
    params = msg.get("params") or {}
    if frames is None:
        if os.listdir(params["workdir"]):
            sys.exit("WORKDIR is not empty")
        case_dir = os.path.dirname(params["location"])
        with open(os.path.join(case_dir, "response.jsonl"), "rb") as f:
            frames = {json.loads(line)["id"]: line.strip() for line in f if line.strip()}
    if msg.get("id") is not None:
        sys.stdout.buffer.write(frames[msg["id"]] + b"\n")
        sys.stdout.flush()
"""









# --------------------------------------------------------------------------
# Driver against real processes
# --------------------------------------------------------------------------


def pid_is_gone(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


async def test_a_faithful_adapter_passes_with_volatile_fields_masked(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("answer"), timeout=10)
    assert result == c.CaseResult("echo", True)
    assert c.format_result(result) == "PASS echo"


async def test_a_wrong_value_fails_at_its_pointer_with_both_values(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("wrong"), timeout=10)
    assert not result.ok
    assert result.detail == 'response 2 at /result/echo: want "two", got "not what was asked"'
    assert c.format_result(result).splitlines() == [
        'FAIL echo: response 2 at /result/echo: want "two", got "not what was asked"',
        "  adapter stderr: (empty)",
    ]


async def test_a_response_nested_past_recursion_fails_the_case_with_a_sentence(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("deep"), timeout=15)
    assert not result.ok
    # Told at once, not after the timeout waiting for an answer it cannot see.
    assert result.detail.startswith(
        "stopped at response 2, which nests arrays and objects more than 128 levels deep: "
        '{"jsonrpc":"2.0","id":2,"result":[[['
    )
    assert result.detail.endswith("[…; killed it")


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("text", "is not JSON: panic: the index is corrupt " + "x" * 171 + "…"),
        ("stranger", 'is no JSON-RPC message (an object with a method or an id): '
                     '{"status": "ok", "echo": "two"}'),
    ],
    ids=["text", "stranger"],
)
async def test_a_frame_that_can_answer_nothing_fails_the_case_at_once_naming_it(
    tmp_path, adapter, mode, why
):
    # Such a frame answers no request, so the replay cannot go past it: it
    # waited for an answer until the case's timeout (30 s by default), then
    # failed as a hang. The timeout here is far beyond the test's bound.
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(15):
        verified = await c.verify_case(directory, adapter(mode), timeout=120)
        recorded = await c.record_case(directory, adapter(mode), timeout=120)
    assert not verified.ok
    assert verified.detail == f"stopped at response 2, which {why}; killed it"
    assert recorded.detail == (
        f"stopped at response 2, which {why}; killed it; response.jsonl left unchanged"
    )


def test_a_recorded_response_nested_past_recursion_is_an_invalid_case(tmp_path):
    directory = make_case(tmp_path / "suite")
    deep = '{"jsonrpc":"2.0","id":2,"result":' + "[" * 100000 + "]" * 100000 + "}"
    write_jsonl(directory / "response.jsonl", [WANT[0], deep])
    with pytest.raises(c.CaseError, match="line 2 is not JSON: nests arrays and objects"):
        c.load_case(directory)


async def test_an_adapter_writing_without_end_is_cut_off_at_the_output_bound(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(30):
        result = await c.verify_case(directory, adapter("flood"), timeout=20)
    assert not result.ok
    # Stopped as the bound passed, not at the timeout with all of it held.
    assert result.detail == (
        f"the adapter wrote over {64 << 20} bytes to stdout waiting for the response "
        "to request id 1 (line 1); the rest was not read; killed it"
    )


async def test_a_frame_written_after_stdin_closes_fails_the_case(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("extra"), timeout=10)
    assert not result.ok
    assert result.detail.startswith(
        'response 3: want nothing, got {"jsonrpc":"2.0","method":"test/late"'
    )


async def test_a_hung_adapter_times_out_and_is_killed(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    pidfile = tmp_path / "pid"
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("hang", str(pidfile)), timeout=2)
    assert not result.ok
    assert result.detail == (
        "timed out after 2 s waiting for the response to request id 1 (line 1); killed it"
    )
    assert pid_is_gone(pidfile)


async def test_an_adapter_that_outlives_stdin_is_killed_and_reported(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    pidfile = tmp_path / "pid"
    with trio.fail_after(20):
        result = await c.verify_case(
            directory, adapter("linger", str(pidfile)), timeout=10, exit_grace=1
        )
    assert not result.ok
    assert result.detail == "the adapter had not exited 1 s after stdin closed; killed it"
    assert pid_is_gone(pidfile)


async def test_an_adapter_that_dies_early_is_reported_with_its_stderr(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("crash"), timeout=10)
    assert not result.ok
    assert "request id 1 (line 1) unanswered; it exited with status 3" in result.detail
    assert c.format_result(result).splitlines()[1:] == [
        "  adapter stderr:",
        "  | starting",
        "  | boom: cannot open the index",
    ]


async def test_a_clean_transcript_still_fails_if_the_adapter_exits_nonzero(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("exit1"), timeout=10)
    assert result.detail == "the adapter exited with status 1 after stdin closed"


async def test_an_adapter_command_that_cannot_start_fails_the_case(tmp_path):
    directory = make_case(tmp_path / "suite")
    with trio.fail_after(20):
        result = await c.verify_case(directory, [str(tmp_path / "no-such-adapter")], timeout=10)
    assert not result.ok
    assert result.detail.startswith("cannot start the adapter")


async def test_a_notification_reaches_the_adapter_while_the_request_before_it_is_unanswered(
    tmp_path, adapter
):
    # If the harness waited for id 5 before sending the release, neither side
    # would move and the case would time out instead of passing.
    hold = {"jsonrpc": "2.0", "id": 5, "method": "test/hold", "params": {}}
    release = {"jsonrpc": "2.0", "method": "test/release", "params": {}}
    released = {"jsonrpc": "2.0", "id": 5, "error": {"code": -32007, "message": "released"}}
    directory = make_case(
        tmp_path / "suite", requests=[INIT, hold, release], recorded=[WANT[0], released]
    )
    with trio.fail_after(20):
        result = await c.verify_case(directory, adapter("answer"), timeout=10)
    assert result.ok, result.detail


async def test_frames_besides_the_awaited_response_count_toward_responses(tmp_path, adapter):
    log1 = {"jsonrpc": "2.0", "method": "test/log", "params": {"about": 1}}
    log2 = {"jsonrpc": "2.0", "method": "test/log", "params": {"about": 2}}
    counted = make_case(tmp_path / "a", recorded=[log1, WANT[0], log2, WANT[1]])
    uncounted = make_case(tmp_path / "b")
    with trio.fail_after(20):
        assert (await c.verify_case(counted, adapter("chatty"), timeout=10)).ok
        result = await c.verify_case(uncounted, adapter("chatty"), timeout=10)
    assert result.detail.startswith("response 1 at /id: want 1, got nothing")


async def test_record_writes_masked_compact_frames_that_verify_then_passes(tmp_path, adapter):
    directory = make_case(tmp_path / "suite", recorded=None, responses=2)
    with trio.fail_after(20):
        recorded = await c.record_case(directory, adapter("answer"), timeout=10)
        assert recorded == c.CaseResult("echo", True, "2 responses")
        assert c.format_result(recorded, recording=True) == "RECORDED echo (2 responses)"
        lines = (directory / "response.jsonl").read_bytes().splitlines()
        assert [msgspec.json.decode(line) for line in lines] == WANT
        assert all(b": " not in line and b", " not in line for line in lines)
        assert (await c.verify_case(directory, adapter("answer"), timeout=10)).ok


async def test_record_refuses_an_invalid_manifest_and_writes_nothing(tmp_path, adapter):
    directory = make_case(tmp_path / "suite", recorded=None, case="stale-name")
    with trio.fail_after(20):
        result = await c.record_case(directory, adapter("answer"), timeout=10)
    assert not result.ok
    assert result.detail.startswith('invalid case: manifest names case "stale-name"')
    assert result.stderr is None  # no adapter was started
    assert not (directory / "response.jsonl").exists()


async def test_record_refuses_a_run_whose_count_differs_from_the_manifest(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    before = (directory / "response.jsonl").read_bytes()
    with trio.fail_after(20):
        result = await c.record_case(directory, adapter("chatty"), timeout=10)
    assert result.detail == (
        "the manifest declares 2 responses, the run produced 4; response.jsonl left unchanged"
    )
    assert (directory / "response.jsonl").read_bytes() == before


async def test_record_refuses_a_failed_run(tmp_path, adapter):
    directory = make_case(tmp_path / "suite")
    before = (directory / "response.jsonl").read_bytes()
    with trio.fail_after(20):
        result = await c.record_case(directory, adapter("exit1"), timeout=10)
    assert result.detail.endswith(
        "exited with status 1 after stdin closed; response.jsonl left unchanged"
    )
    assert (directory / "response.jsonl").read_bytes() == before


@pytest.mark.skipif(not REFERENCE_SUITE.is_dir(), reason="reference suite not present")
async def test_the_reference_suite_replays_against_a_playback_of_its_own_recordings(tmp_path):
    script = tmp_path / "playback.py"
    script.write_text(PLAYBACK)
    results = []
    with trio.fail_after(60):
        for directory in c.discover_cases(REFERENCE_SUITE):
            results.append(
                await c.verify_case(directory, [sys.executable, str(script)], timeout=20)
            )
    assert len(results) == 9
    assert [c.format_result(r) for r in results if not r.ok] == []


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def test_the_cli_prints_a_line_per_case_then_the_summary_and_fails_on_any_failure(
    tmp_path, adapter, capsys
):
    suite = tmp_path / "suite"
    make_case(suite, "good")
    make_case(suite, "bad", description="")
    status = c.main(
        ["verify", str(suite), "--adapter", shlex.join(adapter("answer")), "--timeout", "10"]
    )
    out = capsys.readouterr().out.splitlines()
    assert status == 1
    assert out == [
        "FAIL bad: invalid case: manifest has no description; a transcript nobody can read "
        "is not documentation",
        "PASS good",
        "1 passed, 1 failed",
    ]


def test_the_cli_exits_zero_when_every_selected_case_passes(tmp_path, adapter, capsys):
    suite = tmp_path / "suite"
    make_case(suite, "good")
    make_case(suite, "bad", description="")
    # Case names may follow --adapter; only the named case runs.
    status = c.main(["verify", str(suite), "--adapter", shlex.join(adapter("answer")), "good"])
    assert status == 0
    assert capsys.readouterr().out.splitlines() == ["PASS good", "1 passed, 0 failed"]


def test_the_cli_records_then_verifies(tmp_path, adapter, capsys):
    suite = tmp_path / "suite"
    make_case(suite, "fresh", recorded=None, responses=2)
    command = shlex.join(adapter("answer"))
    assert c.main(["record", str(suite), "--adapter", command]) == 0
    assert c.main(["verify", str(suite), "--adapter", command]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "RECORDED fresh (2 responses)",
        "1 recorded, 0 failed",
        "PASS fresh",
        "1 passed, 0 failed",
    ]


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        ([], "usage: streamd conformance verify"),
        (["replay", "x"], "usage: streamd conformance verify"),
        (["verify", "{suite}", "nope"], "no case named 'nope'"),
        (["verify", "{suite}/missing"], "is not a directory"),
        (["verify", "{suite}", "--adapter", "'unbalanced"], "--adapter"),
        (["verify", "{suite}", "--adapter", ""], "--adapter is empty"),
        (["verify", "{suite}", "--timeout", "0"], "--timeout must be positive"),
    ],
)
def test_a_usage_error_exits_2_and_runs_nothing(tmp_path, capsys, argv, complaint):
    suite = tmp_path / "suite"
    make_case(suite, "good")
    status = c.main([a.replace("{suite}", str(suite)) for a in argv])
    captured = capsys.readouterr()
    assert status == 2
    assert complaint in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("name", ["manifest.json", "request.jsonl", "response.jsonl"])
def test_a_fifo_or_a_device_among_a_cases_files_is_an_invalid_case_never_a_wait(
    tmp_path, adapter, name
):
    # In a child with a limit: before, the open of the FIFO waited for a writer
    # for good (no case timeout runs while a case is read).
    suite = tmp_path / "suite"
    directory = make_case(suite, "fifo")
    (directory / name).unlink()
    os.mkfifo(directory / name)
    make_case(suite, "zero")
    (suite / "zero" / name).unlink()
    (suite / "zero" / name).symlink_to("/dev/zero")
    done = subprocess.run(
        [sys.executable, "-m", "streamd", "conformance", "verify", str(suite),
         "--adapter", shlex.join(adapter("answer")), "--timeout", "10"],
        capture_output=True, text=True, timeout=60,
    )
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.splitlines() == [
        f"FAIL fifo: invalid case: cannot read {name}: {name} is not a regular file",
        f"FAIL zero: invalid case: cannot read {name}: {name} is not a regular file",
        "0 passed, 2 failed",
    ]


def test_a_case_file_over_the_limit_is_an_invalid_case(tmp_path, monkeypatch):
    monkeypatch.setattr(c.case, "CASE_FILE_LIMIT", 1000)
    directory = make_case(tmp_path / "suite")
    (directory / "request.jsonl").write_bytes(b"\n" * 1001)
    with pytest.raises(c.CaseError, match=r"request\.jsonl is 1001 bytes, over the 1000 a case"):
        c.load_case(directory)


async def test_record_into_a_response_it_cannot_replace_fails_the_case_and_leaves_nothing(
    tmp_path, adapter
):
    directory = make_case(tmp_path / "suite", recorded=None)
    (directory / "response.jsonl").mkdir()
    with trio.fail_after(20):
        result = await c.record_case(directory, adapter("answer"), timeout=10)
    assert not result.ok
    assert result.detail == (
        "cannot write response.jsonl: Is a directory; response.jsonl left unchanged"
    )
    assert sorted(p.name for p in directory.iterdir()) == [
        "fixture", "manifest.json", "request.jsonl", "response.jsonl"
    ]
