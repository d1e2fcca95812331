"""ADK's values as the log stores them, and back: events, state, times, ids.

Values in, values out; no I/O. How each maps, and why, is in
:mod:`streamd.adk.session_service`'s docstring.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
from typing import Any

import msgspec
from google.adk.events.event import Event
from google.adk.sessions.state import State
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from streamd.eventlog.model import Event as LogEvent
from streamd.eventlog.model import StateDelta

__all__ = [
    "RawEntry",
    "RawSession",
    "log_event",
    "merged",
    "named",
    "session_id",
    "session_of",
    "split_state",
    "stored_time",
    "utc",
]


# What a load reads: the session's fields and each event's seq and content,
# decoded in the answer's own decode (one pass over the bytes, not one more
# decoder call an event: a 2,000-event load decoded 1.5 ms faster). A load
# asks only for the content of the events it has not cached, so none is
# decoded twice. The two wrappers an event are not tracked by the cyclic
# collector (gc=False): they hold decoded JSON and nothing that could refer
# back to them, so they can be part of no cycle, and the young collection
# that follows a load's decode walked them for nothing (4,000 of its 12,000
# objects for 2,000 events).
class _RawEvent(msgspec.Struct, gc=False):
    content: Any
    id: str = ""  # checked against a cached event of the same seq (see loading)


class RawEntry(msgspec.Struct, gc=False):
    seq: int
    event: _RawEvent


class RawSession(msgspec.Struct, kw_only=True):
    session: str
    state: dict[str, Any] | None
    updated_at: _dt.datetime | None
    last_seq: int
    events: list[RawEntry]
    last_event_time: _dt.datetime | None = None
    created_at: _dt.datetime | None = None  # tells a session made anew under its name
    truncated: bool = False
    next_seq: int | None = None
    app_state: dict[str, Any] | None = None
    user_state: dict[str, Any] | None = None


_session = msgspec.json.Decoder(RawSession)


def session_of(answer: msgspec.Raw) -> RawSession:
    """An answer to ``sessions.get``, decoded (the caller pauses the cyclic
    collector: see :mod:`streamd.adk.loading`)."""
    return _session.decode(answer)


def session_id(given: str | None) -> str | None:
    """A session id as ADK's contract reads it: surrounding whitespace is not
    part of it, and a blank one is none (the log generates one), as in ADK's
    in-memory and SQLite services."""
    if given is None:
        return None
    return given.strip() or None


def named(app_name: str, user_id: str) -> bool:
    """Whether a session may be stored under this app and user: the log names
    every session by a non-empty app, user and id (ADK's in-memory service
    also takes empty ones). A read of an empty one finds nothing."""
    return bool(app_name) and bool(user_id)


def unnamed_error(app_name: str, user_id: str) -> ValueError:
    which = "app_name" if not app_name else "user_id"
    return ValueError(
        f"{which} must not be empty: the event log names every session by a non-empty"
        " app, user and id; nothing was written")


def utc(seconds: float | None) -> _dt.datetime | None:
    if seconds is None:
        return None
    return _dt.datetime.fromtimestamp(seconds, tz=_dt.UTC)


def stored_time(seconds: float) -> float:
    """``seconds`` as the log keeps a time (to the microsecond) and gives it
    back: what a session's ``last_update_time`` reads as after an append, so
    the session ``append_event`` returned equals the one read back."""
    try:
        return _dt.datetime.fromtimestamp(seconds, tz=_dt.UTC).timestamp()
    except (OverflowError, OSError, ValueError):
        return seconds


def log_event(event: Event) -> LogEvent:
    """The log's event for an ADK one: its content is the event as ADK
    serializes it, the log's columns filled from it. A timestamp that is not
    a number of seconds (NaN, an infinity) is refused: ADK's JSON writes it
    as null, which no read of the session could then take back."""
    if event.timestamp is not None and not math.isfinite(event.timestamp):
        raise ValueError(
            f"event {event.id!r}: timestamp must be a finite number of seconds,"
            f" not {event.timestamp!r}")
    try:
        when: _dt.datetime | None = utc(event.timestamp)
    except (OverflowError, OSError, ValueError):
        when = None  # outside what RFC 3339 holds: the exact value is in the content
    return LogEvent(
        id=event.id,
        author=event.author,
        # pydantic's own JSON, made once and carried as raw JSON (see convert):
        # the same value as model_dump(mode="json"), without a second encoding.
        content=msgspec.Raw(event.__pydantic_serializer__.to_json(event, exclude_none=True)),
        branch=event.branch or "",
        invocation_id=event.invocation_id,
        timestamp=when,
    )


def split_state(state: dict[str, Any]) -> StateDelta:
    """ADK's prefixed keys as the log's scopes: ``app:`` and ``user:`` without
    their prefix, ``temp:`` dropped (never persisted), the rest the session's;
    values in their JSON form, as ADK's persistent services store them."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    return StateDelta(
        app=_jsonable(app, State.APP_PREFIX) or None,
        user=_jsonable(user, State.USER_PREFIX) or None,
        session=_jsonable(session, "") or None,
    )


def _jsonable(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    if not values:
        return values
    try:
        out: dict[str, Any] = to_jsonable_python(values, serialize_unknown=True)
    except UnicodeDecodeError:
        # Bytes that are not UTF-8 somewhere in it: stored as ADK's persistent
        # services store them (``make_json_safe_state``), as base64 text; the
        # event's own delta holds the same (ADK's serializer of it does this).
        out = to_jsonable_python(_text_of_bytes(values), serialize_unknown=True)
    for key, value in out.items():
        _refuse_non_finite(value, prefix + key)
    return out


def _text_of_bytes(value: Any) -> Any:
    """``value`` with every bytes value as the text ADK's persistent services
    store for it: its UTF-8 text, or else its base64 (not restored to bytes
    on read, by them or by the log); models as their fields, as ADK does."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, BaseModel):
        return _text_of_bytes(value.model_dump(mode="python"))
    if isinstance(value, dict):
        return {_text_of_bytes(k): _text_of_bytes(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_text_of_bytes(v) for v in value]
    return value


def _refuse_non_finite(value: Any, where: str) -> None:
    """A NaN or an infinity anywhere in a state value is refused: JSON, which
    the log keeps state in, has no such numbers, and writing it as null (what
    an encoder does) would store a value other than the one given."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"state key {where!r} holds {value!r}, which JSON cannot hold (the log keeps"
                " state as JSON); nothing was written")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_non_finite(item, f"{where}[{i}]")


def merged(session: dict[str, Any], app: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    out = dict(session)
    for key, value in app.items():
        out[State.APP_PREFIX + key] = value
    for key, value in user.items():
        out[State.USER_PREFIX + key] = value
    return out


def stored_alike(held: Event, event: Event) -> bool:
    """Whether ``event`` is what the log stores for ``held`` (its content is the
    whole event, its delta included): a re-delivery, not a conflict."""
    return log_event(held) == log_event(event)


def without_temp(event: Event) -> Event:
    """``event`` as the log stores it: without the ``temp:`` keys of its delta
    (ADK's base class trims them before storing). A copy when it has any (the
    fields themselves shared): the caller's event keeps them until the append
    is accepted, so that a refused one leaves the event as it was."""
    actions = event.actions
    delta = actions.state_delta if actions else None
    if not delta or not any(key.startswith(State.TEMP_PREFIX) for key in delta):
        return event
    kept = {k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)}
    return event.model_copy(update={"actions": actions.model_copy(update={"state_delta": kept})})
