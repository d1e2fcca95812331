"""The cancellation kit's judges, on synthetic frame sequences: no process, no clock.

Each scenario's judge is handed an Observation built here, so every rule is
shown to fail on the frames that break it (a result after a cancel, two
answers, no answer, an answered notification) and to pass or say "observed"
on the ones the protocol allows. Times are part of an observation but never of
a verdict; one test turns every time upside down to show it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from streamd.conformance import case as cases
from streamd.conformance.cancel import (
    Await,
    Close,
    Observation,
    Received,
    Scenario,
    Send,
    Sent,
    matrix,
    offers_stall,
    write_case,
)
from streamd.conformance.cancel import script as s
from streamd.conformance.cancel.judging import stops_wait
from streamd.conformance.cancel.live import make_place
from streamd.conformance.cancel.report import Row, format_row, row_json

CANCELED = {"code": -32007, "message": "context canceled"}
EXPIRED = {"code": -32007, "message": "context deadline exceeded"}
MANIFEST = {"settings_schema": {"properties": {"debug_stall_ms": {"type": "integer"}}}}


def scenario(name: str) -> Scenario:
    found = [sc for sc in matrix(trials=2, offsets=(0.0, 0.001)) if sc.name == name]
    assert found, name
    return found[0]


def result(rid: Any, value: Any = None) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": {} if value is None else value}


def error(rid: Any, err: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def observe(
    frames: Sequence[Any],
    sent: Sequence[str] = (),
    *,
    exit_code: int | None = 0,
    problem: str | None = None,
    frame_times: Sequence[float] | None = None,
    sent_times: Sequence[float] | None = None,
) -> Observation:
    """An observation: ``frames`` arrive in order (bytes are sent as is),
    ``sent`` are labels of the lines written, each at its own time."""
    f_times = frame_times or [0.010 * (i + 1) for i in range(len(frames))]
    s_times = sent_times or [0.010 * i + 0.005 for i in range(len(sent))]
    received = tuple(
        Received.of(at, f if isinstance(f, bytes) else json.dumps(f).encode())
        for at, f in zip(f_times, frames, strict=True)
    )
    return Observation(
        sent=tuple(Sent(at, label, b"") for at, label in zip(s_times, sent, strict=True)),
        received=received,
        exit_code=exit_code,
        exited_at=1.0 if exit_code is not None else None,
        closed_at=0.9,
        problem=problem,
    )


def verdict(name: str, obs: Observation) -> str:
    return scenario(name).judge(obs).verdict


INIT = result(1, MANIFEST)


# --- 1: cancel in flight -------------------------------------------------------


def test_a_cancelled_search_answering_minus_32007_once_passes():
    assert verdict("cancel-inflight", observe([INIT, error(2, CANCELED)])) == "pass"


def test_a_result_after_a_cancel_fails():
    j = scenario("cancel-inflight").judge(observe([INIT, result(2)]))
    assert j.verdict == "fail" and "result after its cancel" in j.detail


def test_two_answers_to_one_cancelled_search_fail():
    j = scenario("cancel-inflight").judge(observe([INIT, error(2, CANCELED), result(2)]))
    assert j.verdict == "fail" and "answered 2 times" in j.detail


def test_no_answer_to_a_cancelled_search_fails():
    j = scenario("cancel-inflight").judge(observe([INIT]))
    assert j.verdict == "fail" and "never answered" in j.detail


def test_a_hang_the_harness_killed_fails_whatever_arrived():
    obs = observe([INIT, error(2, CANCELED)], exit_code=None,
                  problem="timed out after 60 s waiting for the answer; killed it")
    assert verdict("cancel-inflight", obs) == "fail"


def test_an_error_other_than_minus_32007_for_a_cancel_fails():
    obs = observe([INIT, error(2, {"code": -32603, "message": "boom"})])
    assert verdict("cancel-inflight", obs) == "fail"


def test_a_failed_handshake_fails_the_row():
    obs = observe([error(1, {"code": -32602, "message": "no"}), error(2, CANCELED)])
    assert verdict("cancel-inflight", obs) == "fail"


def test_a_line_that_is_not_json_fails():
    assert verdict("cancel-inflight", observe([INIT, b"oops", error(2, CANCELED)])) == "fail"


def test_json_that_is_no_json_rpc_message_fails_naming_it():
    # Before, only text that is not JSON failed: {"status": "ok"} in place of
    # the answers was "observed" silence, and the row passed.
    j = scenario("eof-inflight").judge(observe([INIT, {"status": "ok"}, [2]]))
    assert j.verdict == "fail"
    why = "is no JSON-RPC message (an object with a method or an id)"
    assert f'response 2 {why}: {{"status": "ok"}}' in j.detail
    assert f"response 3 {why}: [2]" in j.detail


def test_a_bad_frame_the_run_stopped_at_is_named_once():
    obs = observe([INIT, b"panic"], problem="stopped at response 2, which is not JSON: panic")
    obs = dataclasses.replace(obs, stopped_at=2)
    j = scenario("cancel-inflight").judge(obs)
    assert j.verdict == "fail" and j.detail.count("is not JSON: panic") == 1


def test_a_wait_stops_at_a_bad_frame_only_when_it_came_before_the_answer():
    frames = [Received.of(0.0, f) for f in (b'{"id":1,"result":{}}', b"x" * 300, b"{}")]
    assert stops_wait(frames, 1) is None  # answered first: the run goes on
    assert stops_wait(frames, 2) == (2, "is not JSON: " + "x" * 199 + "…")
    assert stops_wait(frames[:1], 2) is None  # nothing bad yet: wait on


def test_a_nonzero_exit_fails():
    assert verdict("cancel-inflight", observe([INIT, error(2, CANCELED)], exit_code=1)) == "fail"


def test_times_never_decide_a_verdict():
    # The same frames, answered a minute after the cancel instead of at once.
    quick = observe([INIT, error(2, CANCELED)], ["initialize 1", "search 2", "recall/cancel 2"])
    slow = observe([INIT, error(2, CANCELED)], ["initialize 1", "search 2", "recall/cancel 2"],
                   frame_times=[0.01, 60.0])
    a, b = (scenario("cancel-inflight").judge(o) for o in (quick, slow))
    assert a.verdict == b.verdict == "pass"
    assert b.times["cancel_to_answer_ms"] > a.times["cancel_to_answer_ms"]


# --- 2-4 -----------------------------------------------------------------------


def test_only_the_cancelled_one_of_several_may_end():
    ok = observe([INIT, error(3, CANCELED), result(2), result(4)])
    assert verdict("cancel-one-of-several", ok) == "pass"
    sibling = observe([INIT, error(3, CANCELED), error(2, CANCELED), result(4)])
    j = scenario("cancel-one-of-several").judge(sibling)
    assert j.verdict == "fail" and "search 2 ended too" in j.detail


def test_an_answer_to_a_cancel_notification_fails():
    # A -32602 for the cancel of an id never sent, with that id, or with null.
    base = [INIT, result(2), result(3), result(4)]
    assert verdict("cancel-not-inflight", observe(base)) == "pass"
    for stray in (error(99, {"code": -32602, "message": "unknown id"}),
                  error(None, {"code": -32600, "message": "x"})):
        j = scenario("cancel-not-inflight").judge(observe([*base, stray]))
        assert j.verdict == "fail" and "answered a notification" in j.detail


def test_a_second_cancel_that_brings_a_second_answer_fails():
    assert verdict("cancel-twice", observe([INIT, error(2, CANCELED), result(3)])) == "pass"
    twice = observe([INIT, error(2, CANCELED), error(2, CANCELED), result(3)])
    assert verdict("cancel-twice", twice) == "fail"


# --- 5: the race ------------------------------------------------------------------


def test_the_race_passes_whichever_answer_wins_each_trial():
    # Offsets 0 and 1 ms, two trials each: ids 1000, 1001, 2000, 2001.
    obs = observe([INIT, error(1000, CANCELED), result(1001), result(2000), result(2001)])
    j = scenario("cancel-races-completion").judge(obs)
    assert j.verdict == "pass"
    assert "0 ms: 1 results, 1 cancelled" in j.detail


def test_the_race_fails_when_any_trial_gets_two_answers_or_none():
    two = observe([INIT, error(1000, CANCELED), result(1000), result(1001), result(2000),
                   result(2001)])
    assert verdict("cancel-races-completion", two) == "fail"
    none = observe([INIT, result(1001), result(2000), result(2001)])
    assert verdict("cancel-races-completion", none) == "fail"


# --- 6: malformed cancels ------------------------------------------------------------

MALFORMED_SENT = [
    "initialize 1", "search 2", "cancel with no id", "cancel with id true",
    'cancel with id "2"', "health 8", "cancel as request 9", "health 10", "recall/cancel 2",
]
NOT_FOUND = {"code": -32601, "message": 'unknown method "recall/cancel"'}


def _malformed(frames: list[Any], times: list[float]) -> Observation:
    # Lines are written at 0.00, 0.01, ... 0.08 s (the valid cancel last, at 0.08).
    return observe(frames, MALFORMED_SENT, frame_times=times,
                   sent_times=[0.01 * i for i in range(len(MALFORMED_SENT))])


def test_a_malformed_cancel_that_ends_the_search_fails():
    # Search 2's -32007 arrives before the request-form cancel was written.
    obs = _malformed([INIT, result(8), error(2, CANCELED), error(9, NOT_FOUND), result(10)],
                     [0.001, 0.055, 0.056, 0.065, 0.075])
    j = scenario("cancel-malformed").judge(obs)
    assert j.verdict == "fail" and "malformed one ended it" in j.detail


def test_a_request_form_cancel_that_ends_the_search_is_observed():
    obs = _malformed([INIT, result(8), error(9, NOT_FOUND), error(2, CANCELED), result(10)],
                     [0.001, 0.055, 0.065, 0.066, 0.075])
    assert verdict("cancel-malformed", obs) == "observed"


def test_malformed_cancels_ignored_and_the_request_form_answered_pass():
    obs = _malformed([INIT, result(8), error(9, NOT_FOUND), result(10), error(2, CANCELED)],
                     [0.001, 0.055, 0.065, 0.075, 0.085])
    assert verdict("cancel-malformed", obs) == "pass"
    unanswered = _malformed([INIT, result(8), result(10), error(2, CANCELED)],
                            [0.001, 0.055, 0.075, 0.085])
    assert verdict("cancel-malformed", unanswered) == "fail"  # request 9 owed an answer


# --- 7-8: deadlines --------------------------------------------------------------


def test_a_past_deadline_search_must_answer_minus_32007():
    assert verdict("deadline-past-search", observe([INIT, error(2, EXPIRED)])) == "pass"
    assert verdict("deadline-past-search", observe([INIT, result(2)])) == "fail"


def test_a_past_deadline_on_other_methods_served_anyway_is_observed():
    for method in ("expand", "health", "refresh"):
        assert verdict(f"deadline-past-{method}", observe([INIT, result(2)])) == "observed"
        assert verdict(f"deadline-past-{method}", observe([INIT, error(2, EXPIRED)])) == "pass"


def test_a_deadline_passing_mid_request_must_end_it():
    assert verdict("deadline-expires-inflight", observe([INIT, error(2, EXPIRED)])) == "pass"
    assert verdict("deadline-expires-inflight", observe([INIT, result(2)])) == "fail"


# --- 9-10: shutdown and end of input --------------------------------------------------


def test_shutdown_finishing_work_and_answering_last_passes():
    assert verdict("shutdown-inflight", observe([INIT, result(2), result(3), result(4)])) == "pass"


def test_shutdown_that_acks_first_and_fails_the_work_is_observed():
    closed = {"code": -32603, "message": "adapter: closed"}
    obs = observe([INIT, result(4), error(3, closed), error(2, closed)])
    j = scenario("shutdown-inflight").judge(obs)
    assert j.verdict == "observed" and "followed the {}" in j.detail


def test_shutdown_must_still_answer_each_request_once_and_ack_with_an_empty_object():
    assert verdict("shutdown-inflight", observe([INIT, result(4), result(2)])) == "fail"
    bad_ack = observe([INIT, result(2), result(3), result(4, {"bye": 1})])
    assert verdict("shutdown-inflight", bad_ack) == "fail"


def test_end_of_input_cancelling_recall_requests_passes_and_silence_is_observed():
    assert verdict("eof-inflight", observe([INIT, error(2, CANCELED), error(3, CANCELED)])) \
        == "pass"
    assert verdict("eof-inflight", observe([INIT])) == "observed"
    doubled = observe([INIT, error(2, CANCELED), error(2, CANCELED), error(3, CANCELED)])
    assert verdict("eof-inflight", doubled) == "fail"
    assert verdict("eof-inflight", observe([INIT], exit_code=3)) == "fail"


def test_end_of_input_must_not_cancel_an_event_log_watch():
    assert verdict("eof-inflight-eventlog", observe([result(2, {"last_seq": 0})])) == "pass"
    assert verdict("eof-inflight-eventlog", observe([error(2, CANCELED)])) == "fail"
    unknown = error(2, {"code": -32601, "message": 'unknown method "eventlog/watch"'})
    assert verdict("eof-inflight-eventlog", observe([unknown])) == "observed"


# --- 11: the LSP spelling ----------------------------------------------------------------

LSP_SENT = ["initialize 1", "search 2", "$/cancelRequest 2", "health 3", "recall/cancel 2"]


def test_the_lsp_spelling_honoured_passes_and_ignored_is_observed():
    times = [0.0, 0.01, 0.02, 0.03, 0.04]
    honoured = observe([INIT, error(2, CANCELED), result(3)], LSP_SENT,
                       frame_times=[0.001, 0.025, 0.035], sent_times=times)
    ignored = observe([INIT, result(3), error(2, CANCELED)], LSP_SENT,
                      frame_times=[0.001, 0.035, 0.045], sent_times=times)
    assert verdict("cancel-lsp-spelling", honoured) == "pass"
    assert verdict("cancel-lsp-spelling", ignored) == "observed"


# --- scripts, the probe, cases, rows --------------------------------------------------


def test_the_lockstep_script_waits_for_an_answer_before_the_next_request(tmp_path: Path):
    steps = scenario("cancel-not-inflight").script(make_place(tmp_path))
    kinds = [type(step).__name__ if not isinstance(step, Send) else step.label for step in steps]
    # The cancel of id 2 goes out only after search 2 is answered (health 3 waits for it).
    assert kinds == [
        "initialize 1", "Await", "search 2", "Await", "health 3",
        "recall/cancel 2", "recall/cancel 99", 'recall/cancel "never-sent"', "Await",
        "health 4", "Await", "Close",
    ]
    assert isinstance(steps[1], Await) and isinstance(steps[-1], Close)


def test_the_probe_reads_debug_stall_ms_from_the_settings_schema():
    assert offers_stall(observe([INIT])) is True
    assert offers_stall(observe([result(1, {"settings_schema": {"properties": {}}})])) is False
    assert offers_stall(observe([error(1, {"code": -32602, "message": "x"})])) is None


def test_without_debug_stall_ms_a_search_that_wins_is_observed_not_failed():
    unheld = next(sc for sc in matrix(stall=False, trials=1) if sc.name == "cancel-inflight")
    assert unheld.judge(observe([INIT, result(2)])).verdict == "observed"


@pytest.mark.parametrize("sc", [sc for sc in matrix(trials=1) if sc.case is not None],
                         ids=lambda sc: sc.name)
def test_every_recordable_scenario_writes_a_case_the_replayer_accepts(sc, tmp_path: Path):
    directory = write_case(sc, tmp_path)
    case = cases.load_case(directory, with_recording=False)
    manifest = json.loads((directory / "manifest.json").read_bytes())
    # Recall's keys only, so Recall's doctor replays it too.
    assert set(manifest) == {"case", "description", "flow", "placeholders", "volatile",
                             "responses"}
    assert case.manifest.responses == sc.responses
    # The live run of a lockstep scenario is the case's own conversation.
    first = sc.script(s.Place(case.fixture, "/w"))[0]
    assert isinstance(first, Send) and first.label == "initialize 1"


def test_the_recordable_scenarios_are_the_issues_list():
    numbers = {sc.number.rstrip("abcd") for sc in matrix(trials=1) if sc.case is not None}
    assert numbers == {"1", "3", "4", "6", "7", "11"}


def test_a_row_prints_the_rule_and_its_source_and_json_carries_the_frames():
    sc = scenario("cancel-inflight")
    obs = observe([INIT, error(2, CANCELED)], ["initialize 1", "search 2", "recall/cancel 2"])
    row = Row(sc, obs, sc.judge(obs))
    text = format_row(row)
    assert text.startswith("PASS") and sc.rule in text and sc.source in text
    line = json.loads(row_json(row))
    assert line["scenario"] == "cancel-inflight" and line["pass"] is True
    assert line["rule"] == sc.rule and line["source"] == sc.source
    assert [r["frame"]["id"] for r in line["received"]] == [1, 2]
    assert "cancel_to_answer_ms" in line["times"]


@pytest.mark.parametrize("argv", [["no-such-scenario"], ["--trials", "0"], ["--adapter", ""],
                                  ["--timeout", "0"], ["--adapter", "'unclosed"]])
def test_a_usage_error_is_one_line_and_exit_2_before_any_adapter_runs(argv, capsys):
    from streamd.conformance.cancel.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("streamd conformance cancel: ")


def test_without_debug_stall_ms_a_malformed_cancel_row_never_blames_a_search_that_won():
    # Unheld, search 2 may finish on its own before any cancel: a result is no
    # cancel's doing, whichever write it came before (how soon it came is the
    # machine's speed, which must not turn the row into a failure).
    unheld = next(sc for sc in matrix(stall=False, trials=1) if sc.name == "cancel-malformed")
    for at in (0.015, 0.065):  # before the request-form cancel, or after it
        frames = sorted([(0.001, INIT), (at, result(2)), (0.055, result(8)),
                         (0.066, error(9, NOT_FOUND)), (0.075, result(10))],
                        key=lambda p: p[0])
        obs = _malformed([f for _, f in frames], [t for t, _ in frames])
        j = unheld.judge(obs)
        assert j.verdict == "observed", j.detail
        assert "finished before its cancel" in j.detail
