"""Every ``eventlog/*`` method as a typed :class:`~streamd.client.protocol.Call`.

One builder per wire method: the keyword arguments of the method's params
Struct in, a ``Call`` that knows its result type out. The three clients bind
these same builders as their methods, so they cannot drift apart and each one
is a single line. Builders validate nothing themselves: the daemon
decodes every params object strictly (unknown or out-of-range values are
invalid_params there, with msgspec's path message), and a second check here
would cost an encode per call and could only disagree with it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Coroutine, Sequence
from types import MethodType as _MethodType
from typing import Any, Generic, Literal, ParamSpec, Protocol, TypeVar, overload

from streamd import errors
from streamd.client.protocol import Call
from streamd.errors import RpcError
from streamd.eventlog.model import (
    DEFAULT_SINCE_LIMIT,
    DEFAULT_STALE_AFTER_MS,
    AppendBatchParams,
    AppendBatchResult,
    AppendParams,
    AppendResult,
    Boot,
    BootRecentParams,
    BootRecentResult,
    BootRecordParams,
    BootRecordResult,
    BootUpdateParams,
    BranchesParams,
    BranchesResult,
    CompactParams,
    CompactResult,
    Empty,
    Event,
    Filter,
    LatestSeqParams,
    LatestSeqResult,
    LockAcquireResult,
    LockReleaseParams,
    PingParams,
    RetentionGetParams,
    RetentionPolicy,
    RetentionResult,
    Session,
    SessionCreateParams,
    SessionDeleteParams,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionListResult,
    SessionsGetParams,
    SessionsResult,
    SessionWithEvents,
    SinceParams,
    SinceResult,
    StateDelta,
    StateGetParams,
    StateSnapshot,
)

__all__ = [
    "AwaitedEventLogMethods",
    "AwaitingCaller",
    "BootsAssembler",
    "EventLogMethods",
    "SessionAssembler",
    "SyncCaller",
    "append",
    "append_batch",
    "branches",
    "compact",
    "create_session",
    "delete_session",
    "get_session",
    "get_sessions",
    "get_state",
    "latest_seq",
    "list_sessions",
    "lock_acquire",
    "lock_release",
    "method",
    "ping",
    "recent_boots",
    "record_boot",
    "retention",
    "set_retention",
    "since",
    "update_boot",
]


def append(
    app: str,
    user: str,
    session: str,
    event: Event,
    *,
    metadata: dict[str, str] | None = None,
    state_delta: StateDelta | None = None,
    expected_seq: int | None = None,
) -> Call[AppendResult]:
    """Append one event (see ``eventlog/append``): ``duplicate`` for a safe
    retry, ``stale_session`` when ``expected_seq`` is no longer the session's."""
    params = AppendParams(
        app=app,
        user=user,
        session=session,
        event=event,
        metadata=metadata,
        state_delta=state_delta,
        expected_seq=expected_seq,
    )
    return Call("eventlog/append", params, AppendResult)


def append_batch(appends: Sequence[AppendParams]) -> Call[AppendBatchResult]:
    """Appends in order, all or none (``eventlog/append_batch``): how one
    session's events are pipelined without being reordered."""
    return Call("eventlog/append_batch", AppendBatchParams(appends=list(appends)),
                AppendBatchResult)


def since(
    from_seq: int = 0, filter: Filter | None = None, limit: int = DEFAULT_SINCE_LIMIT
) -> Call[SinceResult]:
    return Call(
        "eventlog/since", SinceParams(from_seq=from_seq, filter=filter, limit=limit), SinceResult
    )


def latest_seq(filter: Filter | None = None) -> Call[LatestSeqResult]:
    return Call("eventlog/latest_seq", LatestSeqParams(filter=filter), LatestSeqResult)


def branches(filter: Filter | None = None, limit: int | None = None) -> Call[BranchesResult]:
    return Call("eventlog/branches", BranchesParams(filter=filter, limit=limit), BranchesResult)


def create_session(
    app: str,
    user: str,
    session: str | None = None,
    state: dict[str, Any] | None = None,
    *,
    app_state: dict[str, Any] | None = None,
    user_state: dict[str, Any] | None = None,
) -> Call[Session]:
    params = SessionCreateParams(
        app=app, user=user, session=session, state=state, app_state=app_state,
        user_state=user_state,
    )
    return Call("eventlog/sessions.create", params, Session)


def get_session(
    app: str,
    user: str,
    session: str,
    *,
    after_seq: int = 0,
    recent: int | None = None,
    after_time: _dt.datetime | None = None,
    scoped_state: bool = False,
    content: bool = True,
    event_time: bool = False,
) -> Call[SessionWithEvents]:
    """One answer of at most 4 MiB: a session whose events do not fit is
    ``truncated``; the clients' ``get_session`` methods continue it for you.
    ``event_time`` adds the session's ``last_event_time``."""
    params = SessionGetParams(
        app=app, user=user, session=session, after_seq=after_seq, recent=recent,
        after_time=after_time, scoped_state=scoped_state, content=content,
        event_time=event_time,
    )
    return Call("eventlog/sessions.get", params, SessionWithEvents)


def get_sessions(
    app: str,
    sessions: Sequence[SessionKey | tuple[str, str]],
    *,
    recent: int | None = None,
    after_time: _dt.datetime | None = None,
    scoped_state: bool = False,
    event_time: bool = False,
) -> Call[SessionsResult]:
    keys = [
        k if isinstance(k, SessionKey) else SessionKey(user=k[0], session=k[1]) for k in sessions
    ]
    params = SessionsGetParams(
        app=app, sessions=keys, recent=recent, after_time=after_time, scoped_state=scoped_state,
        event_time=event_time,
    )
    return Call("eventlog/sessions.get_many", params, SessionsResult)


def list_sessions(
    app: str,
    user: str | None = None,
    *,
    limit: int = DEFAULT_SINCE_LIMIT,
    after: SessionKey | None = None,
    scoped_state: bool = False,
    event_time: bool = False,
) -> Call[SessionListResult]:
    params = SessionListParams(
        app=app, user=user, limit=limit, after=after, scoped_state=scoped_state,
        event_time=event_time,
    )
    return Call("eventlog/sessions.list", params, SessionListResult)


def delete_session(app: str, user: str, session: str) -> Call[Empty]:
    params = SessionDeleteParams(app=app, user=user, session=session)
    return Call("eventlog/sessions.delete", params, Empty)


def get_state(
    app: str, user: str | None = None, session: str | None = None, *, as_of_seq: int | None = None
) -> Call[StateSnapshot]:
    params = StateGetParams(app=app, user=user, session=session, as_of_seq=as_of_seq)
    return Call("eventlog/state.get", params, StateSnapshot)


def set_retention(
    app: str,
    *,
    max_age_s: int | None = None,
    max_events: int | None = None,
    idle_s: int | None = None,
) -> Call[Empty]:
    policy = RetentionPolicy(app=app, max_age_s=max_age_s, max_events=max_events, idle_s=idle_s)
    return Call("eventlog/retention.set", policy, Empty)


def retention(app: str | None = None) -> Call[RetentionResult]:
    return Call("eventlog/retention.get", RetentionGetParams(app=app), RetentionResult)


def compact(
    app: str | None = None, *, vacuum: Literal["incremental", "full", "none"] = "incremental"
) -> Call[CompactResult]:
    return Call("eventlog/compact", CompactParams(app=app, vacuum=vacuum), CompactResult)


def lock_acquire(
    app: str,
    user: str,
    session: str,
    *,
    stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
    heartbeat_ms: int | None = None,
) -> Call[LockAcquireResult]:
    # Built without __post_init__'s derivation running on a bad window: the
    # daemon re-derives and checks it.
    params = {"app": app, "user": user, "session": session, "stale_after_ms": stale_after_ms}
    if heartbeat_ms is not None:
        params["heartbeat_ms"] = heartbeat_ms
    return Call("eventlog/lock.acquire", params, LockAcquireResult)


def lock_release(lock: str) -> Call[Empty]:
    return Call("eventlog/lock.release", LockReleaseParams(lock=lock), Empty)


def record_boot(at: _dt.datetime, attempted: Sequence[str]) -> Call[BootRecordResult]:
    return Call(
        "eventlog/boot.record",
        BootRecordParams(at=at, attempted=list(attempted)),
        BootRecordResult,
    )


def update_boot(boot_id: int, attempted: Sequence[str]) -> Call[Empty]:
    return Call(
        "eventlog/boot.update", BootUpdateParams(id=boot_id, attempted=list(attempted)), Empty
    )


def recent_boots(since: _dt.datetime, *, after: int | None = None) -> Call[BootRecentResult]:
    """One page of boots (``next``: where the following one starts); the
    clients' ``recent_boots`` reads them all (:class:`BootsAssembler`)."""
    params = BootRecentParams(since=since, after=after)
    return Call("eventlog/boot.recent", params, BootRecentResult)


class BootsAssembler:
    """Every boot since a time, from the pages the reply budget cuts them
    into: feed it each answer; it returns the call for the next page, or
    None when :attr:`result` holds them all. The pages are not one snapshot:
    a boot recorded meanwhile at a time before the cursor is not among them
    (``boot_at`` is the recorder's to say)."""

    def __init__(self, since: _dt.datetime) -> None:
        self._since = since
        self._boots: list[Boot] = []
        self.result: BootRecentResult | None = None

    def feed(self, page: BootRecentResult) -> Call[BootRecentResult] | None:
        self._boots += page.boots
        if page.next is not None:
            return recent_boots(self._since, after=page.next)
        self.result = BootRecentResult(boots=self._boots)
        return None


def ping() -> Call[Empty]:
    return Call("eventlog/ping", PingParams(), Empty)



class SessionAssembler:
    """Puts a session back together when its answer was cut by the reply budget.

    Feed it each answer; it returns the call that fetches the rest, or None
    when the session is whole (:attr:`result`). The session is the one the
    first answer read: its state and ``last_seq`` come from that answer, and
    the rest is read after its ``next_seq`` up to that ``last_seq`` (events
    appended meanwhile are not mixed in), so the events, the state and the
    ``last_seq`` a writer passes as ``expected_seq`` all describe one moment.

    A session deleted and created again under the same name between two
    answers is another session: its answer is not added to the first's (the
    events between them, deleted with the first, would be missing without a
    word); the read starts over on the new one, up to :data:`RESTARTS` times.
    """

    RESTARTS = 5

    def __init__(self, first: Call[Any]) -> None:
        self._first = first
        self._params: SessionGetParams = first.params
        # Any Struct with the session's fields: a caller may decode answers
        # into a leaner type of its own (the ADK service keeps content raw).
        self._result_type = first.result
        self._restarts = 0
        self.result: Any = None

    def feed(self, part: Any) -> Call[Any] | None:
        if self.result is None:
            self.result = part
        elif not same_session(self.result, part):
            self._restarts += 1
            if self._restarts > self.RESTARTS:
                raise RpcError(
                    errors.SOURCE_UNAVAILABLE,
                    f"eventlog/sessions.get: session {self._params.session!r} was deleted and"
                    f" created again {self.RESTARTS} times while it was read in parts",
                )
            self.result = None
            return self._first
        else:
            horizon = self.result.last_seq
            self.result.events += [e for e in part.events if e.seq <= horizon]
        whole = self.result
        if part.truncated and part.next_seq is not None and part.next_seq < whole.last_seq:
            p = self._params
            rest = SessionGetParams(
                app=p.app, user=p.user, session=p.session, after_seq=part.next_seq,
                after_time=p.after_time, content=p.content,
            )
            return Call("eventlog/sessions.get", rest, self._result_type)
        whole.truncated = False
        whole.next_seq = None
        return None


def same_session(first: Any, later: Any) -> bool:
    """Whether two answers about one session name are about one session: a
    session made anew under the name has another creation time, and a
    ``last_seq`` that never goes back on one session may have (0, before
    its first event)."""
    return first.created_at == later.created_at and later.last_seq >= first.last_seq


# --- the method table ---------------------------------------------------------------

P = ParamSpec("P")
T = TypeVar("T")


class SyncCaller(Protocol):
    """A client whose ``call`` blocks for the answer (:class:`~streamd.client.sync.Client`)."""

    def call(self, call: Call[T], timeout: float | None = None) -> T: ...


class AwaitingCaller(Protocol):
    """A client whose ``call`` is awaited (the asyncio and Trio clients)."""

    def call(self, call: Call[T]) -> Coroutine[Any, Any, T]: ...


class method(Generic[P, T]):
    """One row of the method table: a builder bound as a client method.

    Reading it from a client gives ``client.call(builder(...))``: a result for
    the blocking client, a coroutine to await for the event-loop ones (no
    coroutine of its own in between, so an awaited call costs what
    ``client.call`` costs). The overloads tell a type checker which."""

    def __init__(self, builder: Callable[P, Call[T]]) -> None:
        self._builder = builder
        self.__doc__ = builder.__doc__
        self.__name__ = builder.__name__

    @overload
    def __get__(self, client: None, owner: type) -> method[P, T]: ...
    @overload
    def __get__(self, client: SyncCaller, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, client: AwaitingCaller, owner: type
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, client: Any, owner: type) -> Any:
        if client is None:
            return self
        return _MethodType(self._call, client)

    def _call(self, client: Any, /, *args: Any, **kwargs: Any) -> Any:
        return client.call(self._builder(*args, **kwargs))


class EventLogMethods:
    """The ``eventlog/*`` methods every client has, written once: name, and
    through its builder the wire method, params Struct and result type.
    ``get_session`` (continued when cut) is the blocking client's own and the
    awaited clients' shared one (:class:`AwaitedEventLogMethods`); ``watch``
    and ``acquire_lock`` are each client's own: they wait their loop's way."""

    append = method(append)
    append_batch = method(append_batch)
    since = method(since)
    latest_seq = method(latest_seq)
    branches = method(branches)
    create_session = method(create_session)
    get_sessions = method(get_sessions)
    list_sessions = method(list_sessions)
    delete_session = method(delete_session)
    get_state = method(get_state)
    record_boot = method(record_boot)
    update_boot = method(update_boot)
    ping = method(ping)
    set_retention = method(set_retention)
    retention = method(retention)
    compact = method(compact)


class AwaitedEventLogMethods(EventLogMethods):
    """The method table of a client whose ``call`` is awaited (the asyncio and
    Trio clients, the in-process one), with ``get_session`` whole, written
    once for all of them."""

    async def call(self, call: Call[T]) -> T:
        raise NotImplementedError

    async def get_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        after_seq: int = 0,
        recent: int | None = None,
        after_time: _dt.datetime | None = None,
        scoped_state: bool = False,
        event_time: bool = False,
    ) -> SessionWithEvents:
        """The session with its events, whole (an answer cut by the reply
        budget is continued)."""
        first = get_session(
            app, user, session, after_seq=after_seq, recent=recent, after_time=after_time,
            scoped_state=scoped_state, event_time=event_time,
        )
        whole = SessionAssembler(first)
        call: Call[SessionWithEvents] | None = first
        while call is not None:
            call = whole.feed(await self.call(call))
        assert whole.result is not None
        return whole.result

    async def recent_boots(self, since: _dt.datetime) -> BootRecentResult:
        """Every boot at or after ``since``, oldest first (the pages the
        reply budget cuts them into, read one after another)."""
        whole = BootsAssembler(since)
        call: Call[BootRecentResult] | None = recent_boots(since)
        while call is not None:
            call = whole.feed(await self.call(call))
        assert whole.result is not None
        return whole.result
