"""The event log's store as the specification describes it, in plain Python:
what ``tests/eventlog/test_store_model.py`` checks every backend against
after each step of a random sequence of operations.

Written from ``EVENTLOG-SPEC.md`` and ``docs/wire.md``, never from the
store's code: each rule below cites the sentence it follows. It knows no
SQL, and of the backends only what their pages say they refuse by design
(:func:`refuses`); it holds the events, sessions, state history, leases,
boots and policies a client has caused, and answers in plain values (times
in microseconds, JSON as Python values) that the test compares with the
store's Structs.

What the model cannot know it takes from the store and checks instead:
the seq an append is given (the spec promises strictly increasing seqs in
commit order, not gapless ones), the newest seq given (a refused append may
use one up), a generated session id and a boot's id.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from streamd.errors import (
    EVENT_CONFLICT,
    INVALID_PARAMS,
    SESSION_LOCKED,
    SESSION_NOT_FOUND,
    STALE_SESSION,
)

Key = tuple[str, str, str]
"""(app, user, session)."""

EARLIEST_US = -(2**63)
"""The earliest time a log compares with: a retention cutoff before it is
that time (docs/tried.md: a max_age_s of 2^63-1 "is clamped to the earliest
64-bit time, so the rule removes nothing")."""


def canonical(value: Any) -> str:
    """JSON text that is equal exactly when two JSON values are: object key
    order does not count, the type of a number does (``1``, ``1.0`` and
    ``true`` are three values)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


Names = dict[str, str]
"""Names an operation would store, by field (``app``, ``session``, ``branch``, ...)."""


def refuses(backend: str, names: Names) -> bool:
    """Whether ``backend`` refuses to store one of ``names`` (-32602), as its
    page says it does by design. docs/postgresql.md, "Differences from
    SQLite": "text cannot hold U+0000, so an app, user, session, event id,
    author or branch containing it is refused when it would be written (an
    append, sessions.create, lock.acquire, retention.set: -32602). A read
    naming one answers as a read of a name no row has". docs/mysql.md: "app,
    user, session, event id, author and lease holder 255 characters, branch
    512. Anything longer is refused with -32602 naming the field". SQLite
    stores both."""
    if backend == "postgres":
        return any("\x00" in text for text in names.values())
    if backend == "mysql":
        return any(len(text) > (512 if field == "branch" else 255)
                   for field, text in names.items())
    return False


class Refused(Exception):
    """What the store must answer instead of a result: an error code, and
    the data the spec promises with it (None where it promises none)."""

    def __init__(self, code: int, data: dict[str, Any] | None = None) -> None:
        super().__init__(code, data)
        self.code = code
        self.data = data


@dataclass(frozen=True)
class Filt:
    """A filter as the spec's section "Filters" states it (all parts AND)."""

    app: str | None = None
    user: str | None = None
    session: str | None = None
    tree: tuple[str, str, str] | None = None
    prefixes: tuple[str, ...] | None = None
    author: str | None = None
    author_suffix: str = ""

    def matches(self, e: Event) -> bool:
        if self.tree is not None:
            # "the parent session and every sub-session named
            # <parent>:sub:<anything>; takes precedence over app/user/session"
            app, user, parent = self.tree
            if e.app != app or e.user != user:
                return False
            if e.session != parent and not e.session.startswith(parent + ":sub:"):
                return False
        else:
            if self.app is not None and e.app != self.app:
                return False
            if self.user is not None and e.user != self.user:
                return False
            if self.session is not None and e.session != self.session:
                return False
        if self.prefixes is not None:
            # "A prefix p matches branch p, and branches starting p. or p/";
            # "Empty prefixes are dropped so user input cannot widen a query
            # to everything": a group of blanks only matches nothing
            # (model.Filter: "a group left empty matches nothing").
            kept = [p for p in self.prefixes if p]
            if not any(
                e.branch == p or e.branch.startswith(p + ".") or e.branch.startswith(p + "/")
                for p in kept
            ):
                return False
        if self.author is not None and e.author != self.author:
            return False
        # "author_suffix (ends with; empty = no restriction)"
        return not (self.author_suffix and not e.author.endswith(self.author_suffix))


@dataclass
class Event:
    seq: int
    app: str
    user: str
    session: str
    id: str
    author: str
    branch: str
    invocation_id: str
    time_us: int
    """The timestamp given, or the append time ("an event appended without a
    timestamp gets the append time")."""
    content: Any
    metadata: dict[str, str] | None
    """None when appended without one, or with ``{}`` ("an empty map also
    reads back as null")."""
    delta: dict[str, dict[str, Any]] | None
    """The state delta without its empty scopes; None when none is left
    ("Empty scopes are dropped; an event whose scopes are all empty carries
    no delta"; "Entries carry the delta they set ... absent when none")."""
    identity: str

    @property
    def key(self) -> Key:
        return (self.app, self.user, self.session)


@dataclass
class Session:
    app: str
    user: str
    session: str
    created_us: int
    updated_us: int
    """The clock at its last write (creation or append): what ``idle_s`` measures."""
    last_seq: int = 0
    """"the seq of its newest event (0 before the first)"; history, so "trimming
    its events never moves it back"."""
    last_event_time_us: int = 0
    """"the timestamp of its newest event (its creation time before the first)"."""


@dataclass
class Delta:
    """One scope's write at a seq: a ``state_delta`` of an append, or a
    ``sessions.create``'s states ("A session created between seq N and N+1
    takes its place at N")."""

    seq: int
    scope: str
    key: Key
    """(app, "", "") for the app's, (app, user, "") for a user's."""
    values: dict[str, Any]


@dataclass
class Lease:
    holder: str
    acquired_us: int
    heartbeat_us: int
    stale_after_ms: int

    def live(self, now_us: int) -> bool:
        """"a lease whose heartbeat is fresher than the stale window that the
        HOLDER declared" (its age in microseconds against the window)."""
        return now_us - self.heartbeat_us < self.stale_after_ms * 1000


@dataclass
class Policy:
    max_age_s: int | None
    max_events: int | None
    idle_s: int | None


@dataclass
class Append:
    """An append as the model reads it (the params, in plain values)."""

    app: str
    user: str
    session: str
    id: str
    author: str
    content: Any
    branch: str = ""
    invocation_id: str = ""
    time_us: int | None = None
    metadata: dict[str, str] | None = None
    delta: dict[str, dict[str, Any] | None] | None = None
    expected_seq: int | None = None

    def normalized_delta(self) -> dict[str, dict[str, Any]] | None:
        kept = {scope: v for scope, v in (self.delta or {}).items() if v}
        return kept or None

    def identity(self) -> str:
        """What makes a retry a duplicate: "Re-appending an event id with
        identical content returns the original seq"; "The delta is part of
        the event's identity"; ``expected_seq`` is not (wire.md: "A retry of
        an event that was written is still duplicate, whatever it
        expected"). Metadata {} is no metadata (it reads back as null)."""
        return canonical([
            self.app, self.user, self.session, self.id, self.author, self.branch,
            self.invocation_id, self.time_us, self.content, self.metadata or None,
            self.normalized_delta(),
        ])


@dataclass
class New:
    """An append the store must write, at a seq of its choosing past every
    seq given before."""


@dataclass
class Duplicate:
    seq: int


Outcome = New | Duplicate | Refused


@dataclass
class GroupViews:
    """The seq each session's appends of one group were computed from
    (wire.md: "each later append of that session sent without one of its own
    expects the session where the batch's earlier appends left it"): a new
    append leaves it at its own seq; a duplicate at or before the expectation
    leaves it there; a duplicate after it, at its own seq when it is "the
    session's next event after that expectation" and the session still holds
    its event at the expectation ("only while it holds its event at the
    expectation"), else where it was."""

    views: dict[Key, int] = field(default_factory=dict)

    def expecting(self, a: Append) -> Append:
        key = (a.app, a.user, a.session)
        if a.expected_seq is None and key in self.views:
            return Append(**{**a.__dict__, "expected_seq": self.views[key]})
        return a

    def took(self, log: Log, a: Append, seq: int, duplicate: bool) -> None:
        """``a`` (as :meth:`expecting` gave it) was answered with ``seq``,
        ``log`` holding it and the group's earlier appends."""
        if a.expected_seq is None:
            return
        key = (a.app, a.user, a.session)
        if not duplicate:
            self.views[key] = seq
            return
        at = log.events.get(a.expected_seq)
        held = a.expected_seq == 0 or (at is not None and at.key == key)
        following = min((s for s, e in log.events.items() if e.key == key and s > a.expected_seq),
                        default=None)
        moved = seq > a.expected_seq and held and following == seq
        self.views[key] = seq if moved else a.expected_seq


@dataclass
class Log:
    """Everything a client has caused, as the spec says it is kept."""

    backend: str = "sqlite"
    """Whose refusals of names by design apply (:func:`refuses`)."""
    newest: int = 0
    """The newest seq given and committed (deleted events' count too)."""
    events: dict[int, Event] = field(default_factory=dict)
    by_id: dict[str, int] = field(default_factory=dict)
    sessions: dict[Key, Session] = field(default_factory=dict)
    history: list[Delta] = field(default_factory=list)
    leases: dict[Key, Lease] = field(default_factory=dict)
    boots: dict[int, tuple[int, list[str]]] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)
    removed: list[int] = field(default_factory=list)
    """Seqs removed since the test last read the store's removals."""

    def copy(self) -> Log:
        return copy.deepcopy(self)

    # --- appends ---------------------------------------------------------------

    def invalid(self, a: Append) -> bool:
        """Refused -32602 whatever the log holds: a name the backend cannot
        store (wire.md: "An append invalid in itself, whatever the log holds
        ... is refused before any append of the batch meets the log")."""
        return refuses(self.backend, {"app": a.app, "user": a.user, "session": a.session,
                                      "event.id": a.id, "author": a.author, "branch": a.branch})

    def plan(self, a: Append) -> Outcome:
        """What the store must do with ``a`` now, in this order: a stored id
        answers first (duplicate or ``event_conflict``, "nothing is
        written"), then ``expected_seq`` ("-32014 stale_session when the
        session moved past expected_seq"; "-32012 session_not_found" when
        it does not exist; 0 means it exists with no events). An append
        :meth:`invalid` in itself is refused before all of these."""
        if self.invalid(a):
            return Refused(INVALID_PARAMS)
        if a.id in self.by_id:
            seq = self.by_id[a.id]
            if self.events[seq].identity == a.identity():
                return Duplicate(seq)
            return Refused(EVENT_CONFLICT)
        if a.expected_seq is not None:
            s = self.sessions.get((a.app, a.user, a.session))
            if s is None:
                return Refused(SESSION_NOT_FOUND)
            if s.last_seq != a.expected_seq:
                return Refused(
                    STALE_SESSION, {"expected_seq": a.expected_seq, "last_seq": s.last_seq}
                )
        return New()

    def commit(self, a: Append, seq: int, now_us: int) -> None:
        """``a`` written at ``seq``: its session made if need be (an append
        "creates its session"), its delta applied "in the transaction that
        appends its event"."""
        assert seq > self.newest, f"seq {seq} is not past the newest seq given, {self.newest}"
        self.newest = seq
        time_us = now_us if a.time_us is None else a.time_us
        delta = a.normalized_delta()
        e = Event(
            seq=seq, app=a.app, user=a.user, session=a.session, id=a.id, author=a.author,
            branch=a.branch, invocation_id=a.invocation_id, time_us=time_us, content=a.content,
            metadata=a.metadata or None, delta=delta, identity=a.identity(),
        )
        self.events[seq] = e
        self.by_id[a.id] = seq
        key = e.key
        s = self.sessions.get(key)
        if s is None:
            s = self.sessions[key] = Session(*key, created_us=now_us, updated_us=now_us)
        s.updated_us = max(s.updated_us, now_us)
        s.last_seq = seq
        s.last_event_time_us = time_us
        if delta is not None:
            self._record(seq, key, delta)

    def _record(self, seq: int, key: Key, delta: dict[str, dict[str, Any]]) -> None:
        app, user, _ = key
        scopes = {"app": (app, "", ""), "user": (app, user, ""), "session": key}
        for scope in ("app", "user", "session"):
            if delta.get(scope):
                self.history.append(Delta(seq, scope, scopes[scope], dict(delta[scope])))

    # --- sessions --------------------------------------------------------------

    def create(
        self, key: Key, now_us: int, state: dict[str, Any] | None,
        app_state: dict[str, Any] | None, user_state: dict[str, Any] | None,
    ) -> None:
        """``sessions.create``: ``session_exists`` (-32602) for a session
        that exists; its states "merged key by key into the shared state in
        the creating transaction", at the newest seq."""
        if refuses(self.backend, dict(zip(("app", "user", "session"), key, strict=True))):
            raise Refused(INVALID_PARAMS)
        if key in self.sessions:
            raise Refused(INVALID_PARAMS, {"reason": "session_exists"})
        self.sessions[key] = Session(*key, created_us=now_us, updated_us=now_us,
                                     last_event_time_us=now_us)
        delta = {"app": app_state, "user": user_state, "session": state}
        kept = {scope: v for scope, v in delta.items() if v}
        if kept:
            self._record(self.newest, key, kept)

    def delete(self, key: Key) -> None:
        """``sessions.delete``: idempotent; the session goes with its events
        and "its own state; the state its user and app share stays"."""
        if key not in self.sessions:
            return
        del self.sessions[key]
        for seq in sorted(seq for seq, e in self.events.items() if e.key == key):
            self._remove(seq)
        self.history = [d for d in self.history if not (d.scope == "session" and d.key == key)]

    def _remove(self, seq: int) -> None:
        e = self.events.pop(seq)
        del self.by_id[e.id]
        self.removed.append(seq)

    def session_events(self, key: Key) -> list[Event]:
        return [e for seq, e in sorted(self.events.items()) if e.key == key]

    def bounded_events(
        self, key: Key, after_seq: int, after_time_us: int | None, recent: int | None
    ) -> list[Event]:
        """``sessions.get``'s events: "the events after after_seq, at or after
        after_time, the newest recent of those (0: none), in seq order"."""
        found = [
            e for e in self.session_events(key)
            if e.seq > after_seq and (after_time_us is None or e.time_us >= after_time_us)
        ]
        if recent is not None:
            found = found[max(0, len(found) - recent):] if recent else []
        return found

    def sessions_of(self, app: str, user: str | None) -> list[Session]:
        """In "(user, session) order" (code points: every backend compares
        keys by their UTF-8 bytes, docs/mysql.md and docs/postgresql.md)."""
        return sorted(
            (s for s in self.sessions.values()
             if s.app == app and (user is None or s.user == user)),
            key=lambda s: (s.user, s.session),
        )

    # --- state -----------------------------------------------------------------

    def fold(self, scope: str, key: Key, as_of: int | None) -> dict[str, Any]:
        """"A delta replaces each key it names, whole"; as of N: "every write
        up to it, none after"."""
        state: dict[str, Any] = {}
        for d in self.history:
            if d.scope == scope and d.key == key and (as_of is None or d.seq <= as_of):
                state.update(d.values)
        return state

    def state(
        self, app: str, user: str | None, session: str | None, as_of: int | None
    ) -> tuple[int, dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
        """``state.get``: (seq, app, user, session); "a scope not asked for is
        null"; "an as_of_seq past the newest reads the state now, and seq
        says the newest"; a session never written is session_not_found."""
        if session is not None:
            assert user is not None
            if (app, user, session) not in self.sessions:
                raise Refused(SESSION_NOT_FOUND)
        if as_of is not None and as_of >= self.newest:
            as_of = None
        seq = self.newest if as_of is None else as_of
        return (
            seq,
            self.fold("app", (app, "", ""), as_of),
            None if user is None else self.fold("user", (app, user, ""), as_of),
            None if session is None else self.fold("session", (app, user or "", session), as_of),
        )

    # --- reads by filter -------------------------------------------------------

    def matching(self, flt: Filt | None, after: int = 0) -> list[Event]:
        return [
            e for seq, e in sorted(self.events.items())
            if seq > after and (flt is None or flt.matches(e))
        ]

    def since(self, from_seq: int, flt: Filt | None, limit: int) -> tuple[list[Event], int, bool]:
        """(entries, next_seq, caught_up): next_seq is "the last entry's seq,
        or the request's from_seq when nothing matched"; caught_up "when no
        further matching entry existed"."""
        found = self.matching(flt, from_seq)
        page = found[:limit]
        return page, page[-1].seq if page else from_seq, len(found) <= limit

    def latest_seq(self, flt: Filt | None) -> int:
        found = self.matching(flt)
        return found[-1].seq if found else 0

    def nth_newest_seq(self, flt: Filt | None, offset: int) -> int:
        found = self.matching(flt)
        return found[-1 - offset].seq if offset < len(found) else 0

    def branches(self, flt: Filt | None, limit: int | None) -> list[str]:
        """"branches come back sorted ascending, never with an empty label";
        "limit caps ... distinct labels"."""
        labels = sorted({e.branch for e in self.matching(flt) if e.branch})
        return labels if limit is None else labels[:limit]

    # --- leases ----------------------------------------------------------------

    def acquire(self, key: Key, holder: str, stale_after_ms: int, now_us: int) -> None:
        """A live lease is "session_locked, with data {holder,
        heartbeat_age_ms}"; a stale one is stolen."""
        if refuses(self.backend, dict(zip(("app", "user", "session"), key, strict=True))
                   | {"holder": holder}):
            raise Refused(INVALID_PARAMS)
        held = self.leases.get(key)
        if held is not None and held.live(now_us):
            age_ms = max(0, (now_us - held.heartbeat_us) // 1000)
            raise Refused(SESSION_LOCKED, {"holder": held.holder, "heartbeat_age_ms": age_ms})
        self.leases[key] = Lease(holder, now_us, now_us, stale_after_ms)

    def heartbeat(self, key: Key, holder: str, now_us: int) -> bool:
        """"when a heartbeat's conditional update matches no row, the lease was
        stolen": a beat refreshes only its own holder's row."""
        held = self.leases.get(key)
        if held is None or held.holder != holder:
            return False
        held.heartbeat_us = now_us
        return True

    def release(self, key: Key, holder: str) -> bool:
        held = self.leases.get(key)
        if held is None or held.holder != holder:
            return False
        del self.leases[key]
        return True

    def live(self, key: Key, now_us: int) -> bool:
        held = self.leases.get(key)
        return held is not None and held.live(now_us)

    # --- retention -------------------------------------------------------------

    def compact(self, app: str, now_us: int, keep_after: int | None) -> tuple[int, int]:
        """The app's policy applied now; (events, sessions) removed.

        wire.md, "Retention": ``idle_s`` drops "sessions not appended to or
        created for that long, with their events and their own state";
        ``max_age_s`` drops "events whose timestamp is older"; ``max_events``:
        "each session keeps its newest N". "Never removed: any event or
        session of a session under a live lease ..., and any event after
        [keep_after_seq]". The rules run in the order idle_s, max_age_s,
        max_events, each to its end (streamd/eventlog/retention.py's
        essay: "The result is the one-transaction algorithm's")."""
        policy = self.policies.get(app)
        if policy is None:
            return 0, 0
        keep = keep_after if keep_after is not None else 2**63
        before = len(self.events)
        dropped = 0
        if policy.idle_s is not None:
            cutoff = max(now_us - policy.idle_s * 1_000_000, EARLIEST_US)
            for s in self.sessions_of(app, None):
                key = (s.app, s.user, s.session)
                if s.updated_us >= cutoff or self.live(key, now_us):
                    continue
                if any(e.seq > keep for e in self.session_events(key)):
                    continue
                self.delete(key)
                dropped += 1
        if policy.max_age_s is not None:
            cutoff = max(now_us - policy.max_age_s * 1_000_000, EARLIEST_US)
            for e in list(self.events.values()):
                if (e.app == app and e.time_us < cutoff and e.seq <= keep
                        and not self.live(e.key, now_us)):
                    self._remove(e.seq)
        if policy.max_events is not None:
            for s in self.sessions_of(app, None):
                key = (s.app, s.user, s.session)
                if self.live(key, now_us):
                    continue
                held = self.session_events(key)
                for e in held[: max(0, len(held) - policy.max_events)]:
                    if e.seq <= keep:
                        self._remove(e.seq)
        return before - len(self.events), dropped

    # --- boots -----------------------------------------------------------------

    def recent_boots(self, since_us: int) -> list[tuple[int, int, list[str]]]:
        """"boot.recent since -> {boots [{id, boot_at, attempted}]} oldest first"."""
        return sorted(
            (at, boot_id, attempted) for boot_id, (at, attempted) in self.boots.items()
            if at >= since_us
        )
