"""Sessions read from the log as ADK's, and the events built once and kept.

* **A session this service has loaded before is read in two steps**: its
  events' seqs only (``content: false``, a fifth of the bytes), then the
  content of those not in the cache (a new turn's few events, as a rule), read
  after the first of them up to the first read's ``last_seq`` so both reads
  describe one moment. A session not seen yet is read whole at once.
* **Which stored session a copy is** is read here too: the id a padded
  session id reaches (:meth:`SessionLoader.stored_id`), and the seq an
  append through a copy expects (:meth:`SessionLoader.expected_seq`).
* **Built events are cached by seq.** Building an ADK Event costs a few
  microseconds even without pydantic's validation (:mod:`~streamd.adk.convert`),
  which for a long session is most of a load. In one log a seq names one stored
  event forever (seqs are never reused and an event id's content never
  changes), so built events are kept in an LRU and each load hands out shallow
  copies of them. A cached event is used only when the entry read at its seq
  has its event id: a log restored from a backup, or deleted and made anew,
  under a long-lived service gives old seqs to other events. A load holds
  the cached events it counts on from the moment it lists the seqs: another
  load may evict them before it has read the rest.
* **One pause of the cyclic collector a load**: the client hands the answer
  over undecoded, and it is decoded here with the collector paused, the last
  part of it decoded and the events built in the same pause, and the decoded
  entries dropped before the pause ends. A pause of its own for the decode
  ended with a collection that walked every object just decoded (0.6-1.3 ms
  for 2,000 events), garbage a moment later.
"""

from __future__ import annotations

import typing
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.session import Session

from streamd import collector, errors, forks
from streamd.adk import codec, convert
from streamd.adk.clients import Client
from streamd.adk.codec import RawEntry, RawSession
from streamd.adk.errors import stale_error
from streamd.client import calls
from streamd.client.protocol import Call
from streamd.errors import RpcError

__all__ = ["DEFAULT_EVENT_CACHE", "ListedSession", "SessionLoader", "adk_session"]

DEFAULT_EVENT_CACHE = 20_000
_SEEN_SESSIONS = 10_000

_T = TypeVar("_T")


class _MadeAnew(Exception):
    """The session was deleted and created again between a load's two reads."""


class SessionLoader:
    """Loads sessions as ADK's (see the module docstring), keeping up to
    ``event_cache`` built events (0: none) and the last 10,000 sessions
    loaded. Thread-safe: the service's event loops run in threads of their
    own."""

    def __init__(self, event_cache: int = DEFAULT_EVENT_CACHE) -> None:
        self._size = event_cache
        self._cache: OrderedDict[int, Event] = OrderedDict()
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        """Sessions loaded before: worth reading seqs first."""
        self._lock = forks.Lock()  # free in a forked child (a load of the parent's held it)

    def forget(self) -> None:
        """Drop every cached event (the next loads build them again)."""
        with self._lock:
            self._cache.clear()

    async def load(
        self,
        client: Client,
        app_name: str,
        user_id: str,
        session_id: str,
        recent: int | None,
        after: float | None,
    ) -> Session | None:
        """The session as ADK sees it, None when there is none (read in one
        step or two: see the module docstring)."""
        key = (app_name, user_id, session_id)
        after_time = codec.utc(after)
        with self._lock:
            seen = self._size > 0 and key in self._seen
        loaded: tuple[RawSession, list[Event]] | None
        if not seen:
            loaded = await self._read(client, key, recent, after_time, 0, True, self._built)
        else:
            listed = await self._read(client, key, recent, after_time, 0, False, _as_read)
            if listed is None:
                return None
            # The cached events this load uses, held now: until it builds them,
            # other loads (on this loop, between the reads below, or on other
            # loops' threads) may evict them, and these entries have no content.
            with self._lock:
                held = {e.seq: hit for e in listed.events
                        if (hit := self._cache.get(e.seq)) is not None and hit.id == e.event.id}
            missing = {e.seq for e in listed.events if e.seq not in held}

            def merged(rest: RawSession) -> tuple[RawSession, list[Event]]:
                if not calls.same_session(listed, rest):
                    raise _MadeAnew  # between the two reads: read the new one whole
                fetched = {e.seq: e for e in rest.events
                           if e.seq in missing and e.seq <= listed.last_seq}
                rest.events = []  # dropped before the pause ends, as in _built
                # A seq gone between the two reads was deleted meanwhile (retention).
                listed.events = [fetched.get(e.seq, e) for e in listed.events
                                 if e.seq in fetched or e.seq not in missing]
                return self._built(listed, held)

            if not missing:
                with collector.paused():
                    loaded = self._built(listed, held)
            else:
                after_seq = min(missing) - 1
                try:
                    loaded = await self._read(
                        client, key, None, after_time, after_seq, True, merged)
                except _MadeAnew:
                    loaded = await self._read(
                        client, key, recent, after_time, 0, True, self._built)
                # None: the session was deleted after the first read, and is no
                # more (what the first read listed is not a session now).
        if loaded is None:
            return None
        raw, events = loaded
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > _SEEN_SESSIONS:
                self._seen.popitem(last=False)
        return adk_session(app_name, user_id, raw, events)

    async def stored_id(
        self, client: Client, app_name: str, user_id: str, session_id: str
    ) -> str | None:
        """The id a session given as ``session_id`` is stored under: its
        stripped form (see :func:`~streamd.adk.codec.session_id`), unless a
        session was stored under the padded id itself (by a streamd before the
        ids were stripped), which it still reaches. None: a blank id, no
        session."""
        stripped = codec.session_id(session_id)
        if stripped is None or stripped == session_id:
            return stripped
        try:
            await client.get_session(app_name, user_id, session_id, recent=0)
        except RpcError as exc:
            if errors.is_session_not_found(exc):
                return stripped
            raise
        return session_id

    async def expected_seq(self, client: Client, session: Session) -> int:
        """The seq an append through ``session`` expects the session at: its
        marker's, or, for a copy without one, the stored seq if its last event
        is the stored last event (ADK's own check; stale otherwise)."""
        marker = session._storage_update_marker
        if marker is not None:
            try:
                return int(marker)
            except ValueError:
                pass  # another service's marker: check as for a session built by hand
        # A session without our marker is current when its last event is the
        # stored last event (or neither has one): ADK's own fallback.
        stored = await self.load(
            client, session.app_name, session.user_id, session.id, 1, None
        )
        if stored is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        mine = session.events[-1].id if session.events else None
        theirs = stored.events[-1].id if stored.events else None
        if mine != theirs:
            raise stale_error(f"its last event is {mine!r}, storage's is {theirs!r}")
        return int(stored._storage_update_marker or 0)

    async def follows(
        self, client: Client, key: tuple[str, str, str], after: int, seqs: list[int]
    ) -> bool:
        """Whether the session's next events after its event at ``after`` (its
        first ones, for 0) are those at ``seqs``, in order: a seqs-only read of
        the session from ``after`` on (its first answer is enough), made only
        for appends the log answered as duplicates."""
        if not seqs or seqs[0] <= after:
            return False
        app_name, user_id, session_id = key
        try:
            part = await client.call(calls.get_session(
                app_name, user_id, session_id, after_seq=max(after - 1, 0), content=False))
        except RpcError as exc:
            if errors.is_session_not_found(exc):
                return False
            raise
        want = seqs if after == 0 else [after, *seqs]
        return [e.seq for e in part.events[: len(want)]] == want

    async def _read(
        self,
        client: Client,
        key: tuple[str, str, str],
        recent: int | None,
        after_time: datetime | None,
        after_seq: int,
        content: bool,
        then: Callable[[RawSession], _T],
    ) -> _T | None:
        """``then`` of the session read, put together from as many answers
        as a reply budget cut it into; None when there is no such session.

        The client hands each answer over undecoded; it is decoded here with
        the cyclic collector paused, and the last one decoded and ``then``
        run (building the events) in one pause: a pause of its own ended with
        a collection that walked every object just decoded (0.6-1.3 ms for
        2,000 events), garbage a moment later."""
        app_name, user_id, session_id = key
        call: Call[msgspec.Raw] | None = Call(
            "eventlog/sessions.get",
            calls.get_session(
                app_name, user_id, session_id, recent=recent, after_time=after_time,
                after_seq=after_seq, scoped_state=True, content=content, event_time=True,
            ).params,
            msgspec.Raw,
        )
        assert call is not None
        whole = calls.SessionAssembler(call)
        while call is not None:
            try:
                answer = await client.call(call)
            except RpcError as exc:
                if errors.is_session_not_found(exc):
                    return None
                raise
            with collector.paused():
                try:
                    part = codec.session_of(answer)
                except msgspec.DecodeError as exc:
                    # As the client reports an answer that does not decode.
                    raise RpcError(
                        errors.INTERNAL_ERROR,
                        f"eventlog/sessions.get: the answer does not decode: {exc}",
                    ) from None
                call = whole.feed(part)
                if part is not whole.result:
                    part.events = []  # merged into the whole: held there alone
                if call is None:
                    return then(whole.result)
        raise AssertionError("unreachable: the loop returns once the session is whole")

    def _built(
        self, raw: RawSession, held: dict[int, Event] | None = None
    ) -> tuple[RawSession, list[Event]]:
        """The session read and its events, built (called with the collector
        paused). The entries are dropped before the pause ends, so the
        collector never walks them. ``held``: cached events taken
        beforehand, used whether or not the cache still has them."""
        events = self._events_of(raw.events, held or {})
        raw.events = []
        return raw, events

    def _events_of(self, entries: list[RawEntry], held: dict[int, Event]) -> list[Event]:
        """The loaded session's events: the ones ``held`` or cached copied,
        the rest built (outside the lock: building is the slow part) and
        cached; called with the cyclic collector paused."""
        if self._size <= 0:
            return convert.events_from_data([e.event.content for e in entries])
        cache = self._cache

        def cached(e: RawEntry) -> Event | None:
            hit = held.get(e.seq)
            if hit is None:
                hit = cache.get(e.seq)
            return hit if hit is not None and hit.id == e.event.id else None

        with self._lock:
            found = [cached(e) for e in entries]
            for e, hit in zip(entries, found, strict=True):
                if hit is not None and e.seq in cache:
                    cache.move_to_end(e.seq)
        missing = [(i, e) for i, (e, hit) in enumerate(zip(entries, found, strict=True))
                   if hit is None]
        if missing:
            rebuilt = convert.events_from_data([e.event.content for _, e in missing])
            decoded = [(i, e.seq, event) for (i, e), event in zip(missing, rebuilt, strict=True)]
            with self._lock:
                for i, seq, event in decoded:
                    found[i] = cache[seq] = event
                while len(cache) > self._size:
                    cache.popitem(last=False)
        assert all(hit is not None for hit in found)  # every miss was rebuilt above
        return convert.copied_all(typing.cast("list[Event]", found))


def adk_session(app_name: str, user_id: str, raw: Any, events: list[Event]) -> Session:
    """The ADK session of a log session read (a :class:`RawSession`, or a
    :class:`ListedSession`) with ``events``; its marker is the log's
    ``last_seq``, which ``append_event`` sends as ``expected_seq``."""
    session = Session(
        id=raw.session,
        app_name=app_name,
        user_id=user_id,
        state=codec.merged(raw.state or {}, raw.app_state or {}, raw.user_state or {}),
        events=events,
        last_update_time=_update_time(raw),
    )
    session._storage_update_marker = str(raw.last_seq)
    return session


def _as_read(raw: RawSession) -> RawSession:
    return raw


class ListedSession:
    """A listed session (``sessions.list``) in the shape :func:`adk_session` reads."""

    def __init__(self, s: Any, app_state: dict[str, Any] | None, user_state: Any) -> None:
        self.session = s.session
        self.state = s.state
        self.updated_at = s.updated_at
        self.last_event_time = s.last_event_time
        self.last_seq = s.last_seq
        self.app_state = app_state
        self.user_state = user_state


def _update_time(raw: Any) -> float:
    """ADK's ``last_update_time``: the session's event time (its newest event's
    timestamp, or its creation), else (a daemon before it was kept) its last write."""
    when = raw.last_event_time or raw.updated_at
    return when.timestamp() if when is not None else 0.0
