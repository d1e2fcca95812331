"""What the differential test of the ADK service (tests/adk/test_against_in_memory.py)
generates, and how it compares our answers with ADK's in-memory service's.

Strategies for state and events, a type-strict comparison, the documented
differences as functions of what ADK's service answered (each says where it is
documented), and the model of what the log holds, on which its refusals depend.
Nothing here calls a service.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from hypothesis import event
from hypothesis import strategies as st

from streamd.adk import EventConflictError

Key = tuple[str, str, str]

APPS = ("app-a", "app-b")
USERS = ("u1", "u2")
GIVEN_IDS = ("s1", "s2")
"""Session ids the test gives (padded variants of them too); the rest are generated."""

# State keys of every scope, a few of them shared so that deltas overwrite, and the
# bare prefixes (a key that is empty once its prefix is taken off).
KEYS = (
    "k", "n", "app:k", "app:n", "user:k", "user:n", "temp:k", "temp:n",
    State.APP_PREFIX, State.USER_PREFIX, State.TEMP_PREFIX,
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                  max_size=3),
    max_leaves=6,
)
"""State values as JSON holds them (a NaN or an infinity is refused: a documented
difference, tested in test_unstorable.py)."""

states = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4)


def make_config(after: float | None, recent: int | None) -> GetSessionConfig | None:
    if after is None and recent is None:
        return None
    return GetSessionConfig(num_recent_events=recent, after_timestamp=after)


def note_fate(fate: type[Exception] | None, stored_before: bool, held: bool) -> None:
    """Which way an append went (Hypothesis's statistics)."""
    if fate is not None:
        event(f"append: refused, {fate.__name__}")
    else:
        event("append: " + ("stored before" + (", held" if held else "") if stored_before
                            else "stored"))


def typed(value: Any) -> Any:
    """``value`` with each scalar tagged with its type: ``1 == 1.0 == True`` in
    Python, and a value stored as JSON must come back as the type it was given."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def us(seconds: float) -> int:
    """A time as the log keeps it: to the microsecond, rounded as ``datetime``
    rounds (the log's own conversion)."""
    return (dt.datetime.fromtimestamp(seconds, tz=dt.UTC) - _EPOCH) // dt.timedelta(
        microseconds=1)


def kept_time(seconds: float) -> float:
    """A session's ``last_update_time`` as streamd gives it for an event stamped
    ``seconds``: the event's time as the log keeps it, to the microsecond
    (docs/agent-builders.md: "Timestamps are kept to the microsecond"; the
    event's own ``timestamp`` is kept whole in its content)."""
    return us(seconds) / 1_000_000


def documented_window(events: list[Event], config: GetSessionConfig | None) -> list[Event]:
    """The events ``get_session`` returns under ``config``, as documented
    (docs/agent-builders.md, "``after_timestamp`` keeps each event whose own
    timestamp is later", as ADK's database services filter, and ``GetSessionConfig``'s
    docstring: "events with timestamp >= the given time"): those at or after the
    time, kept to the microsecond, and the newest ``num_recent_events`` of those.

    ADK's in-memory service cuts the list instead, at the last event earlier than the
    time, after taking the newest events (``_get_session_impl`` in
    google/adk/sessions/in_memory_session_service.py): the same events whenever
    the timestamps do not go back and the time is on the microsecond, which
    :func:`windows_agree` says and the test checks against ADK's own answer."""
    out = list(events)
    if config is None:
        return out
    if config.after_timestamp is not None:
        after = us(config.after_timestamp)
        out = [e for e in out if us(e.timestamp) >= after]
    n = config.num_recent_events
    if n is not None:
        out = out[max(len(out) - n, 0):] if n else []
    return out


def windows_agree(events: list[Event], config: GetSessionConfig | None) -> bool:
    """Whether ADK's in-memory window and the documented one must be the same
    events: timestamps in order, each and the bound on the microsecond."""
    if config is None or config.after_timestamp is None:
        return True
    times = [e.timestamp for e in events]
    on_grid = all(us(t) / 1_000_000 == t for t in [*times, config.after_timestamp])
    return on_grid and times == sorted(times)


def listed_order(sessions: list[Session]) -> list[tuple[str, str]]:
    """(user, id) of ADK's listed sessions in the order streamd lists them: ADK's
    own key (last update, user, id), the update time as streamd keeps it."""
    ordered = sorted(sessions, key=lambda s: (kept_time(s.last_update_time), s.user_id, s.id))
    return [(s.user_id, s.id) for s in ordered]


def without_temp(event: Event) -> dict[str, Any]:
    """The event as the log stores it (and compares a re-delivery with): its
    JSON, ``temp:`` keys out of its delta (ADK's base class trims them)."""
    dumped = event.model_dump(mode="json", exclude_none=True)
    delta = dumped.get("actions", {}).get("state_delta")
    if delta:
        dumped["actions"]["state_delta"] = {
            k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)}
    return dumped


class Unreported:
    """Which refused session copies have a refusal not raised yet (write-behind).

    A refusal is raised once by the copy's next append or by ``flush`` (the first
    not raised yet), whichever comes first; when two copies wait with refusals
    of one type, which one a flush raised cannot be told from the error. So this
    keeps every set the service may be holding, and each answer keeps those it
    is consistent with; none left is a failure."""

    def __init__(self) -> None:
        self.possible: set[frozenset[int]] = {frozenset()}

    def add(self, copy: int) -> None:
        self.possible = {s | {copy} for s in self.possible}

    def raised_by_append(self, copy: int) -> None:
        self.possible = {s - {copy} for s in self.possible}

    def flush_raised(self, kind: type[Exception], kinds: dict[int, type[Exception]]) -> bool:
        """A flush raised ``kind``: whether a set held a copy refused so."""
        after = {s - {c} for s in self.possible for c in s if kinds[c] is kind}
        if not after:
            return False
        self.possible = after
        return True

    def flush_returned(self) -> bool:
        after = {s for s in self.possible if not s}
        if not after:
            return False
        self.possible = after
        return True


# --- the model: what the log holds, as far as refusals depend on it ----------------



@dataclass
class Stored:
    """A stored session as the model knows it: its events' seqs (the log's are
    global and never reused; only their order and equality matter here)."""

    seqs: list[int] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0


@dataclass(eq=False)  # by identity: two copies of one session may be alike
class Copy:
    """A session object each service handed out for the same session, and the
    seq ours was read (or last appended) at."""

    ours: Session
    theirs: Session
    key: Key
    seq: int
    refused: type[Exception] | None = None
    """Write-behind: the refusal its queued append met (raised later)."""
    heard: bool = False
    """Whether the service has heard that refusal (it drained since)."""


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None

    def kind(self) -> type[BaseException] | None:
        return None if self.error is None else type(self.error)


class LogModel:
    """What the log holds, as far as its answer to an append depends on it."""

    def __init__(self) -> None:
        self.stored: dict[Key, Stored] = {}  # in the order made: generated ids vary by run
        self.registry: dict[str, tuple[Key, dict[str, Any], int]] = {}
        """Stored events: id -> (session, stored form, seq)."""
        self.seq = 0

    def fate(self, c: Copy, event: Event, form: dict[str, Any]) -> type[Exception] | None:
        """How the log answers an append of ``event`` through ``c``: stored (None),
        or the refusal (the log looks at the event id first: its duplicate is
        answered as stored, whatever the session's seq)."""
        known = self.registry.get(event.id)
        if known is not None:
            key, stored_form, _ = known
            return EventConflictError if key != c.key or stored_form != form else None
        if c.key not in self.stored:
            return SessionNotFoundError
        if c.seq != self.stored[c.key].last_seq:
            return StaleSessionError
        return None

    def next_after(self, c: Copy) -> int | None:
        """The seq of the session's event right after the copy's (its first for a
        copy at 0), None when there is none or the copy's is not the session's."""
        seqs = self.stored[c.key].seqs
        if c.seq == 0:
            return seqs[0] if seqs else None
        if c.seq not in seqs:
            return None
        at = seqs.index(c.seq) + 1
        return seqs[at] if at < len(seqs) else None

    def store(self, c: Copy, form: dict[str, Any]) -> None:
        self.seq += 1
        self.stored[c.key].seqs.append(self.seq)
        self.registry[form["id"]] = (c.key, form, self.seq)
        c.seq = self.seq

    def delete(self, key: Key) -> None:
        """A session deleted, and its events (their ids free again)."""
        if self.stored.pop(key, None) is not None:
            for event_id in [i for i, (k, _, _) in self.registry.items() if k == key]:
                del self.registry[event_id]
