"""What the store model test draws, and the store's answers as plain values.

The names are few, so that operations meet: appends to one session, filters
that match, retries of one event id. They hurt as the filter tests' do: case
pairs, LIKE wildcards, both segment separators, the session-tree marker and
a multi-byte character; and a few that PostgreSQL (U+0000) or MySQL (longer
than its columns) refuse by design, which the model has them refuse too.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
from hypothesis import strategies as st

from streamd.eventlog.model import (
    AppendParams,
    Entry,
    Event,
    Filter,
    Session,
    SessionTree,
    StateDelta,
    from_us,
    to_us,
    validated,
)
from support.store_model import Append, Filt, canonical

SECOND = 1_000_000
T0 = to_us(dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))

APPS = ["app", "app", "app", "App", "a%p"]
USERS = ["u", "u", "U", "u_", "é"]
SESSIONS = ["s", "s", "s:sub:a", "s:sub:a.b", "s:subx", "s:sub:", "S", "t/1", "%", "s\x00",
            "l" * 255, "l" * 256]
BRANCHES = ["", "", "root", "root.a", "root/b", "root.a.b", "roota", "Root", "r%", "root.",
            "root.\x00", "root." + "b" * 508]
PREFIXES = ["", "root", "root.a", "r", "Root", "r%", "root.", "roota", "root.\x00"]
AUTHORS = ["", "agent", "agent", "user", "sub-agent", "AGENT", "ag%", "é"]
SUFFIXES = ["", "", "nt", "agent", "%", "é", "T"]
EVENT_IDS = [f"e{i}" for i in range(10)]
INVOCATIONS = ["", "", "i1", "i2"]
STATE_KEYS = ["k", "n", "x.y", "é"]

apps = st.sampled_from(APPS)
users = st.sampled_from(USERS)
sessions = st.sampled_from(SESSIONS)

_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=4)
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=3), inner, max_size=3),
    max_leaves=5,
)
"""Any JSON a client can send ("content (any JSON)"): numbers past 64 bits,
floats of every kind JSON has, U+0000 inside strings."""

scope_values = st.none() | st.just({}) | st.dictionaries(
    st.sampled_from(STATE_KEYS), json_values, min_size=1, max_size=2
)
"""One scope of a delta: none, empty (dropped) or some keys (null among the values)."""

deltas = st.none() | st.fixed_dictionaries(
    {"app": scope_values, "user": scope_values, "session": scope_values}
)
metadata = st.none() | st.just({}) | st.dictionaries(
    st.sampled_from(["caller", "proxy_by", "finish_reason", "x"]), st.text(max_size=3),
    min_size=1, max_size=2,
)

policies = st.tuples(
    st.none() | st.sampled_from([1, 60, 3600, 86_400, 2**63 - 1]),
    st.none() | st.sampled_from([1, 2, 3, 2**63 - 1]),
    st.none() | st.sampled_from([1, 60, 86_400, 2**63 - 1]),
)
"""A retention policy's (max_age_s, max_events, idle_s): small ones that cut
what the steps made, and the largest count the params allow."""

_OFFSETS = [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)),
            dt.timezone(dt.timedelta(hours=-14))]


def times(now_us: int) -> st.SearchStrategy[int]:
    """An event time: around now (what retention's ages cut), long ago, or
    at the ends of what RFC 3339 in UTC can hold."""
    ago = st.sampled_from([0, 1, 59, 61, 3600, 86_400, 40 * 86_400]).map(
        lambda s: now_us - s * SECOND
    )
    ends = st.sampled_from([
        to_us(dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
        to_us(dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)),
        to_us(dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)),
    ])
    return st.one_of(ago, ends, st.integers(now_us - 90 * 86_400 * SECOND, now_us + SECOND))


def aware(us: int, offset: int) -> dt.datetime:
    """The time ``us`` in one of a few zones (the store normalises to UTC);
    in UTC where the zone would take it past year 1 or 9999."""
    when = from_us(us)
    try:
        return when.astimezone(_OFFSETS[offset % len(_OFFSETS)])
    except OverflowError:
        return when


@st.composite
def appends(draw: st.DrawFn, now_us: int, last_seqs: dict[tuple[str, str, str], int],
            given: st.SearchStrategy[int]) -> Append:
    """An append, mostly to a session of ``last_seqs`` (the sessions the log
    holds, in the order made: the keys are many, and drawn alike the appends
    would scatter one to a session). Its ``expected_seq`` (sometimes) is one
    the model can judge: the session's own last seq, another seq ``given``,
    or 0; never a seq not yet given, so a refused group is refused at the
    same index whatever seqs the store gives its first appends."""
    known = list(last_seqs)
    if known and draw(st.integers(0, 3)):
        key = draw(st.sampled_from(known))
    else:
        key = (draw(apps), draw(users), draw(sessions))
    expected = draw(st.one_of(st.none(), st.none(), st.just(last_seqs.get(key, 0)), given))
    return Append(
        *key,
        id=draw(st.sampled_from(EVENT_IDS)),
        author=draw(st.sampled_from(AUTHORS)),
        content=draw(json_values),
        branch=draw(st.sampled_from(BRANCHES)),
        invocation_id=draw(st.sampled_from(INVOCATIONS)),
        time_us=draw(st.none() | times(now_us)),
        metadata=draw(metadata),
        delta=draw(deltas),
        expected_seq=expected,
    )


def params(a: Append, offset: int = 0) -> AppendParams:
    """``a`` as a client sends it (validated as the wire would)."""
    delta = None if a.delta is None else StateDelta(**a.delta)
    return validated(AppendParams(
        app=a.app, user=a.user, session=a.session,
        event=Event(
            id=a.id, author=a.author, content=a.content, branch=a.branch,
            invocation_id=a.invocation_id,
            timestamp=None if a.time_us is None else aware(a.time_us, offset),
        ),
        metadata=a.metadata, state_delta=delta, expected_seq=a.expected_seq,
    ))


@st.composite
def filters(draw: st.DrawFn) -> tuple[Filter | None, Filt | None]:
    """A filter and the model's reading of it."""
    if draw(st.integers(0, 4)) == 0:
        return None, None
    opt = st.none() | st.none()
    parents = st.sampled_from(["s", "s:sub:a", "t/1", "S", "s\x00"])
    tree = draw(st.none() | st.tuples(apps, users, parents))
    prefixes = draw(st.none() | st.lists(st.sampled_from(PREFIXES), max_size=3))
    f = Filt(
        app=draw(opt | apps), user=draw(opt | users), session=draw(opt | sessions), tree=tree,
        prefixes=None if prefixes is None else tuple(prefixes),
        author=draw(opt | opt | st.sampled_from(AUTHORS)),
        author_suffix=draw(st.sampled_from(SUFFIXES)),
    )
    return Filter(
        app=f.app, user=f.user, session=f.session,
        session_tree=None if tree is None else SessionTree(app=tree[0], user=tree[1],
                                                           parent=tree[2]),
        branch_prefixes=prefixes, author=f.author, author_suffix=f.author_suffix,
    ), f


# --- the store's answers as plain values --------------------------------------------


def decoded(e: Any) -> Entry:
    """An entry read in any :data:`~streamd.eventlog.store.Shape`, decoded:
    "raw" holds its content as the stored JSON, "encoded" the whole entry."""
    if isinstance(e, msgspec.Raw):
        return msgspec.json.decode(e, type=Entry)
    if isinstance(e.event.content, msgspec.Raw):
        content = msgspec.json.decode(e.event.content)
        return msgspec.structs.replace(e, event=msgspec.structs.replace(e.event, content=content))
    assert isinstance(e, Entry)
    return e


def row(r: Any) -> tuple[Any, ...]:
    """An index's row (``EventRow``), its JSON texts decoded."""
    seq, app, user, session, event_id, invocation, author, branch, time_us, content, delta = r
    return (seq, app, user, session, event_id, invocation, author, branch, time_us,
            canonical(msgspec.json.decode(content)),
            None if delta is None else canonical(msgspec.json.decode(delta)))


def model_row(e: Any) -> tuple[Any, ...]:
    return (e.seq, e.app, e.user, e.session, e.id, e.invocation_id, e.author, e.branch,
            e.time_us, canonical(e.content), None if e.delta is None else canonical(e.delta))


def entry(e: Entry) -> tuple[Any, ...]:
    ev = e.event
    delta = None
    if e.state_delta is not None:
        delta = {k: v for k, v in (("app", e.state_delta.app), ("user", e.state_delta.user),
                                   ("session", e.state_delta.session)) if v is not None}
    return (
        e.seq, e.app, e.user, e.session, ev.id, ev.author, ev.branch, ev.invocation_id,
        None if ev.timestamp is None else to_us(ev.timestamp), canonical(ev.content),
        e.metadata, canonical(delta), e.damaged,
    )


def model_entry(e: Any, content: bool = True) -> tuple[Any, ...]:
    """A model event as :func:`entry` gives a stored one (``content`` false:
    "gives each event's content as null")."""
    return (
        e.seq, e.app, e.user, e.session, e.id, e.author, e.branch, e.invocation_id,
        e.time_us, canonical(e.content if content else None), e.metadata, canonical(e.delta),
        None,
    )


def session(s: Session) -> tuple[Any, ...]:
    return (
        s.app, s.user, s.session, None if s.state is None else canonical(s.state),
        None if s.created_at is None else to_us(s.created_at),
        None if s.updated_at is None else to_us(s.updated_at), s.last_seq,
        None if s.last_event_time is None else to_us(s.last_event_time),
    )


def model_session(s: Any, state: dict[str, Any]) -> tuple[Any, ...]:
    """A model session as :func:`session` gives a stored one. Its
    ``last_event_time`` always: only the wire leaves it out for a caller
    that did not ask (model.Session: "the Python API always has it")."""
    return (
        s.app, s.user, s.session, canonical(state), s.created_us, s.updated_us, s.last_seq,
        s.last_event_time_us,
    )
