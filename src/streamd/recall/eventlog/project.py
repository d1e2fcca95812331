"""One event of the log -> one Recall record: what it is called, says and is.

Sans-I/O. The record is written as a line of the stream adapter's own
record format (``records``), so the event log is indexed by the same
parser, tokenizer, relevance and compiled core as a JSONL stream, and an
answer re-reads an event by projecting its row again: the same row always
projects to the same bytes.

Fields: id = the event id; event_time and observed_at = its timestamp;
actor = its author; correlation = its session; system = its app. The app,
user, session, branch and invocation are exact identifiers too (the index
adds the ones the line format has no field for, see ``identifiers``).

Content is any JSON; title, text and kind come from its shape:

* **ADK-shaped**: ``parts`` (at the top, or under ``content`` as ADK's own
  event JSON has it). Text parts are the text. A ``function_call`` part is
  a tool call: ``name(arguments)`` with the arguments' JSON cut short; a
  ``function_response`` part is a tool result: ``name -> response``, cut
  short too. Kind: ``tool_call`` or ``tool_result`` when such a part is
  present, else ``user_message`` when the role (or, without one, the
  author) is the user, else ``model_message``. An event with no part that
  says anything but a state delta is a ``state_change``, its keys the text.
* **What ``streamd log append`` writes**: ``--text`` stores a JSON string,
  which is the text; ``--content '{"text": ...}'`` an object whose ``text``
  is the text. Kind ``message``.
* **Any other JSON**: its string values, in order (keys sorted as stored),
  joined by newlines. Kind ``event``; ``state_change`` when the event set
  state and its content says nothing.

The title is the first line of the text, cut at ``TITLE_BYTES`` (a tool
call's is ``call name``, a result's ``result of name``). Text is cut at
``TEXT_BYTES`` so a record always fits the line format's 1 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from streamd.eventlog.store import EventRow
from streamd.golang import gotime
from streamd.recall.query.render import clip

__all__ = [
    "KINDS",
    "TEXT_BYTES",
    "TITLE_BYTES",
    "Projected",
    "identifiers",
    "line",
    "project",
]

TITLE_BYTES = 120
TEXT_BYTES = 64 << 10
# A tool call's arguments and a tool result's response, as JSON, cut here:
# enough to find them by, not a dump of every payload.
ARGS_BYTES = 240
RESPONSE_BYTES = 480

KINDS = ("user_message", "model_message", "tool_call", "tool_result", "state_change",
         "message", "event")

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Projected:
    """One event as a record: its line and the identifiers the line lacks."""

    seq: int
    line: bytes
    app: str
    user: str
    branch: str
    invocation: str


class _Line(msgspec.Struct, omit_defaults=True):
    # The stream record format's field names; schema 2 (text and actor) always.
    schema: int
    id: str
    kind: str
    event_time: str
    observed_at: str
    correlation: str
    system: str
    actor: str = ""
    title: str = ""
    text: str = ""


def project(row: EventRow) -> Projected:
    seq, app, user, session, event_id, invocation, author, branch, at_us, content, delta = row
    kind, title, text = describe(content, author, delta)
    when = gotime.format_nano(at_us * 1000)
    body = _Line(
        schema=2, id=event_id, kind=kind, event_time=when, observed_at=when,
        correlation=session, system=app, actor=author, title=title, text=text,
    )
    return Projected(seq, _encode(body) + b"\n", app, user, branch, invocation)


def identifiers(p: Projected) -> tuple[str, str, str, str]:
    """The exact identifiers the line has no field for (id and session are its
    own ``id`` and ``correlation``)."""
    return (p.app, p.user, p.branch, p.invocation)


def line(row: EventRow) -> bytes:
    return project(row).line


def describe(content: str, author: str, delta: str | None) -> tuple[str, str, str]:
    """(kind, title, text) of an event's stored content (see the module docs)."""
    try:
        value = _decode(content)
    except msgspec.DecodeError:
        value = content  # stored JSON always decodes; never fail a build on it
    parts, role = _parts_of(value)
    if parts is not None:
        kind, title, text = _adk(parts, role, author)
    elif isinstance(value, str):
        kind, title, text = "message", "", value
    elif isinstance(value, dict) and isinstance(value.get("text"), str):
        kind, title, text = "message", "", value["text"]
    else:
        kind, title, text = "event", "", "\n".join(_strings(value))
    if not text.strip() and delta is not None:
        kind, text = "state_change", _state_keys(delta, value)
        title = f"state: {text}"
    text = clip(text, TEXT_BYTES)
    if not title:
        title = text.strip().split("\n", 1)[0]
    return kind, clip(title, TITLE_BYTES), text


def _parts_of(value: Any) -> tuple[list[Any] | None, str]:
    if not isinstance(value, dict):
        return None, ""
    parts = value.get("parts")
    if isinstance(parts, list):
        return parts, str(value.get("role") or "")
    inner = value.get("content")
    if isinstance(inner, dict) and isinstance(inner.get("parts"), list):
        return inner["parts"], str(inner.get("role") or "")
    return None, ""


def _adk(parts: list[Any], role: str, author: str) -> tuple[str, str, str]:
    texts: list[str] = []
    kind = ""
    title = ""
    for part in parts:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        call = part.get("function_call", part.get("functionCall"))
        if isinstance(call, dict):
            name = str(call.get("name") or "")
            texts.append(f"{name}({_short(call.get('args'), ARGS_BYTES)})")
            kind, title = kind or "tool_call", title or f"call {name}"
        response = part.get("function_response", part.get("functionResponse"))
        if isinstance(response, dict):
            name = str(response.get("name") or "")
            texts.append(f"{name} -> {_short(response.get('response'), RESPONSE_BYTES)}")
            kind, title = kind or "tool_result", title or f"result of {name}"
    if not kind:
        kind = "user_message" if (role or author) == "user" else "model_message"
    return kind, title, "\n".join(texts)


def _short(value: Any, limit: int) -> str:
    if value is None:
        return ""
    return clip(_encode(value).decode(), limit)


def _strings(value: Any) -> list[str]:
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return out


def _state_keys(delta: str, content: Any) -> str:
    try:
        scopes = _decode(delta)
    except msgspec.DecodeError:
        scopes = {}
    keys: list[str] = []
    if isinstance(scopes, dict):
        for scope in ("app", "user", "session"):
            values = scopes.get(scope)
            if isinstance(values, dict):
                keys.extend(f"{scope}:{k}" if scope != "session" else k for k in values)
    return ", ".join(keys) or "state"
