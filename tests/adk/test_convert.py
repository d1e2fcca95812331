"""``streamd.adk.convert``: an ADK event encoded once on its way to the log,
and rebuilt from it without validating again, equal in every field (and in
what pydantic keeps beside the fields) to what ``Event.model_validate`` gives.
No daemon: pure conversion."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

adk = pytest.importorskip("google.adk")

import msgspec  # noqa: E402
import pydantic  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions, EventCompaction  # noqa: E402
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.genai import types  # noqa: E402

from streamd.adk import codec, convert  # noqa: E402

_decode = msgspec.json.Decoder().decode
_compiled = pytest.mark.skipif(convert._core is None, reason="streamd._native is not built")


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
        {**data, "actions": {"requested_auth_configs": {"c": {}}}},  # an after-validator refuses
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


@_compiled
@pytest.mark.parametrize("event", [*_events(), _USAGE], ids=lambda e: type(e).__name__)
def test_the_compiled_copy_is_the_python_copy(event: Any) -> None:
    [ours] = convert.copied_all([event])
    theirs = convert.copied(event)
    _same_tree(ours, theirs)
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__
    assert ours.__pydantic_private__ == theirs.__pydantic_private__
    assert ours is not event and ours.__dict__ is not event.__dict__
    assert ours.__pydantic_fields_set__ is not event.__pydantic_fields_set__
    for name in type(event).model_fields:  # nested values shared, as model_copy shares them
        assert getattr(ours, name) is getattr(event, name)


def _models(root: Any) -> list[Any]:
    """``root`` and every model nested in its fields, lists and dicts."""
    found, todo = [], [root]
    while todo:
        value = todo.pop()
        if isinstance(value, pydantic.BaseModel):
            found.append(value)
            todo.extend(getattr(value, name) for name in type(value).model_fields)
        elif isinstance(value, (list, tuple, set)):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
    return found


@_compiled
def test_built_and_copied_models_leave_their_fields_sets_to_refcounting() -> None:
    import gc

    built = convert.events_from_data([_decode(codec.log_event(e).content) for e in _events()])
    copies = convert.copied_all(built)
    # Every event and copy, and the models of a plain text event (a model the
    # plan hands to validation, such as a Blob's, is pydantic's own).
    models = [*built, *copies, *_models(built[0])]
    assert len(models) == 2 * len(built) + 5  # the event, its content, part, actions, node
    for model in models:
        names = model.__pydantic_fields_set__
        assert type(names) is set and not gc.is_tracked(names), type(model).__name__
    # A set someone put more than names into since stays tracked in a copy.
    odd = built[0].model_copy()
    odd.__pydantic_fields_set__.add(("not", "a", "name"))
    [copied] = convert.copied_all([odd])
    assert gc.is_tracked(copied.__pydantic_fields_set__)
    assert copied.__pydantic_fields_set__ == odd.__pydantic_fields_set__


# --- the compiled builder (streamd._native.ModelPlan) against the Python plans ---
#
# The Python plans are the oracle: for any data, the compiled copy must refuse
# exactly where the Python plan refuses, and otherwise build a model equal in
# every respect (types all the way down, fields set, private values, dump),
# nested fallbacks to validation included; an error must be the same error.

def _python_rebuild(cls: Any, data: Any) -> Any:
    """``convert.rebuild`` on the Python plans only (nested models included:
    their conversions never reach the compiled copies)."""
    built = convert._plan(cls).build(data)
    return cls.model_validate(data) if built is convert._NO else built


def _same_tree(a: Any, b: Any, where: str = "") -> None:
    assert type(a) is type(b), where
    if isinstance(a, pydantic.BaseModel):
        _same_model(a, b)
        for name in type(a).model_fields:
            _same_tree(getattr(a, name), getattr(b, name), f"{where}.{name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_tree(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same_tree(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, where


def _outcome(build: Any) -> tuple[Any, Exception | None]:
    try:
        return build(), None
    except Exception as exc:  # compared with the other path's
        return None, exc


def _agree(cls: Any, data: Any) -> None:
    compiled = convert.compiled_plan(cls)
    assert compiled is not None
    refused, _ = _outcome(lambda: compiled.build(copy.deepcopy(data)) is None)
    python_refused, _ = _outcome(
        lambda: convert._plan(cls).build(copy.deepcopy(data)) is convert._NO)
    assert refused == python_refused
    ours, our_error = _outcome(lambda: convert.rebuild(cls, copy.deepcopy(data)))
    theirs, their_error = _outcome(lambda: _python_rebuild(cls, copy.deepcopy(data)))
    if their_error is not None:
        assert type(our_error) is type(their_error)
        if isinstance(their_error, pydantic.ValidationError):
            assert isinstance(our_error, pydantic.ValidationError)
            assert our_error.errors() == their_error.errors()
        else:
            assert str(our_error) == str(their_error)
        return
    assert our_error is None, our_error
    _same_tree(ours, theirs)


@_compiled
@pytest.mark.parametrize("event", _events(), ids=lambda e: e.invocation_id)
def test_the_compiled_builder_builds_what_the_python_plan_builds(event: Event) -> None:
    data = _decode(codec.log_event(event).content)
    _agree(Event, data)
    assert convert.compiled_plan(Event) is not None
    _same_tree(convert.events_from_data([_decode(codec.log_event(event).content)])[0],
               _python_rebuild(Event, data))


_DUMPED = [_decode(codec.log_event(e).content) for e in _events()]
# Names of fields anywhere in the sample events' classes, for keys added.
_NAMES = sorted({name for cls in (Event, EventActions, types.Content, types.Part,
                                  types.FunctionCall, types.FunctionResponse, types.Blob,
                                  types.GroundingMetadata, ToolConfirmation, EventCompaction)
                 for name in cls.model_fields} | {"no_such_field"})
_SCALAR = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False) | st.text(max_size=4)
           | st.sampled_from(["user", "model", "STOP", "SAFETY", "1", "", "t1"]))
_JSON = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(_NAMES) | st.text(max_size=3), inner, max_size=3), max_leaves=8)
# An empty id is replaced by a random one and a missing timestamp is now: both
# paths do so, with values that cannot be compared.
_KEEP = {"id", "timestamp"}


@st.composite
def _mutated(draw: st.DrawFn) -> Any:
    data = copy.deepcopy(draw(st.sampled_from(_DUMPED)))
    for _ in range(draw(st.integers(1, 4))):
        node: Any = data
        while True:  # down a random path of containers
            inner = [v for v in (node.values() if isinstance(node, dict) else node)
                     if isinstance(v, (dict, list))]
            if not inner or draw(st.booleans()):
                break
            node = draw(st.sampled_from(inner))
        action = draw(st.sampled_from(["set", "drop", "add"]))
        if isinstance(node, dict):
            keys = [k for k in node if node is not data or k not in _KEEP]
            if action == "add" or not keys:
                key = draw(st.sampled_from(_NAMES))
                if node is data and key in _KEEP:
                    continue
                node[key] = draw(_JSON)
            elif action == "set":
                node[draw(st.sampled_from(keys))] = draw(_JSON)
            else:
                del node[draw(st.sampled_from(keys))]
        elif action == "add" or not node:
            node.append(draw(_JSON))
        elif action == "set":
            node[draw(st.integers(0, len(node) - 1))] = draw(_JSON)
        else:
            del node[draw(st.integers(0, len(node) - 1))]
    return data


@_compiled
# Random data holds enum values genai does not know, which it validates with a warning.
@pytest.mark.filterwarnings("ignore:.* is not a valid :UserWarning")
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_the_compiled_builder_agrees_with_the_python_plan_on_any_data(data: Any) -> None:
    _agree(Event, data)
    for key, cls in (("content", types.Content), ("actions", EventActions)):
        if key in data:
            _agree(cls, data[key])


@_compiled
@pytest.mark.parametrize("depth", [1, 60, 200])
def test_deep_data_is_built_alike(depth: int) -> None:
    # The compiled builder hands models nested past its limit back to the
    # Python plans, which recurse with the interpreter's checks.
    data: dict[str, Any] = {"type": "STRING"}
    for _ in range(depth):
        data = {"type": "ARRAY", "items": data}
    _agree(types.Schema, data)
    _same_tree(convert.rebuild(types.Schema, data), types.Schema.model_validate(data))


_CHECKED: list[int] = []


class _Inner(pydantic.BaseModel):
    x: int = 0

    @pydantic.field_validator("x")
    @classmethod
    def _seen(cls, value: int) -> int:
        _CHECKED.append(value)
        return value


class _Outer(pydantic.BaseModel):
    inner: _Inner | None = None


@_compiled
def test_validators_run_as_often_on_both_paths() -> None:
    # The inner model's plan runs its validator, then refuses (an unknown
    # key): validation decides, and the validator is not run a third time.
    for data in ({"inner": {"x": 1}}, {"inner": {"x": 2, "other": 0}}, {"inner": {"x": "3"}}):
        _CHECKED.clear()
        theirs = _python_rebuild(_Outer, data)
        python_calls = list(_CHECKED)
        _CHECKED.clear()
        ours = convert.rebuild(_Outer, data)
        compiled_calls = list(_CHECKED)
        assert compiled_calls == python_calls
        _same_tree(ours, theirs)


@_compiled
def test_the_compiled_builder_refuses_what_is_not_a_dict() -> None:
    compiled = convert.compiled_plan(Event)
    assert compiled is not None
    for odd in (None, [], "x", 1, msgspec.Struct()):
        assert compiled.build(odd) is None


def test_without_the_compiled_module_the_python_plans_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = [_decode(codec.log_event(e).content) for e in _events()]
    expected = [_python_rebuild(Event, copy.deepcopy(data)) for data in stored]
    monkeypatch.setenv("STREAMD_NATIVE", "0")
    assert convert.compiled_plan(Event) is None
    for ours, theirs in zip(convert.events_from_data(copy.deepcopy(stored)), expected, strict=True):
        _same_tree(ours, theirs)
    monkeypatch.delenv("STREAMD_NATIVE")
    monkeypatch.setattr(convert, "_core", None)
    assert convert.compiled_plan(Event) is None
    for ours, theirs in zip(convert.events_from_data(copy.deepcopy(stored)), expected, strict=True):
        _same_tree(ours, theirs)
    for ours, theirs in zip(convert.copied_all(expected), expected, strict=True):
        _same_tree(ours, theirs)
        assert ours is not theirs


def test_a_loads_decoded_wrappers_are_left_to_reference_counting() -> None:
    import gc

    # The young collection after a load's decode walks what is tracked; the
    # wrappers of each event can be in no cycle, the content they hold is.
    answer = (
        b'{"session":"s","state":{},"updated_at":null,"last_seq":1,'
        b'"events":[{"seq":1,"event":{"id":"e","content":{"parts":[{"text":"hi"}]}}}]}'
    )
    raw = msgspec.json.decode(answer, type=codec.RawSession)
    (entry,) = raw.events
    assert not gc.is_tracked(entry) and not gc.is_tracked(entry.event)
    assert gc.is_tracked(entry.event.content)
