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
  checks one: it is current if its last event is the stored last event. An
  event the log holds already is answered as stored, whatever the seq: a copy
  takes it only as the session's next event after its own (a retry whose
  answer was lost), and is otherwise left as it is.
* **Ids and times follow ADK's contract.** Session ids are stripped of
  surrounding whitespace and a blank one is none (see
  :func:`~streamd.adk.codec.session_id`); ``last_update_time`` is the log's
  ``last_event_time``, the last event's timestamp, so the session
  ``append_event`` returns equals the one read back.
* **Bounded reads are the log's.** ``GetSessionConfig.num_recent_events`` is
  ``recent`` (0: no events), ``after_timestamp`` is ``after_time`` (events at or
  after it); both are index searches, so a resumed agent that asks for its last
  20 events pays for 20 whatever the session's length.
* **Write-behind, when asked for.** Each ``append_event`` waits for its commit
  by default: with ``synchronous=FULL`` that is an fsync per event, which bounds
  one agent loop's rate.
  ``write_behind=True`` queues the event (applied to the in-memory session at
  once) and returns; one task per session sends the queue as ordered,
  all-or-none ``eventlog/append_batch`` calls, so while one batch waits for its
  fsync the next gathers (group commit from the client's side). ADK's
  interface allows this: ``flush()`` is "flushes any buffered events", and
  ``Runner.close`` calls it. Reads of this service flush first (a runner reads
  its own writes), and so does every ``create_session`` (a new session is read
  with the ``app:`` and ``user:`` state earlier appends set); a refusal
  (``StaleSessionError``, ``SessionNotFoundError``, ``EventConflictError``)
  drops what that session copy queued after the refused event and is raised by
  the copy's next ``append_event``, or by ``flush``. Once everything a copy
  queued is stored, its marker becomes the seq of the last, as after a durable
  append. Until ``flush`` returns,
  a crash of this process loses what was queued, never what was acknowledged.
  The queues are one event loop's at a time: a send that its loop's end cut
  short (or a loop closed under it) goes back first in line for the next loop
  that uses the service (the log answers an event stored already as a
  duplicate), ``close`` sends what is queued, and a second loop while another
  sends is refused with a RuntimeError.
* **Built events are cached by seq** (:mod:`~streamd.adk.loading`, which also
  says how a session is read). A seq names one stored event forever (seqs are
  never reused and an event id's content never changes), so built events are
  kept in an LRU (``event_cache`` events; 0 turns it off) and each load hands
  out shallow copies of them: fields assigned on a loaded
  event stay with that session object, while its nested Content is shared with later
  loads in this process, as in ADK's light-copy in-memory service. ADK itself never
  mutates session events in place (its request builder copies what it changes); code
  that does should turn the cache off.

Closed, it is closed for good, on every loop: every later call is refused
(a flush returns: close did its work), a call in flight is waited for, what
write-behind queued is sent (or said unsent), and no client is opened again
(:mod:`~streamd.adk.lifetime`).

The service talks to the daemon through :class:`streamd.client.AsyncClient`:
given one, it uses it (on the loop that opened it); given none, it connects on
first use, one client per event loop (``Runner.run`` runs its own loop in a
thread), starting the resident daemon if none runs. Given ``database=`` (a
SQLite file), it runs the log in this process instead, one
:class:`streamd.client.local.LocalClient` per event loop: no daemon, no socket,
the same store and rules, the file shared with any daemon serving it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session

from streamd import errors
from streamd.adk import codec, lifetime, write_behind
from streamd.adk.clients import Client, LoopClients
from streamd.adk.errors import EventConflictError, adk_error, refuses_the_events
from streamd.adk.held import HeldEvents
from streamd.adk.lifetime import Lifetime, unsent
from streamd.adk.loading import DEFAULT_EVENT_CACHE, ListedSession, SessionLoader, adk_session
from streamd.adk.write_behind import PENDING, Ledger, Pipeline, Queued, encode
from streamd.client.transport import START_TIMEOUT
from streamd.errors import RpcError
from streamd.eventlog.model import AppendParams, AppendResult, SessionKey
from streamd.eventlog.store.backend import Synchronous

__all__ = ["StreamdSessionService"]

_LIST_PAGE = 1000
_T = TypeVar("_T")
_P = ParamSpec("_P")


def _one_call(
    method: Callable[Concatenate[StreamdSessionService, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[StreamdSessionService, _P], Coroutine[Any, Any, _T]]:
    """A public method as one call of the service (:meth:`Lifetime.run`)."""

    @functools.wraps(method)
    async def call(self: StreamdSessionService, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await self._life.run(method(self, *args, **kwargs))

    return call


class StreamdSessionService(BaseSessionService):
    """ADK sessions, events and state in the streamd event log (see the module
    docstring for the mapping)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        runtime_dir: str | None = None,
        start_daemon: bool = True,
        daemon_args: Sequence[str] = (),
        start_timeout: float = START_TIMEOUT,
        event_cache: int = DEFAULT_EVENT_CACHE,
        write_behind: bool = False,
        database: str | os.PathLike[str] | None = None,
        synchronous: Synchronous | None = None,
    ) -> None:
        """``write_behind``: ``append_event`` returns once the event is queued
        (see the module docstring); call :meth:`flush` (``Runner.close`` does)
        to know the events are stored. ``database``: a SQLite file to keep the
        log in, in this process, with no daemon (``synchronous`` as the
        daemon's ``--synchronous``, FULL by default); not with ``client``."""
        if database is not None and client is not None:
            raise ValueError("give a client (the daemon's) or a database (in process), not both")
        if synchronous is not None and database is None:
            raise ValueError("synchronous is the in-process log's (database=); the daemon's is"
                             " its --synchronous")
        self._clients = LoopClients(
            client, database=database, synchronous=synchronous or "FULL",
            runtime_dir=runtime_dir, start_daemon=start_daemon, daemon_args=daemon_args,
            start_timeout=start_timeout,
        )
        self._write_behind = write_behind
        self._pipes: dict[tuple[str, str, str], Pipeline] = {}
        self._ledger = Ledger()  # each session copy's queued appends and refusal
        self._loader = SessionLoader(event_cache)
        self._held = HeldEvents()  # each copy's events by id (write-behind)
        self._pid = os.getpid()  # the process whose queues the tables above are
        self._life = Lifetime()
        if write_behind:
            lifetime.said_at_exit(self._life, weakref.ref(self), StreamdSessionService._queued)

    def _queued(self) -> int:
        """Queued events not known stored, none of a parent's; at exit too (hence the copy)."""
        return write_behind.unsent(list(self._pipes.values())) if os.getpid() == self._pid else 0

    # -- the client --

    async def _client(self) -> Client:
        return await self._clients.get()

    async def _again_if_lost(self, call: Callable[[Client], Awaitable[_T]]) -> _T:
        """``call(client)``, and once more on a new connection if the daemon's
        ended under it (stopped, restarted, upgraded: see
        :mod:`~streamd.adk.clients`). Only for calls that are safe to make
        twice: reads, and appends (an event the first try stored is answered
        as a duplicate of itself)."""
        client = await self._client()
        try:
            return await call(client)
        except RpcError as exc:
            if not await self._clients.lost(client, exc):
                raise
        return await call(await self._client())

    async def close(self) -> None:
        """Close the service for good, from any loop (see
        :mod:`~streamd.adk.lifetime`): later calls are refused, calls in
        flight are waited for, then the clients it opened on every loop are
        closed (a client it was given is the caller's to close). With
        write-behind, what is queued is sent first, and a refusal not raised
        yet is raised here, as :meth:`flush` does; what could not be sent is
        said (``data.unsent``). Cancelled, it still closes, and logs what it could
        not store. A second close waits for the first."""
        if not self._life.begin_close():
            await self._life.first_close_done()
            return
        await lifetime.close_shielded(self._close_for_good(), lambda: self._pipes.values())

    async def _close_for_good(self) -> None:
        try:
            await self._life.calls_ended(lifetime.CLOSE_GRACE)
            await self._send_before_close()
        finally:
            try:
                await self._clients.close(lifetime.CLOSE_GRACE)
            finally:
                self._life.closed()
        if self._ledger.unreported:
            raise self._ledger.refused[self._ledger.unreported.pop(0)].error()

    async def _send_before_close(self) -> None:
        """What write-behind queued, sent before the clients close: a send
        under way on another loop ends there (the queues are one loop's at a
        time), the rest is sent from this one, within the close's grace (a
        daemon that stopped answering held the close for as long as it did)."""
        await write_behind.others_ended(list(self._pipes.values()), lifetime.CLOSE_GRACE)
        try:
            async with asyncio.timeout(lifetime.CLOSE_GRACE):
                await self._drain()
        except TimeoutError:
            write_behind.stop_sending(self._pipes.values(), asyncio.get_running_loop())
            if left := write_behind.unsent(self._pipes.values()):
                silent = TimeoutError(f"the daemon did not answer in {lifetime.CLOSE_GRACE} s")
                raise unsent(left, silent) from None
        except Exception as exc:
            if left := write_behind.unsent(self._pipes.values()):
                raise unsent(left, exc) from exc
            raise

    # -- sessions --

    @_one_call
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        if not codec.named(app_name, user_id):
            raise codec.unnamed_error(app_name, user_id)
        session_id = codec.session_id(session_id)
        client = await self._client()
        scopes = codec.split_state(state or {})
        # The app's and the user's state the new session is read back with must
        # include what appends queued before it set (write-behind).
        await self._drain()
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
            raise adk_error(exc, session_id or "", None) from None
        # Read back with the state the app and the user share (merged in).
        loaded = await self._loader.load(client, app_name, user_id, created.session, 0, None)
        if loaded is None:  # deleted by someone else in between
            raise SessionNotFoundError(f"Session {created.session} not found.")
        return loaded

    @_one_call
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
        if not codec.named(app_name, user_id):
            return None
        # Read our own writes: every session's, as their app and user state is
        # shared with this one.
        await self._drain()

        async def read(client: Client) -> Session | None:
            stored_as = await self._loader.stored_id(client, app_name, user_id, session_id)
            if stored_as is None:
                return None
            return await self._loader.load(client, app_name, user_id, stored_as, recent, after)

        return await self._again_if_lost(read)

    @_one_call
    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Every session of the app (of one user), without events, with its
        merged state, oldest update first (ADK's documented order), read page
        by page."""
        if not app_name or user_id == "":
            return ListSessionsResponse(sessions=[])
        await self._drain()

        async def read(client: Client) -> list[Session]:
            found: list[Session] = []
            after: SessionKey | None = None
            while True:
                page = await client.list_sessions(
                    app_name, user_id, limit=_LIST_PAGE, after=after, scoped_state=True,
                    event_time=True,
                )
                users = page.user_states or {}
                for s in page.sessions:
                    view = ListedSession(s, page.app_state, users.get(s.user))
                    found.append(adk_session(app_name, s.user, view, []))
                if page.next is None:
                    return found
                after = page.next

        found = await self._again_if_lost(read)
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    @_one_call
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        if not codec.named(app_name, user_id):
            return
        await self._drain()
        # Not made again after a lost connection: a delete that went through
        # could, made again, delete a session another writer had made anew.
        client = await self._client()
        stored_as = await self._loader.stored_id(client, app_name, user_id, session_id)
        if stored_as is not None:
            await client.delete_session(app_name, user_id, stored_as)

    @_one_call
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        if not codec.named(app_name, user_id):
            return {}
        await self._drain()
        got = await self._again_if_lost(lambda client: client.get_state(app_name, user_id))
        return dict(got.user or {})

    # -- events --

    @_one_call
    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        if not codec.named(session.app_name, session.user_id):
            raise codec.unnamed_error(session.app_name, session.user_id)
        # Stored without its temp keys (ADK's base class rules); they go to the
        # session object, and out of the caller's event, once the append is
        # accepted: a refused append leaves both as they were.
        trimmed = codec.without_temp(event)
        if self._write_behind:
            return await self._append_behind(session, event, trimmed)
        stored = codec.log_event(trimmed)
        delta = codec.split_state(trimmed.actions.state_delta if trimmed.actions else {})

        # Checked once: made again, the append expects what the first try
        # expected (a copy without our marker, checked again by its last
        # event, would find the event the first try stored, and be stale).
        expected = await self._again_if_lost(
            lambda client: self._loader.expected_seq(client, session))

        async def append(client: Client) -> AppendResult:
            try:
                return await client.append(
                    session.app_name, session.user_id, session.id, stored,
                    state_delta=delta, expected_seq=expected,
                )
            except RpcError as exc:
                raise adk_error(exc, session.id, expected) from None

        result = await self._again_if_lost(append)
        if result.duplicate and not await self._takes_duplicate(
                session, event.id, expected, result.seq):
            return event
        session._storage_update_marker = str(result.seq)
        return self._accepted(session, event)

    def _accepted(self, session: Session, event: Event) -> Event:
        """ADK's base class steps for an append accepted: the event's temp keys
        to the session object and out of the event, the event to the object."""
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        session.last_update_time = codec.stored_time(event.timestamp)
        return self._commit_event_to_session(session, event)

    async def _takes_duplicate(
        self, session: Session, event_id: str, expected: int, seq: int
    ) -> bool:
        """Whether an object takes an event the log answered as stored (at
        ``seq``): only as the session's next after its own (``expected``).
        Elsewhere, it would make a stale object pass for current, or add an
        old event to one read with fewer: it is left as it is, as ADK's is."""
        if any(e.id == event_id for e in session.events):
            return False
        return await self._again_if_lost(lambda client: self._loader.follows(
            client, (session.app_name, session.user_id, session.id), expected, [seq]))

    # -- write-behind --

    async def _append_behind(self, session: Session, event: Event, trimmed: Event) -> Event:
        """Queue the event behind this session copy's earlier ones and return.

        Each session object (copy) gets a token in its marker; the pipeline of
        its session sends runs of one copy's consecutive events as one ordered,
        all-or-none ``append_batch``, the run's first event carrying that copy's
        ``expected_seq`` (its marker's seq, or the seq its previous run was
        stored at). So a copy that another writer overtook is still refused as
        stale, with everything it queued after, and nothing of it is merged."""
        self._own_write_behind()
        # Refused here if the log cannot hold it, before anything is queued.
        stored = codec.log_event(trimmed)
        delta = codec.split_state(trimmed.actions.state_delta if trimmed.actions else {})
        marker = session._storage_update_marker
        token = marker[len(PENDING):] if marker and marker.startswith(PENDING) else None
        refused = self._ledger.refused.get(token) if token is not None else None
        if refused is not None:  # this copy is stale for good: reload it
            if token in self._ledger.unreported:
                self._ledger.unreported.remove(token)
            raise refused.error()
        # Answered by the copy, before a token is made for it: nothing is queued
        # for these, and the log is not asked (a session deleted since is not seen).
        held = self._held.find(session, event.id)
        if held is not None:
            if codec.stored_alike(held, trimmed):
                return event  # a re-delivery of an event this copy already holds
            # As the log answers a durable append of it (event_conflict).
            raise EventConflictError(
                f"event {event.id!r} is already in this session with other content: an"
                " event id names one event; nothing was queued",
                event_id=event.id, seq=None)
        expected: int | None = None  # behind this copy's queued appends
        if token is None or not self._ledger.owed.get(token):
            # A copy whose appends are all stored carries their seq (Ledger.settle).
            # One without such a marker is checked against storage: what this
            # service queued for the session must be there first, or the
            # copy's own events would make it look stale.
            token = uuid.uuid4().hex
            if not (marker or "").isdigit():
                await self._drain()
            expected = await self._again_if_lost(
                lambda client: self._loader.expected_seq(client, session))
            self._ledger.copies[token] = weakref.ref(session)
        params = AppendParams(
            app=session.app_name,
            user=session.user_id,
            session=session.id,
            event=stored,
            state_delta=delta,
        )
        key = (session.app_name, session.user_id, session.id)
        pipe = self._pipes.get(key)
        if pipe is None:
            pipe = self._pipes[key] = Pipeline()
        pipe.queue.append(Queued(token, params, expected, len(encode(params))))
        self._ledger.owed[token] = self._ledger.owed.get(token, 0) + 1
        session._storage_update_marker = PENDING + token
        self._accepted(session, event)
        if pipe.task is None:
            pipe.task = write_behind.start(asyncio.get_running_loop(), self._send(key, pipe))
        return event

    async def _send(self, key: tuple[str, str, str], pipe: Pipeline) -> None:
        me = asyncio.current_task()
        lost = False  # the daemon's connection ended under the run before
        try:
            while pipe.queue:
                client = await self._client()  # a new one after a loss
                run = pipe.take_run()
                first = run[0]
                expected = first.expected
                if expected is None:
                    expected = self._ledger.acked[first.token]
                appends = [msgspec.structs.replace(first.params, expected_seq=expected)]
                appends += [q.params for q in run[1:]]
                try:
                    results = (await client.append_batch(appends)).results
                except asyncio.CancelledError:
                    # Its event loop is ending (asyncio.run cancels what is left
                    # of a turn's tasks) with the run's outcome unknown: first in
                    # line again, for the next loop that uses the service to send
                    # (the log answers an event stored already as a duplicate).
                    pipe.put_back(run)
                    raise
                except RpcError as exc:
                    if refuses_the_events(exc):
                        self._ledger.refuse(pipe, first, exc, expected)
                        continue
                    # Not a refusal, so nothing is dropped: the run's outcome
                    # is unknown (closed), or the log could not store it now
                    # (a full disk). It goes back first in line, sent again
                    # on a new connection if ours was lost (a stored event
                    # comes back a duplicate); else the task ends with the
                    # queue kept, raised by the drain that waits for it.
                    pipe.put_back(run)
                    if (exc.code != errors.CLOSED or lost
                            or not await self._clients.lost(client, exc)):
                        raise
                    lost = True
                    continue
                pipe.sending = []
                lost = False
                # An event stored before, not right after the copy's seq (a duplicate
                # is answered whatever the seq): the copy is not the session's view
                # (or, the read failing, not known to be), refused as stale from here.
                try:
                    moved = any(r.duplicate for r in results) and not await self._loader.follows(
                        client, key, expected, [r.seq for r in results])
                except RpcError:
                    moved = True
                if moved:
                    self._ledger.refuse(pipe, first, RpcError(
                        errors.STALE_SESSION, "a queued event was stored before, elsewhere in"
                        " the session", {"expected_seq": expected}), expected)
                    continue
                self._ledger.stored(first.token, len(run), results[-1].seq)
        finally:
            # Not when this is a task abandoned with its closed loop, ended by the
            # collector later: the pipeline may have another task by then.
            if pipe.task is me:
                pipe.task = None
            if pipe.task is None and not pipe.queue and self._pipes.get(key) is pipe:
                del self._pipes[key]  # a session's pipeline lives while it has work

    def _forget_parents_queues(self) -> None:
        """In a process forked from the one that queued, start with no queue:
        the queues, their tasks and refusals are the parent's, which sends them
        when its loop runs again. Kept, a send task of the parent's loop,
        never to end here, made every call of the child a RuntimeError (two
        loops at once)."""
        if os.getpid() == self._pid:
            return
        self._pid = os.getpid()
        self._pipes, self._ledger = {}, Ledger()
        self._held = HeldEvents()

    async def _drain(self) -> None:
        """Wait until everything queued is sent (stored or refused). A queue
        an ended event loop left unsent is sent from this one."""
        self._forget_parents_queues()
        if not self._pipes:
            return
        loop = self._own_write_behind()
        for key, pipe in list(self._pipes.items()):
            if pipe.task is None and pipe.queue:
                pipe.task = write_behind.start(loop, self._send(key, pipe))
            while pipe.task is not None:
                await asyncio.shield(pipe.task)

    def _own_write_behind(self) -> asyncio.AbstractEventLoop:
        """The running loop, once no other loop is sending this service's
        queues: write-behind's queues and counts are one loop's at a time
        (ADK's ``Runner.run`` runs turn after turn, each on a loop of its own;
        the durable default serves loops at once)."""
        self._forget_parents_queues()
        loop = asyncio.get_running_loop()
        for pipe in self._pipes.values():
            pipe.abandoned()  # a loop closed under its task: the run is queued again
            task = pipe.task
            if task is not None and task.get_loop() is not loop and not task.done():
                raise RuntimeError(
                    "StreamdSessionService(write_behind=True) is used from two event loops at"
                    " once; write-behind sends from one loop at a time (use a service per"
                    " loop, or the durable default)")
        return loop

    async def flush(self) -> None:
        """Wait until every queued event is stored; raise the first refusal
        not raised yet (ADK's ``StaleSessionError``, ``SessionNotFoundError``).
        In a forked child, what the parent queued is the parent's to flush.
        Once the service is closed, nothing: close sent what was queued, or
        said what it could not (``Runner.close`` flushes a service its
        caller may have closed first)."""
        await self._life.run_unless_closing(self._flush())

    async def _flush(self) -> None:
        await self._drain()
        if self._ledger.unreported:
            raise self._ledger.refused[self._ledger.unreported.pop(0)].error()
