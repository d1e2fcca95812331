"""A Google ADK ``BaseSessionService`` on the streamd event log.

How ADK's session model maps onto the log, and why:

* **A session is a log session** of the same app, user and id; an ADK event is
  one log event whose id is the event's id and whose content is the event as
  ADK serializes it (``model_dump(mode="json", exclude_none=True)``; every field
  of ADK's Event defaults to None when it can be None, so nothing is lost and
  ``Event.model_validate`` gives back an equal event). The log's own columns
  (author, branch, invocation id, timestamp to the microsecond) are filled from
  it so the log's filters and bounded reads work on ADK events too.
* **State keeps ADK's prefixes' meaning.** ``app:`` keys go to the log's app
  scope, ``user:`` keys to the user scope, the rest to the session scope, each
  stored without its prefix and given back merged with it; ``temp:`` keys are
  applied to the in-memory session for the rest of the invocation (ADK's base
  class does that) and never sent, so they are never persisted. A delta is
  written in the transaction of its event, so the state never disagrees with
  the history.
* **Stale sessions are refused, not merged.** A session this service hands out
  carries the log's ``last_seq`` in ADK's ``_storage_update_marker`` (the slot
  ADK's own persistent services use for the same purpose); ``append_event``
  sends it as ``expected_seq``, so an append computed on a session that moved on
  since it was read raises ADK's ``StaleSessionError`` and writes nothing. A
  session built by hand (no marker) is checked the way ADK's database service
  checks one: it is current if its last event is the stored last event.
* **Bounded reads are the log's.** ``GetSessionConfig.num_recent_events`` is
  ``recent`` (0: no events), ``after_timestamp`` is ``after_time`` (events at or
  after it); both are index searches, so a resumed agent that asks for its last
  20 events pays for 20 whatever the session's length.
* **Decoded events are cached by seq.** Rebuilding an ADK Event costs about 16 us
  (pydantic validation of the event and its genai Content), which for a
  2,000-event session is most of a load. A seq names one stored event forever
  (seqs are never reused and an event id's content never changes), so decoded
  events are kept in an LRU (``event_cache`` events; 0 turns it off) and each
  load hands out shallow copies of them: fields assigned on a loaded event stay
  with that session object, while its nested Content is shared with later loads
  in this process, as in ADK's light-copy in-memory service. ADK itself never
  mutates session events in place (its request builder copies what it changes);
  code that does should turn the cache off.

The service talks to the daemon through :class:`streamd.client.AsyncClient`:
given one, it uses it (on the loop that opened it); given none, it connects on
first use, one client per event loop (``Runner.run`` runs its own loop in a
thread), starting the resident daemon if none runs.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic_core import to_jsonable_python

from streamd import errors
from streamd.client import calls
from streamd.client.asyncio_client import AsyncClient
from streamd.client.protocol import Call
from streamd.client.transport import START_TIMEOUT
from streamd.errors import RpcError
from streamd.eventlog.model import Event as LogEvent
from streamd.eventlog.model import SessionKey, StateDelta

__all__ = ["StreamdSessionService"]

DEFAULT_EVENT_CACHE = 20_000
_LIST_PAGE = 1000
_STALE_MESSAGE = (
    "the session was read at seq {expected} but has moved on to seq {last}: reload it"
    " (get_session) before appending more events"
)


# What a load reads: the session's fields and each event's seq and content,
# the content left as raw JSON so a cached event is never decoded twice.
class _RawEvent(msgspec.Struct):
    content: msgspec.Raw


class _RawEntry(msgspec.Struct):
    seq: int
    event: _RawEvent


class _RawSession(msgspec.Struct, kw_only=True):
    session: str
    state: dict[str, Any] | None
    updated_at: _dt.datetime | None
    last_seq: int
    events: list[_RawEntry]
    truncated: bool = False
    next_seq: int | None = None
    app_state: dict[str, Any] | None = None
    user_state: dict[str, Any] | None = None


class StreamdSessionService(BaseSessionService):
    """ADK sessions, events and state in the streamd event log (see the module
    docstring for the mapping)."""

    def __init__(
        self,
        client: AsyncClient | None = None,
        *,
        runtime_dir: str | None = None,
        start_daemon: bool = True,
        daemon_args: Sequence[str] = (),
        start_timeout: float = START_TIMEOUT,
        event_cache: int = DEFAULT_EVENT_CACHE,
    ) -> None:
        self._given = client
        self._connect_args: dict[str, Any] = {
            "runtime_dir": runtime_dir,
            "start_daemon": start_daemon,
            "daemon_args": daemon_args,
            "start_timeout": start_timeout,
        }
        self._owned: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._cache_size = event_cache
        self._cache: OrderedDict[int, Event] = OrderedDict()
        self._lock = threading.Lock()  # the tables above, shared by every loop's thread

    # -- the client --

    async def _client(self) -> AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._owned.get(loop)
            opening = self._opening.setdefault(loop, asyncio.Lock())
        if client is not None:
            return client
        async with opening:
            with self._lock:
                client = self._owned.get(loop)
            if client is None:
                client = await AsyncClient.connect(**self._connect_args)
                with self._lock:
                    self._owned[loop] = client
        return client

    async def close(self) -> None:
        """Close the client this service opened on the running loop (a client
        it was given is the caller's to close)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._owned.pop(loop, None)
        if client is not None:
            await client.aclose()

    # -- sessions --

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        client = await self._client()
        scopes = _split_state(state or {})
        try:
            created = await client.create_session(
                app_name, user_id, session_id, scopes.session or {},
                app_state=scopes.app, user_state=scopes.user,
            )
        except RpcError as exc:
            if isinstance(exc.data, dict) and exc.data.get("reason") == "session_exists":
                raise AlreadyExistsError(
                    f"Session with id {session_id} already exists."
                ) from None
            raise
        # Read back with the state the app and the user share (merged in).
        loaded = await self._load(client, app_name, user_id, created.session, 0, None)
        if loaded is None:  # deleted by someone else in between
            raise SessionNotFoundError(f"Session {created.session} not found.")
        return loaded

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        recent = after = None
        if config is not None:
            recent = config.num_recent_events
            after = config.after_timestamp
        return await self._load(await self._client(), app_name, user_id, session_id, recent, after)

    async def _load(
        self,
        client: AsyncClient,
        app_name: str,
        user_id: str,
        session_id: str,
        recent: int | None,
        after: float | None,
    ) -> Session | None:
        call: Call[Any] | None = Call(
            "eventlog/sessions.get",
            calls.get_session(
                app_name, user_id, session_id, recent=recent,
                after_time=_time(after), scoped_state=True,
            ).params,
            _RawSession,
        )
        whole = calls.SessionAssembler(call)
        try:
            while call is not None:
                call = whole.feed(await client.call(call))
        except RpcError as exc:
            if errors.is_session_not_found(exc):
                return None
            raise
        raw: _RawSession = whole.result
        return self._session(app_name, user_id, raw, [self._event(e) for e in raw.events])

    def _session(
        self, app_name: str, user_id: str, raw: Any, events: list[Event]
    ) -> Session:
        session = Session(
            id=raw.session,
            app_name=app_name,
            user_id=user_id,
            state=_merged(raw.state or {}, raw.app_state or {}, raw.user_state or {}),
            events=events,
            last_update_time=raw.updated_at.timestamp() if raw.updated_at else 0.0,
        )
        session._storage_update_marker = str(raw.last_seq)
        return session

    def _event(self, entry: _RawEntry) -> Event:
        if self._cache_size <= 0:
            return Event.model_validate_json(bytes(entry.event.content))
        with self._lock:
            cached = self._cache.get(entry.seq)
            if cached is not None:
                self._cache.move_to_end(entry.seq)
        if cached is None:
            cached = Event.model_validate_json(bytes(entry.event.content))
            with self._lock:
                self._cache[entry.seq] = cached
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return cached.model_copy()

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Every session of the app (of one user), without events, with its
        merged state, oldest update first (ADK's documented order), read page
        by page."""
        client = await self._client()
        found: list[Session] = []
        after: SessionKey | None = None
        while True:
            page = await client.list_sessions(
                app_name, user_id, limit=_LIST_PAGE, after=after, scoped_state=True
            )
            users = page.user_states or {}
            for s in page.sessions:
                view = _ListedSession(s, page.app_state, users.get(s.user))
                found.append(self._session(app_name, s.user, view, []))
            if page.next is None:
                break
            after = page.next
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await (await self._client()).delete_session(app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        got = await (await self._client()).get_state(app_name, user_id)
        return dict(got.user or {})

    # -- events --

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        # Temp keys go to the in-memory session for this invocation, and out of
        # the event before it is stored (ADK's base class rules).
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        client = await self._client()
        expected = await self._expected_seq(client, session)
        scopes = _split_state(event.actions.state_delta if event.actions else {})
        try:
            result = await client.append(
                session.app_name,
                session.user_id,
                session.id,
                _log_event(event),
                state_delta=scopes,
                expected_seq=expected,
            )
        except RpcError as exc:
            if errors.is_stale_session(exc):
                data = exc.data if isinstance(exc.data, dict) else {}
                raise StaleSessionError(
                    _STALE_MESSAGE.format(expected=expected, last=data.get("last_seq", "?"))
                ) from None
            if errors.is_session_not_found(exc):
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
            raise
        if result.duplicate and any(e.id == event.id for e in session.events):
            return event  # a re-delivery: stored and applied already
        if not result.duplicate or result.seq > expected:
            session._storage_update_marker = str(result.seq)
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    async def _expected_seq(self, client: AsyncClient, session: Session) -> int:
        marker = session._storage_update_marker
        if marker is not None:
            try:
                return int(marker)
            except ValueError:
                pass  # another service's marker: check as for a session built by hand
        # A session without our marker is current when its last event is the
        # stored last event (or neither has one): ADK's own fallback.
        stored = await self._load(client, session.app_name, session.user_id, session.id, 1, None)
        if stored is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        mine = session.events[-1].id if session.events else None
        theirs = stored.events[-1].id if stored.events else None
        if mine != theirs:
            raise StaleSessionError(
                "the session has events in storage that this copy of it does not:"
                " reload it (get_session) before appending more events"
            )
        return int(stored._storage_update_marker or 0)


class _ListedSession:
    """A listed session in the shape :meth:`StreamdSessionService._session` reads."""

    def __init__(self, s: Any, app_state: dict[str, Any] | None, user_state: Any) -> None:
        self.session = s.session
        self.state = s.state
        self.updated_at = s.updated_at
        self.last_seq = s.last_seq
        self.app_state = app_state
        self.user_state = user_state


def _split_state(state: dict[str, Any]) -> StateDelta:
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
        app=_jsonable(app) or None, user=_jsonable(user) or None, session=_jsonable(session) or None
    )


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    if not values:
        return values
    return to_jsonable_python(values, serialize_unknown=True)


def _merged(session: dict[str, Any], app: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    merged = dict(session)
    for key, value in app.items():
        merged[State.APP_PREFIX + key] = value
    for key, value in user.items():
        merged[State.USER_PREFIX + key] = value
    return merged


def _time(seconds: float | None) -> _dt.datetime | None:
    if seconds is None:
        return None
    return _dt.datetime.fromtimestamp(seconds, tz=_dt.UTC)


def _log_event(event: Event) -> LogEvent:
    try:
        when: _dt.datetime | None = _dt.datetime.fromtimestamp(event.timestamp, tz=_dt.UTC)
    except (OverflowError, OSError, ValueError):
        when = None  # outside what RFC 3339 holds: the exact value is in the content
    return LogEvent(
        id=event.id,
        author=event.author,
        content=event.model_dump(mode="json", exclude_none=True),
        branch=event.branch or "",
        invocation_id=event.invocation_id,
        timestamp=when,
    )
