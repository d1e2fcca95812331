"""The event log in this process, for asyncio code: no daemon, one SQLite file.

:class:`LocalClient` has the asyncio client's methods (the same
:class:`~streamd.client.calls.EventLogMethods`, the same ``get_session``) and
answers them from a SQLite file it opens itself, through the same store the
daemon runs (:class:`~streamd.eventlog.sqlite.SqliteStore`: every storage rule
is there, none here). It is for one process that owns its agent's sessions, as
ADK's own ``SqliteSessionService`` does: an awaited durable append is then one
commit and its fsync, with no socket, no second process to wake and no second
event loop. Other processes still share the file: the daemon (``streamd
serve``, ``attach``) may serve the same log beside it, and its watchers hear
these commits as any other process's (SQLite's WAL and locks, the daemon's
change source).

How a call runs, and why:

* **On the event loop when the connection is free**: nothing of this client is
  queued or running on its worker thread, and the call can run without waiting
  for another process's lock (:meth:`SqliteStore.try_without_waiting`: a write
  that finds the lock taken gives up at ``BEGIN IMMEDIATE``, before anything is
  written). A durable append then blocks the loop for its commit (a few hundred
  microseconds); a hop to a thread and back costs about half as much again on
  a 2-core VM. Reads whose answer is small (a ping, state, a session's newest
  events) do the same; a session read whole goes to the worker.
* **Otherwise on the client's one worker thread**, in the order submitted, where
  SQLite's busy handler waits for the lock (``busy_timeout_ms``). A caller
  cancelled meanwhile does not stop a call already running: an append may
  still commit, as with the daemon, and a retry with the same event id is
  answered ``duplicate``.
* **A slow inline call** (over 20 ms: the disk or the machine has turned slow)
  sends the next ones to the worker for a second, so a slow disk stalls the
  event loop once, not at every call (the daemon's rule).
* **Answers are the daemon's**: each method is the store operation the daemon
  runs for it, and a result whose type is not the one the call asked for (a
  caller's own leaner type) is encoded and decoded into it, as from the wire.
* **Not here**: ``watch``, leases and ``compact`` are jobs of a running log
  (a producer per watch, a heartbeat per lease, the compactor's steps); they
  answer ``method_not_found`` naming the daemon. SQLite's own automatic
  checkpoint runs inside the commit that takes the WAL past 1,000 pages.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from streamd import errors
from streamd.client import calls
from streamd.client.protocol import Call
from streamd.errors import RpcError
from streamd.eventlog import dbtarget
from streamd.eventlog.model import (
    AppendBatchResult,
    BranchesResult,
    Empty,
    LatestSeqResult,
    RetentionResult,
    SessionWithEvents,
    with_event_time,
)
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.sqlite.connection import prepare_file
from streamd.eventlog.sqlite.file_identity import DatabaseFile
from streamd.eventlog.store import AppendGroup, ReadShape, closed_error
from streamd.eventlog.store.backend import CommitOutcome, Synchronous
from streamd.rpc.protocol import decode_params

__all__ = ["LocalClient"]

T = TypeVar("T")

# The daemon's numbers (streamd.eventlog.writer, .requests): an inline call
# slower than this closes the inline path for the backoff; a batch of at most
# this many appends may commit inline; a read of at most this many rows is small.
_INLINE_SLOW_S = 0.02
_INLINE_BACKOFF_S = 1.0
_INLINE_MAX_GROUP = 16
_SMALL_READ_ROWS = 100

# The answers' shape: entries encoded once (by the compiled core where it can),
# the whole session at once (there is no frame to keep small in process).
_ENCODED = ReadShape("encoded")

_Op = Callable[[SqliteStore], Any]
_encoder = msgspec.json.Encoder()


def _first(outcome: CommitOutcome) -> Any:
    result = outcome.results[0]
    if isinstance(result, RpcError):
        raise result
    return result


def _append(p: Any, now_us: int) -> tuple[_Op, bool]:
    return (lambda store: _first(store.append_commit([p], now_us, False))), True


def _append_batch(p: Any, now_us: int) -> tuple[_Op, bool]:
    group = AppendGroup(p.appends)

    def op(store: SqliteStore) -> AppendBatchResult:
        return AppendBatchResult(results=_first(store.append_commit([group], now_us, False)))

    return op, len(p.appends) <= _INLINE_MAX_GROUP


def _sessions_get(p: Any, now_us: int) -> tuple[_Op, bool]:
    def op(store: SqliteStore) -> SessionWithEvents:
        return with_event_time(store.get_session(p, _ENCODED), p.event_time)

    return op, p.recent is not None and p.recent <= _SMALL_READ_ROWS


def _sessions_list(p: Any, now_us: int) -> tuple[_Op, bool]:
    def op(store: SqliteStore) -> Any:
        got = store.list_sessions_page(p)
        if not p.event_time:
            got.sessions = [with_event_time(s, False) for s in got.sessions]
        return got

    return op, p.limit <= _SMALL_READ_ROWS


def _sessions_get_many(p: Any, now_us: int) -> tuple[_Op, bool]:
    def op(store: SqliteStore) -> Any:
        got = store.get_sessions(p, _ENCODED)
        if not p.event_time:
            got.sessions = [with_event_time(s, False) for s in got.sessions]
        return got

    return op, False


def _empty(run: Callable[[SqliteStore], object]) -> _Op:
    def op(store: SqliteStore) -> Empty:
        run(store)
        return Empty()

    return op


# Answers whose entries are encoded already (msgspec.Raw): always decoded.
_ENCODED_ANSWERS = frozenset({"eventlog/since", "eventlog/sessions.get",
                              "eventlog/sessions.get_many"})

# Each wire method: what it runs on the store, and whether it may run inline.
_METHODS: dict[str, Callable[[Any, int], tuple[_Op, bool]]] = {
    "eventlog/append": _append,
    "eventlog/append_batch": _append_batch,
    "eventlog/since": lambda p, now: ((lambda store: store.since(p, _ENCODED)), False),
    "eventlog/latest_seq": lambda p, now: (
        (lambda store: LatestSeqResult(seq=store.latest_seq(p.filter))), p.filter is None
    ),
    "eventlog/branches": lambda p, now: (
        (lambda store: BranchesResult(branches=store.branches(p.filter, p.limit))), False
    ),
    "eventlog/sessions.create": lambda p, now: (
        (lambda store: with_event_time(store.create_session(p, now), False)), True
    ),
    "eventlog/sessions.get": _sessions_get,
    "eventlog/sessions.get_many": _sessions_get_many,
    "eventlog/sessions.list": _sessions_list,
    "eventlog/sessions.delete": lambda p, now: (
        _empty(lambda store: store.delete_session(p.app, p.user, p.session)), True
    ),
    "eventlog/state.get": lambda p, now: (
        (lambda store: store.get_state(p.app, p.user, p.session, p.as_of_seq)),
        p.as_of_seq is None,
    ),
    "eventlog/retention.set": lambda p, now: (
        _empty(lambda store: store.set_retention(p, now)), True
    ),
    "eventlog/retention.get": lambda p, now: (
        (lambda store: RetentionResult(policies=store.retention_policies(p.app))), True
    ),
    "eventlog/ping": lambda p, now: (_empty(lambda store: store.ping()), True),
}


class LocalClient(calls.EventLogMethods):
    """The event log in a SQLite file opened by this process (see the module
    docstring). Open with :meth:`open`; use on the event loop that opened it;
    close with :meth:`aclose` (or ``async with``)."""

    def __init__(self, store: SqliteStore, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self._store = store
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._outstanding = 0  # calls submitted to the worker and not finished
        self._inline_closed_until = -math.inf
        self._closed = False

    @classmethod
    async def open(
        cls,
        database: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_ms: int = 5000,
    ) -> LocalClient:
        """The log in the SQLite file ``database`` (created 0600 if new, in a
        directory that must exist), its schema migrated. A server's address
        (``postgresql://``, ``mysql://``, a libpq string) is refused: those
        logs are served by the daemon."""
        target = dbtarget.classify(database)
        if target.kind != "sqlite" or target.path is None:
            raise RpcError(
                errors.INVALID_PARAMS,
                f"an in-process event log is a SQLite file; {target.description} is served"
                " by the daemon (streamd serve, or StreamdSessionService without database=)",
            )
        if (refused := target.directory_error()) is not None:
            raise RpcError(errors.SOURCE_UNAVAILABLE, refused)
        file = target.path
        path = os.path.abspath(file)
        options = SqliteOptions(synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)

        guard = DatabaseFile(path)
        prepare_file(file, make_directory=False)
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="streamd-local")
        try:
            # On the event loop, unless that would wait for another process's
            # lock (a migration, a WAL being recovered): then on the worker.
            store = SqliteStore.try_open_without_waiting(path, options, guard=guard)
            if store is None:
                store = await asyncio.get_running_loop().run_in_executor(
                    pool, lambda: SqliteStore.open(path, options, guard=guard)
                )
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return cls(store, pool)

    async def __aenter__(self) -> LocalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the file once the calls already submitted have run; later
        calls raise ``closed``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        store = self._store
        await asyncio.wrap_future(self._pool.submit(store.close))
        self._pool.shutdown(wait=False)

    @property
    def in_flight(self) -> int:
        """Calls waiting for the worker thread or running there."""
        return self._outstanding

    async def call(self, call: Call[T]) -> T:
        """One request, answered as the daemon answers it (see the module docstring)."""
        if self._closed:
            raise closed_error()
        if asyncio.get_running_loop() is not self._loop:
            # Its worker reports to the loop that opened it, and its
            # connection is that loop's: one client per event loop.
            raise RuntimeError("a LocalClient is used on the event loop that opened it")
        make = _METHODS.get(call.method)
        if make is None:
            raise RpcError(
                errors.METHOD_NOT_FOUND,
                f"{call.method} is served by the daemon, not by an in-process log"
                " (watches, leases and compaction are jobs of a running log)",
            )
        # Checked as the daemon checks what it decodes: the builders check
        # nothing, and a Struct built in Python skips its constraints.
        params = decode_params(
            call.method, msgspec.Raw(_encoder.encode(call.params)), type(call.params)
        )
        op, small = make(params, int(time.time() * 1_000_000))
        value = await self._run(op, small)
        if isinstance(value, call.result) and call.method not in _ENCODED_ANSWERS:
            return value
        return msgspec.json.decode(msgspec.json.encode(value), type=call.result)

    async def get_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        after_seq: int = 0,
        recent: int | None = None,
        after_time: Any = None,
        scoped_state: bool = False,
        event_time: bool = False,
    ) -> SessionWithEvents:
        """The session with its events (whole: nothing here cuts an answer)."""
        return await self.call(calls.get_session(
            app, user, session, after_seq=after_seq, recent=recent, after_time=after_time,
            scoped_state=scoped_state, event_time=event_time,
        ))

    async def _run(self, op: _Op, small: bool) -> Any:
        if small and self._outstanding == 0 and time.monotonic() >= self._inline_closed_until:
            started = time.monotonic()
            ran, value = self._store.try_without_waiting(op)
            if ran:
                if time.monotonic() - started > _INLINE_SLOW_S:
                    self._inline_closed_until = time.monotonic() + _INLINE_BACKOFF_S
                return value
        # Counted until the worker has finished it, not until its caller stops
        # waiting: a cancelled caller's call may still be running, and nothing
        # may run inline beside it on the same connection.
        self._outstanding += 1
        done = self._pool.submit(op, self._store)
        done.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._finished))
        return await asyncio.wrap_future(done)

    def _finished(self) -> None:
        self._outstanding -= 1
