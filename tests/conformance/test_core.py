"""The conformance harness's sans-I/O core on values (pointers and masking, structural
comparison, placeholders, classification, the lockstep plan, line splitting, manifest and
case validation), and streamd's extensions of the format (adapter_args, await_frames,
place_files) against tiny adapter scripts.
"""

from __future__ import annotations

import json
import sys

import pytest
import trio
from support.conformance import (
    INIT,
    REFERENCE_SUITE,
    make_case,
)

from streamd import conformance as c

pytestmark = pytest.mark.subprocess

# --------------------------------------------------------------------------
# Pointers and masking
# --------------------------------------------------------------------------


def test_pointer_segments_are_unescaped_per_rfc_6901():
    assert c.parse_pointer("/a~1b/~0c/~01/") == ("a/b", "~c", "~1", "")
    assert c.format_pointer(("a/b", "~c", "~1", "")) == "/a~1b/~0c/~01/"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "whole frame"),
        ("result/at", "does not start with /"),
        ("/result/~2", "not ~0 or ~1"),
        ("/result/a~", "not ~0 or ~1"),
    ],
)
def test_a_malformed_or_whole_frame_pointer_is_refused(text, complaint):
    with pytest.raises(c.CaseError, match=complaint):
        c.parse_pointer(text)


def test_star_masks_every_array_element_and_every_object_member():
    frame = {
        "result": {
            "candidates": [{"confirmed_at": 1, "id": "a"}, {"confirmed_at": 2, "id": "b"}],
            "timings": {"scan": 3, "rank": 4},
        }
    }
    pointers = [
        c.parse_pointer("/result/candidates/*/confirmed_at"),
        c.parse_pointer("/result/timings/*"),
    ]
    assert c.mask(frame, pointers) == {
        "result": {
            "candidates": [
                {"confirmed_at": c.VOLATILE, "id": "a"},
                {"confirmed_at": c.VOLATILE, "id": "b"},
            ],
            "timings": {"scan": c.VOLATILE, "rank": c.VOLATILE},
        }
    }


def test_a_numeric_segment_masks_one_array_element_only():
    frame = {"result": [{"t": 1}, {"t": 2}]}
    assert c.mask(frame, [c.parse_pointer("/result/1/t")]) == {
        "result": [{"t": 1}, {"t": c.VOLATILE}]
    }


@pytest.mark.parametrize(
    "pointer",
    [
        "/error/data",
        "/result/x/deeper",
        "/result/list/5",
        "/result/list/-",
        "/result/list/01",
        "/result/list/a",
    ],
)
def test_a_pointer_that_matches_nothing_leaves_the_frame_alone(pointer):
    frame = {"result": {"x": 7, "list": [1, 2]}}
    assert c.mask(frame, [c.parse_pointer(pointer)]) == {"result": {"x": 7, "list": [1, 2]}}


def test_masking_both_sides_hides_only_the_declared_volatile_difference():
    pointers = [c.parse_pointer("/result/candidates/*/confirmed_at")]
    recorded = [b'{"id":1,"result":{"candidates":[{"confirmed_at":"<volatile>","rank":1}]}}']
    same = [b'{"id":1,"result":{"candidates":[{"confirmed_at":"2026-01-01T00:00:00Z","rank":1}]}}']
    other = [b'{"id":1,"result":{"candidates":[{"confirmed_at":"2026-01-01T00:00:00Z","rank":2}]}}']
    assert c.compare_transcript(recorded, same, pointers) is None
    assert c.compare_transcript(recorded, other, pointers) == (
        "response 1 at /result/candidates/0/rank: want 1, got 2"
    )


# --------------------------------------------------------------------------
# Structural comparison
# --------------------------------------------------------------------------


def test_key_order_and_escaping_do_not_matter_and_numbers_compare_by_value():
    want = c.decode_frame(b'{"a": 1, "b": "\\u0041\\/", "c": [2.50]}')
    got = c.decode_frame(b'{"c": [2.5], "b": "A/", "a": 1.0}')
    assert c.first_difference(want, got) is None


@pytest.mark.parametrize(
    ("want", "got"),
    [({"v": True}, {"v": 1}), ({"v": 0}, {"v": False}), ({"v": None}, {}), ({"v": "1"}, {"v": 1})],
)
def test_json_types_are_not_conflated_the_way_python_equality_would(want, got):
    assert c.first_difference(want, got) is not None


def test_the_first_difference_is_a_pointer_with_both_values():
    want = {"result": {"candidates": [{"a/b": 1}, {"a/b": 2, "x": "same"}], "z": 0}}
    got = {"result": {"candidates": [{"a/b": 1}, {"a/b": 3, "x": "same"}], "z": 9}}
    found = c.first_difference(want, got)
    assert found == c.Difference("/result/candidates/1/a~1b", 2, 3)
    assert found.describe() == " at /result/candidates/1/a~1b: want 2, got 3"


def test_the_first_difference_follows_the_recorded_key_order():
    want = c.decode_frame(b'{"b": 1, "a": 1}')
    got = c.decode_frame(b'{"a": 2, "b": 2}')
    assert c.first_difference(want, got).pointer == "/b"


def test_missing_and_extra_keys_and_elements_are_reported_as_nothing():
    assert c.first_difference({"a": 1}, {}) == c.Difference("/a", 1, c.ABSENT)
    assert c.first_difference({}, {"a": 1}).describe() == " at /a: want nothing, got 1"
    assert c.first_difference([1, 2], [1]) == c.Difference("/1", 2, c.ABSENT)
    assert c.first_difference([1], [1, {"x": 1}]).describe() == ' at /1: want nothing, got {"x":1}'


def test_a_long_value_is_clipped_in_the_report():
    assert len(c.render("x" * 10_000)) == c.RENDER_LIMIT


def test_an_extra_frame_and_a_missing_frame_both_fail_the_comparison():
    recorded = [b'{"id":1,"result":{}}']
    extra = c.compare_transcript(recorded, [b'{"id":1,"result":{}}', b'{"method":"late"}'], [])
    assert (
        extra
        == 'response 2: want nothing, got {"method":"late"} (the transcript holds 1 responses)'
    )
    missing = c.compare_transcript(recorded, [], [])
    assert (
        missing
        == 'response 1: want {"id":1,"result":{}}, got nothing (the run produced 0 responses)'
    )
    assert c.compare_transcript(recorded, [b"not json"], []) == "response 1 is not JSON: not json"



def test_a_result_answered_as_an_error_shows_the_error_it_got():
    # A suite replayed against the wrong adapter (the event-log source without
    # --adapter 'streamd --eventlog') is refused at its handshake: the report
    # must show that refusal, not only "got nothing" at /result.
    recorded = [b'{"jsonrpc":"2.0","id":1,"result":{"adapter_id":"x/1"}}']
    refused = b'{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no such file"}}'
    assert c.compare_transcript(recorded, [refused], []) == (
        'response 1 at /result: want {"adapter_id":"x/1"}, got nothing: it answered'
        ' the error {"code":-32000,"message":"no such file"}'
    )
    answered = c.compare_transcript([refused], recorded, [])
    assert answered == (
        'response 1 at /error: want {"code":-32000,"message":"no such file"}, got nothing:'
        ' it answered the result {"adapter_id":"x/1"}'
    )

# --------------------------------------------------------------------------
# Placeholders, classification, lockstep plan, line splitting
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        '/tmp/has "quotes"',
        "C:\\Users\\back\\slash",
        "/tmp/new\nline\ttab",
        "/tmp/ünïcode ☃",
        "/tmp/</script>",
    ],
)
def test_a_substituted_path_parses_back_to_exactly_that_path(path):
    template = '{"params":{"location":"${FIXTURE}","workdir":"${WORKDIR}/sub"}}'
    line = c.substitute(template, fixture=path, workdir=path)
    assert json.loads(line)["params"] == {"location": path, "workdir": path + "/sub"}


def test_substitution_is_one_pass_so_a_path_is_never_substituted_again():
    line = c.substitute('["${WORKDIR}","${FIXTURE}"]', fixture="/f", workdir="/w/${FIXTURE}")
    assert json.loads(line) == ["/w/${FIXTURE}", "/f"]


def test_an_unencodable_path_is_a_case_error_not_a_crash():
    with pytest.raises(c.CaseError, match="cannot be written as JSON"):
        c.substitute('"${FIXTURE}"', fixture="/tmp/\udcff", workdir="/w")


@pytest.mark.parametrize(
    ("line", "kind", "request_id"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":"m"}', c.LineKind.REQUEST, 7),
        (b'{"jsonrpc":"2.0","id":"x","method":"m"}', c.LineKind.REQUEST, "x"),
        (b'{"jsonrpc":"2.0","method":"m"}', c.LineKind.NOTIFICATION, None),
        (b'{"jsonrpc":"2.0","id":null,"method":"m"}', c.LineKind.NOTIFICATION, None),
        (b'{"jsonrpc":"2.0","id":3}', c.LineKind.OTHER, None),
        (b'{"jsonrpc":"2.0", "id":', c.LineKind.OTHER, None),
        (b"[1,2]", c.LineKind.OTHER, None),
    ],
)
def test_a_line_is_a_request_a_notification_or_neither(line, kind, request_id):
    assert c.classify(line) == (kind, request_id)


def test_a_request_is_awaited_only_before_the_next_request_so_notifications_go_at_once():
    def line(n, kind, rid=None):
        return c.Line(n, b"", kind, rid)

    req1, note, other, req2 = (
        line(1, c.LineKind.REQUEST, 1),
        line(2, c.LineKind.NOTIFICATION),
        line(3, c.LineKind.OTHER),
        line(4, c.LineKind.REQUEST, 2),
    )
    assert c.lockstep_steps([req1, note, other, req2]) == [
        c.Send(req1),
        c.Send(note),
        c.Send(other),
        c.Await(req1),
        c.Send(req2),
        c.Await(req2),
    ]


def test_a_response_is_matched_by_json_id_and_a_request_from_the_adapter_is_not_one():
    assert c.answers(b'{"id":1.0,"result":{}}', 1)
    assert not c.answers(b'{"id":true,"result":{}}', 1)
    assert not c.answers(b'{"id":1,"method":"server/ping"}', 1)
    assert not c.answers(b'{"id":2,"error":{}}', 1)


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (b"garbage", "is not JSON"),
        (b"[1, 2]", "is no JSON-RPC message (an object with a method or an id)"),
        (b'{"result":{}}', "is no JSON-RPC message (an object with a method or an id)"),
    ],
)
def test_a_frame_that_can_be_no_message_answers_nothing_and_says_why(frame, why):
    # Not "False": the replay would wait on for an answer after it until the
    # case's timeout.
    with pytest.raises(c.BadFrame) as caught:
        c.answers(frame, 1)
    assert str(caught.value) == why
    assert caught.value.about(frame) == f"{why}: {frame.decode()}"


def test_the_line_splitter_keeps_a_partial_last_line_and_never_cuts_at_u2028():
    splitter = c.FrameLines()
    sep = "\u2028".encode()
    assert splitter.feed(b'{"a":1}\n\n  \r\n{"b":"x' + sep) == [b'{"a":1}']
    assert splitter.feed(b'y"}\n{"c"') == [b'{"b":"x' + sep + b'y"}']
    assert splitter.feed(b":3}") == []
    assert splitter.close() == [b'{"c":3}']


# --------------------------------------------------------------------------
# Manifest and case validation
# --------------------------------------------------------------------------

GOOD_MANIFEST = {
    "case": "c1",
    "description": "why",
    "flow": "lockstep",
    "placeholders": {"FIXTURE": "x", "WORKDIR": "y"},
    "volatile": ["/result/checked_at", "/result/candidates/*/confirmed_at"],
    "responses": 2,
}


def test_a_valid_manifest_parses_its_pointers():
    manifest = c.validate_manifest(GOOD_MANIFEST, "c1")
    assert manifest.pointers == (
        ("result", "checked_at"),
        ("result", "candidates", "*", "confirmed_at"),
    )
    assert manifest.responses == 2


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"case": "renamed"}, 'manifest names case "renamed" but the directory is "c1"'),
        ({"description": "   "}, "no description"),
        ({"description": None}, "no description"),
        ({"flow": "concurrent"}, 'flow "concurrent" is not defined'),
        ({"responses": "2"}, "responses must be a whole number"),
        ({"responses": True}, "responses must be a whole number"),
        ({"responses": 2.0}, "responses must be a whole number"),
        ({"responses": -1}, "responses must be a whole number"),
        ({"volatile": "/result/x"}, "volatile must be a list"),
        ({"volatile": [3]}, r"volatile\[0\] is 3"),
        ({"volatile": ["result/x"]}, "does not start with /"),
        ({"placeholders": {"NOW": "clock"}}, 'placeholder "NOW" cannot be bound'),
        ({"volatil": []}, 'unknown key "volatil"'),
    ],
)
def test_an_invalid_manifest_is_refused_with_the_reason(change, complaint):
    with pytest.raises(c.CaseError, match=complaint):
        c.validate_manifest({**GOOD_MANIFEST, **change}, "c1")


@pytest.mark.parametrize("key", ["case", "description", "flow", "volatile", "responses"])
def test_a_manifest_missing_a_required_key_is_refused(key):
    data = {k: v for k, v in GOOD_MANIFEST.items() if k != key}
    with pytest.raises(c.CaseError, match=f'no "{key}"'):
        c.validate_manifest(data, "c1")


def test_a_recording_whose_count_differs_from_the_manifest_is_an_invalid_case(tmp_path):
    directory = make_case(tmp_path, responses=3)
    with pytest.raises(
        c.CaseError, match=r"response\.jsonl holds 2 frames but the manifest declares 3"
    ):
        c.load_case(directory)


def test_declaring_fewer_responses_than_requests_is_an_invalid_case(tmp_path):
    directory = make_case(tmp_path, recorded=None, responses=1)
    with pytest.raises(c.CaseError, match="holds 2 requests but the manifest declares 1"):
        c.load_case(directory, with_recording=False)


def test_a_case_using_fixture_without_a_fixture_directory_is_invalid(tmp_path):
    directory = make_case(tmp_path)
    (directory / "fixture" / "data.jsonl").unlink()
    (directory / "fixture").rmdir()
    with pytest.raises(c.CaseError, match="no fixture/ directory"):
        c.load_case(directory)


@pytest.mark.skipif(not REFERENCE_SUITE.is_dir(), reason="reference suite not present")
def test_the_reference_suite_holds_nine_valid_cases():
    cases = [c.load_case(d) for d in c.discover_cases(REFERENCE_SUITE)]
    assert len(cases) == 9
    assert all(len(case.recorded) == case.manifest.responses for case in cases)


# --------------------------------------------------------------------------
# adapter_args and await_frames (streamd's extensions of the format)
# --------------------------------------------------------------------------

# Answers each request with its own argv; test/stream starts a thread writing
# three notifications 100 ms apart, and test/release answers how many of them
# had been written when it arrived.
STREAMER = r"""
import json, sys, threading, time

lock = threading.Lock()
written = 0

def write(frame, note=False):
    global written
    with lock:
        written += note  # counted before it can be read, so a reply never lags
        sys.stdout.write(json.dumps(frame) + "\n")
        sys.stdout.flush()

def stream():
    for i in range(3):
        time.sleep(0.1)
        write({"jsonrpc": "2.0", "method": "test/note", "params": {"n": i}}, note=True)

held = None
for raw in sys.stdin:
    msg = json.loads(raw)
    if msg.get("method") == "test/stream":
        held = msg["id"]
        threading.Thread(target=stream).start()
    elif msg.get("method") == "test/release":
        with lock:
            seen = written
        write({"jsonrpc": "2.0", "id": held, "result": {"seen": seen}})
    elif msg.get("id") is not None:
        write({"jsonrpc": "2.0", "id": msg["id"], "result": {"argv": sys.argv[1:]}})
"""


@pytest.fixture
def streamer(tmp_path):
    script = tmp_path / "streamer.py"
    script.write_text(STREAMER)
    return [sys.executable, str(script)]


async def test_adapter_args_are_appended_with_placeholders_bound_raw(tmp_path, streamer):
    # A quote in the fixture path: JSON escaping would show up as a backslash.
    directory = make_case(
        tmp_path / 'su"ite',
        requests=[INIT],
        recorded=None,
        responses=1,
        volatile=[],
        adapter_args=["--db", "${WORKDIR}/events.db", "--from=${FIXTURE}"],
    )
    with trio.fail_after(20):
        result = await c.record_case(directory, streamer, timeout=10)
    assert result.ok, result.detail
    argv = json.loads((directory / "response.jsonl").read_text())["result"]["argv"]
    assert argv[0] == "--db"
    assert argv[1].endswith("/events.db") and "streamd-conformance-echo-" in argv[1]
    assert argv[2] == f"--from={directory / 'fixture'}"


async def test_a_line_named_in_await_frames_waits_for_that_many_frames(tmp_path, streamer):
    stream = {"jsonrpc": "2.0", "id": 2, "method": "test/stream", "params": {}}
    release = {"jsonrpc": "2.0", "method": "test/release", "params": {}}
    notes = [{"jsonrpc": "2.0", "method": "test/note", "params": {"n": i}} for i in range(3)]
    argv = {"jsonrpc": "2.0", "id": 1, "result": {"argv": []}}
    released = {"jsonrpc": "2.0", "id": 2, "result": {"seen": 3}}
    directory = make_case(
        tmp_path / "suite",
        requests=[INIT, stream, release],
        recorded=[argv, *notes, released],
        volatile=[],
        await_frames={"3": 4},  # line 3 (the release) after the reply and 3 notes
    )
    with trio.fail_after(20):
        result = await c.verify_case(directory, streamer, timeout=10)
    assert result.ok, result.detail


def test_await_frames_comes_after_the_lockstep_wait_and_before_the_send():
    req1 = c.Line(1, b"", c.LineKind.REQUEST, 1)
    req2 = c.Line(2, b"", c.LineKind.REQUEST, 2)
    note = c.Line(3, b"", c.LineKind.NOTIFICATION)
    assert c.lockstep_steps([req1, req2, note], {2: 1, 3: 4}) == [
        c.Send(req1),
        c.Await(req1),
        c.AwaitFrames(req2, 1),
        c.Send(req2),
        c.AwaitFrames(note, 4),
        c.Send(note),
        c.Await(req2),
    ]


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"adapter_args": "--db x"}, "adapter_args must be a list of strings"),
        ({"adapter_args": ["--db", 3]}, "adapter_args must be a list of strings"),
        ({"adapter_args": ["${HOME}/x.db"]}, r"adapter_args uses \$\{HOME\}"),
        ({"await_frames": [2]}, "await_frames must be an object"),
        ({"await_frames": {"x": 1}}, 'await_frames key "x" is not a line number'),
        ({"await_frames": {"0": 1}}, 'await_frames key "0" is not a line number'),
        ({"await_frames": {"2": 3}}, "from 1 to responses"),
        ({"await_frames": {"2": 0}}, "from 1 to responses"),
        ({"await_frames": {"2": True}}, "from 1 to responses"),
    ],
)
def test_invalid_adapter_args_or_await_frames_are_refused(change, complaint):
    with pytest.raises(c.CaseError, match=complaint):
        c.validate_manifest({**GOOD_MANIFEST, **change}, "c1")


def test_await_frames_naming_a_line_the_case_lacks_is_an_invalid_case(tmp_path):
    directory = make_case(tmp_path, await_frames={"9": 1})
    with pytest.raises(c.CaseError, match=r"names line 9, which request\.jsonl does not hold"):
        c.load_case(directory)


# place_files (a file that appears while the adapter runs)
# --------------------------------------------------------------------------

# Answers each request with what the file named in its params holds right now.
LOOKER = r"""
import json, sys

for raw in sys.stdin:
    msg = json.loads(raw)
    try:
        with open(msg["params"]["path"]) as f:
            seen = f.read()
    except FileNotFoundError:
        seen = None
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": seen}) + "\n")
    sys.stdout.flush()
"""


def test_placed_files_go_after_the_lockstep_wait_and_before_the_send():
    req1 = c.Line(1, b"", c.LineKind.REQUEST, 1)
    req2 = c.Line(2, b"", c.LineKind.REQUEST, 2)
    files = (("/case/staged/b.jsonl", "/wd/b.jsonl"),)
    assert c.lockstep_steps([req1, req2], {2: 1}, {2: files}) == [
        c.Send(req1),
        c.Await(req1),
        c.Place(req2, files),
        c.AwaitFrames(req2, 1),
        c.Send(req2),
        c.Await(req2),
    ]


async def test_a_staged_file_appears_in_workdir_only_before_the_line_that_names_it(tmp_path):
    script = tmp_path / "looker.py"
    script.write_text(LOOKER)
    look = [
        {"jsonrpc": "2.0", "id": i, "method": "look", "params": {"path": "${WORKDIR}/b.jsonl"}}
        for i in (1, 2)
    ]
    directory = make_case(
        tmp_path / "suite",
        requests=look,
        recorded=[
            {"jsonrpc": "2.0", "id": 1, "result": None},
            {"jsonrpc": "2.0", "id": 2, "result": "late\n"},
        ],
        volatile=[],
        place_files={"2": ["b.jsonl"]},
    )
    (directory / "staged").mkdir()
    (directory / "staged" / "b.jsonl").write_text("late\n")
    with trio.fail_after(20):
        result = await c.verify_case(directory, [sys.executable, str(script)], timeout=10)
    assert result.ok, result.detail


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"place_files": ["b"]}, "place_files must be an object"),
        ({"place_files": {"x": ["b"]}}, 'place_files key "x" is not a line number'),
        ({"place_files": {"2": []}}, "must be a non-empty list of file names"),
        ({"place_files": {"2": ["../b"]}}, "not a plain file name"),
        ({"place_files": {"2": [".."]}}, "not a plain file name"),
        ({"place_files": {"2": [7]}}, "not a plain file name"),
    ],
)
def test_invalid_place_files_are_refused(change, complaint):
    with pytest.raises(c.CaseError, match=complaint):
        c.validate_manifest({**GOOD_MANIFEST, **change}, "c1")


def test_place_files_naming_a_file_the_case_does_not_stage_is_an_invalid_case(tmp_path):
    directory = make_case(tmp_path, place_files={"2": ["b.jsonl"]})
    with pytest.raises(c.CaseError, match=r"names staged/b\.jsonl, which the case does not hold"):
        c.load_case(directory)
