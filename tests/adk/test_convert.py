"""``streamd.adk.convert``: an ADK event encoded once on its way to the log,
and rebuilt from it without validating again, equal in every field (and in
what pydantic keeps beside the fields) to what ``Event.model_validate`` gives.
No daemon: pure conversion."""

from __future__ import annotations

from typing import Any

import pytest

adk = pytest.importorskip("google.adk")

import msgspec  # noqa: E402
import pydantic  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions, EventCompaction  # noqa: E402
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.genai import types  # noqa: E402

from streamd.adk import codec, convert  # noqa: E402

_decode = msgspec.json.Decoder().decode


def _events() -> list[Event]:
    text = types.Content(role="user", parts=[types.Part(text="hello")])
    call = types.FunctionCall(id="c1", name="tool", args={"x": 1, "y": [1, 2, {"z": None}]})
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=10, candidates_token_count=5, total_token_count=15
    )
    grounding = types.GroundingMetadata(
        web_search_queries=["q"],
        grounding_chunks=[types.GroundingChunk(web=types.GroundingChunkWeb(uri="u", title="t"))],
    )
    return [
        Event(author="user", invocation_id="i1", content=text),
        Event(author="a", invocation_id="i1",
              content=types.Content(role="model", parts=[types.Part(function_call=call)])),
        Event(author="a", invocation_id="i1", content=types.Content(role="user", parts=[
            types.Part(function_response=types.FunctionResponse(
                id="c1", name="tool", response={"result": "ok", "n": 1.5}))])),
        Event(author="a", invocation_id="i2",
              content=types.Content(role="model", parts=[
                  types.Part(text="thinking", thought=True), types.Part(text="answer")]),
              usage_metadata=usage, finish_reason=types.FinishReason.STOP,
              turn_complete=True, model_version="m"),
        Event(author="a", invocation_id="i3", actions=EventActions(
            state_delta={"k": 1, "user:u": "v", "app:a": [1, 2]}, artifact_delta={"f": 2},
            transfer_to_agent="other", escalate=True, skip_summarization=True)),
        Event(author="a", invocation_id="i3", long_running_tool_ids={"t1", "t2"},
              branch="root.child", custom_metadata={"a": {"b": 1}}),
        Event(author="a", invocation_id="i4", content=types.Content(role="model", parts=[
            types.Part(inline_data=types.Blob(data=b"\x00\x01\xff", mime_type="image/png"))])),
        Event(author="a", invocation_id="i4", content=types.Content(
            role="model", parts=[types.Part(text="x", thought_signature=b"sig")])),
        Event(author="a", invocation_id="i5", actions=EventActions(
            requested_tool_confirmations={"c1": ToolConfirmation(hint="ok?", payload={"x": 1})})),
        Event(author="a", invocation_id="i5", actions=EventActions(compaction=EventCompaction(
            start_timestamp=1.0, end_timestamp=2.0, compacted_content=text))),
        Event(author="a", invocation_id="i6", error_code="E", error_message="bad",
              interrupted=True, partial=False, grounding_metadata=grounding),
        Event(author="a", invocation_id="i7", actions=EventActions(
            end_of_agent=True, agent_state={"s": 1}, route="next")),
        Event(author="a", invocation_id="i7", output={"o": 1}, timestamp=1700000000.0),
        Event(author="a", invocation_id="i8", citation_metadata=types.CitationMetadata(
            citations=[types.Citation(uri="u", start_index=1)])),
    ]


def _same_model(a: Any, b: Any) -> None:
    """Equal as ADK compares them, and in what pydantic keeps beside."""
    assert a == b
    assert type(a) is type(b)
    assert a.model_fields_set == b.model_fields_set
    assert a.__pydantic_private__ == b.__pydantic_private__
    assert a.model_dump() == b.model_dump()
    assert repr(a) == repr(b)
    for name in type(a).model_fields:
        va, vb = getattr(a, name), getattr(b, name)
        assert type(va) is type(vb), name
        if isinstance(va, pydantic.BaseModel):
            _same_model(va, vb)


@pytest.mark.parametrize("event", _events(), ids=lambda e: e.invocation_id)
def test_an_event_comes_back_as_validation_would_give_it(event: Event) -> None:
    content = codec.log_event(event).content
    assert isinstance(content, msgspec.Raw)
    # One encoding, the same value ADK's persistent services store.
    assert _decode(content) == event.model_dump(mode="json", exclude_none=True)
    rebuilt = convert.event_from_json(content)
    _same_model(rebuilt, Event.model_validate(_decode(content)))
    assert rebuilt == event  # what ADK's contract compares


def test_the_usual_events_are_rebuilt_without_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = [codec.log_event(e).content for e in _events()[:6]]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("validated")

    for cls in (Event, EventActions, types.Content, types.Part, types.FunctionCall,
                types.FunctionResponse, types.GenerateContentResponseUsageMetadata):
        monkeypatch.setattr(cls, "model_validate", refuse)
    for content in stored:
        assert isinstance(convert.event_from_json(content), Event)


def test_data_the_plan_does_not_know_is_validated_and_refused_as_before() -> None:
    good = codec.log_event(_events()[0]).content
    data = _decode(good)
    for bad in (
        {**data, "timestamp": "soon"},  # a value of another type
        {**data, "content": {"parts": [{"text": "x", "no_such_field": 1}]}},  # forbidden extra
        {**data, "actions": {"compaction": {"start_timestamp": 1.0}}},  # required fields missing
    ):
        with pytest.raises(pydantic.ValidationError) as ours:
            convert.rebuild(Event, bad)
        with pytest.raises(pydantic.ValidationError) as theirs:
            Event.model_validate(bad)
        assert ours.value.errors() == theirs.value.errors()
    # An unknown key Event ignores, a value validation converts, a default.
    odd = {k: v for k, v in data.items() if k != "author"}
    odd |= {"no_such_field": 1, "timestamp": 1700000000}
    _same_model(convert.rebuild(Event, odd), Event.model_validate(odd))


_USAGE = types.GenerateContentResponseUsageMetadata(prompt_token_count=3)  # private attributes


@pytest.mark.parametrize("event", [*_events()[:4], _USAGE], ids=lambda e: type(e).__name__)
def test_a_copy_is_pydantics_shallow_copy(event: Any) -> None:
    theirs, ours = event.model_copy(), convert.copied(event)
    _same_model(ours, theirs)
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__
    ours.__dict__["author" if isinstance(event, Event) else "prompt_token_count"] = None
    assert event != ours  # its own __dict__
    for name in type(event).model_fields:  # nested values shared, as model_copy shares them
        assert getattr(theirs, name) is getattr(ours, name) or name in ("author",
                                                                         "prompt_token_count")


def test_the_collector_is_paused_within_and_restored_after() -> None:
    import gc

    assert gc.isenabled()
    with convert.collector_paused():
        assert not gc.isenabled()
        with convert.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an inner pause does not end the outer one
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), convert.collector_paused():
        raise ZeroDivisionError
    assert gc.isenabled()
