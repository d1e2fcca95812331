"""How an event becomes a record: title, text and kind for each content shape."""

from __future__ import annotations

import json

import pytest

from streamd.recall.eventlog.project import TEXT_BYTES, TITLE_BYTES, describe, project
from streamd.recall.records import parse_line, trim_space


def row(content, *, author="model", delta=None, seq=7, branch="", invocation=""):
    return (seq, "chat", "u1", "s1", "ev-7", invocation, author, branch,
            1_777_680_000_123_456, json.dumps(content), delta)


def test_adk_text_parts_are_a_model_message_by_role_or_author():
    kind, title, text = describe(json.dumps(
        {"role": "model", "parts": [{"text": "First line\nsecond"}, {"text": "more"}]}),
        "agent", None)
    assert (kind, title, text) == ("model_message", "First line", "First line\nsecond\nmore")
    assert describe(json.dumps({"role": "user", "parts": [{"text": "hi"}]}), "x", None)[0] \
        == "user_message"
    # Without a role the author decides.
    assert describe(json.dumps({"parts": [{"text": "hi"}]}), "user", None)[0] == "user_message"


def test_adk_event_json_with_content_nested_reads_the_same():
    kind, _, text = describe(json.dumps(
        {"content": {"role": "user", "parts": [{"text": "nested"}]}, "id": "x"}), "u", None)
    assert (kind, text) == ("user_message", "nested")


def test_a_function_call_is_a_tool_call_with_its_arguments_cut_short():
    args = {"kind": "checksum", "blob": "x" * 1000}
    kind, title, text = describe(json.dumps(
        {"parts": [{"function_call": {"name": "run_drill", "args": args}}]}), "model", None)
    assert (kind, title) == ("tool_call", "call run_drill")
    assert text.startswith('run_drill({"kind":"checksum","blob":"xxx')
    assert len(text.encode()) < 300  # the arguments' JSON is cut, not dumped whole
    # The camel-case spelling of ADK's JSON is read too.
    assert describe(json.dumps({"parts": [{"functionCall": {"name": "f", "args": {}}}]}),
                    "m", None)[:2] == ("tool_call", "call f")


def test_a_function_response_is_a_tool_result():
    kind, title, text = describe(json.dumps({"parts": [{"function_response": {
        "name": "run_drill", "response": {"ok": True, "took_ms": 12}}}]}), "tool", None)
    assert (kind, title, text) == (
        "tool_result", "result of run_drill", 'run_drill -> {"ok":true,"took_ms":12}')


def test_what_streamd_log_append_writes_is_a_message():
    assert describe(json.dumps("plain text from --text"), "user", None) == (
        "message", "plain text from --text", "plain text from --text")
    assert describe(json.dumps({"text": "from --content"}), "user", None) == (
        "message", "from --content", "from --content")


def test_any_other_json_gives_its_string_values_in_order():
    content = {"a": "alpha", "n": 3, "nested": {"b": ["beta", {"c": "gamma"}]}, "z": "zeta"}
    kind, title, text = describe(json.dumps(content), "bot", None)
    assert (kind, title, text) == ("event", "alpha", "alpha\nbeta\ngamma\nzeta")


def test_an_event_that_says_nothing_but_sets_state_is_a_state_change():
    delta = json.dumps({"session": {"step": 2}, "app": {"mode": "x"}})
    kind, title, text = describe(json.dumps({"parts": []}), "model", delta)
    assert (kind, title, text) == ("state_change", "state: app:mode, step", "app:mode, step")
    # With something to say it stays what it says.
    assert describe(json.dumps("done"), "model", delta)[0] == "message"


def test_titles_and_texts_are_bounded():
    _, title, text = describe(json.dumps("w" * (TEXT_BYTES + 5000)), "u", None)
    mark = len("…".encode())  # a cut says so
    assert len(title.encode()) == TITLE_BYTES + mark and title.endswith("…")
    assert len(text.encode()) <= TEXT_BYTES + mark


@pytest.mark.parametrize("content", ["x", {"parts": [{"text": "y"}]}, [1, "z"]])
def test_the_projected_line_is_a_record_the_stream_format_parses(content):
    p = project(row(content, branch="b1", invocation="inv-1"))
    rec = parse_line(trim_space(p.line))
    assert (rec.id, rec.actor, rec.correlation, rec.system) == ("ev-7", "model", "s1", "chat")
    assert rec.event_time == 1_777_680_000_123_456_000
    assert (p.seq, p.app, p.user, p.branch, p.invocation) == (7, "chat", "u1", "b1", "inv-1")
    # The same row always projects to the same bytes (answers re-read by it).
    assert project(row(content, branch="b1", invocation="inv-1")).line == p.line
