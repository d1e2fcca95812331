"""The event log in this process, for asyncio code: no daemon, one SQLite file.

:class:`LocalClient` has the asyncio client's methods (the same
:class:`~streamd.client.calls.AwaitedEventLogMethods`) and
answers them from a SQLite file this process opens, through the same store the
daemon runs (:class:`~streamd.eventlog.sqlite.SqliteStore`: every storage rule
is there, none here). It is for one process that owns its agent's sessions, as
ADK's own ``SqliteSessionService`` does: an awaited durable append is then one
commit and its fsync, with no socket, no second process to wake and no second
event loop. Other processes still share the file: the daemon (``streamd
serve``, ``attach``) may serve the same log beside it, and its watchers hear
these commits as any other process's (SQLite's WAL and locks, the daemon's
change source).

The clients of one event loop on one file (with the same options) share its
connection and worker thread (:mod:`streamd.client.local_log`): a second
service on the file costs no second open and no fight for its write lock.

How a call runs, and why:

* **On the event loop when the connection is free**: nothing is queued or
  running on its worker thread, and the call can run without waiting
  for another process's lock (:meth:`SqliteStore.try_without_waiting`: a write
  that finds the lock taken gives up at ``BEGIN IMMEDIATE``, before anything is
  written). A durable append then blocks the loop for its commit (a few hundred
  microseconds); a hop to a thread and back costs about half as much again on
  a 2-core VM. Reads whose answer is small (a ping, state, a session's newest
  events) do the same; a session read whole goes to the worker.
* **Otherwise on the file's one worker thread**, in the order submitted, where
  SQLite's busy handler waits for the lock (``busy_timeout_ms``). A caller
  cancelled meanwhile does not stop a call already running: an append may
  still commit, as with the daemon, and a retry with the same event id is
  answered ``duplicate``.
* **A slow inline call** (a write over 20 ms, a read over 5 ms: the disk or the
  machine has turned slow) sends the next ones of its kind to the worker for a
  second, so a slow disk stalls the event loop once, not at every call (the
  daemon's rules, :mod:`streamd.eventlog.inline`). Long work never starts
  inline: a session read whole, a deleted session's cascade, a migration.
* **Answers are the daemon's**: each method is the store operation the daemon
  runs for it, and a result whose type is not the one the call asked for (a
  caller's own leaner type) is encoded and decoded into it, as from the wire.
* **Checkpoints are SQLite's own**: inside the commit that takes the WAL past
  1,000 pages (some hundred appends), with that commit, about a millisecond
  on the development VM (a slow one sends the next writes to the worker, as
  above). Moved off the commit they cost the appends more: a checkpoint on
  the client's worker made the appends behind it wait there, and one on a
  second connection beside them (the daemon's way, for a daemon that serves
  many callers) competed with their fsyncs: 2,401-2,438 against 2,565-2,580
  awaited durable appends a second, alternated runs.
* **Not here**: ``watch``, leases and ``compact`` are jobs of a running log
  (a producer per watch, a heartbeat per lease, the compactor's steps); they
  answer ``method_not_found`` naming the daemon. Retention policies are kept
  (``retention.set``), and applied by a daemon's compactor.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from streamd import errors
from streamd.client import calls
from streamd.client.local_log import OpenLog, forked_error, open_log, release_later
from streamd.client.protocol import Call, decode_result, encode_params
from streamd.errors import RpcError
from streamd.eventlog import dbtarget, inline
from streamd.eventlog.model import (
    AppendBatchParams,
    AppendBatchResult,
    AppendParams,
    BootRecentParams,
    BootRecordParams,
    BootRecordResult,
    BootUpdateParams,
    BranchesParams,
    BranchesResult,
    Empty,
    LatestSeqParams,
    LatestSeqResult,
    PingParams,
    RetentionGetParams,
    RetentionPolicy,
    RetentionResult,
    SessionCreateParams,
    SessionDeleteParams,
    SessionGetParams,
    SessionListParams,
    SessionsGetParams,
    SinceParams,
    StateGetParams,
    to_us,
    with_event_time,
)
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.store import AppendGroup, ReadShape, closed_error
from streamd.eventlog.store.backend import CommitOutcome, Synchronous
from streamd.rpc.protocol import decode_params

__all__ = ["LocalClient", "served_methods"]

T = TypeVar("T")

# The answers' shape: entries encoded once (by the compiled core where it can),
# the whole session at once (there is no frame to keep small in process).
_ENCODED = ReadShape("encoded")

_Op = Callable[[SqliteStore], Any]
_encoder = msgspec.json.Encoder()

_TURN_EVERY_S = 0.002
"""At most this long of inline calls, one after another, before the loop turns."""


@dataclass(frozen=True, slots=True)
class _Method:
    """One wire method in process: its params type (what the daemon decodes
    them into), the store operation for decoded params and the time, whether
    the call may start inline, and whether it writes."""

    params: type
    plan: Callable[[Any, int], _Op]
    small: Callable[[Any], bool]
    writes: bool
    encoded: bool = False
    """The answer's entries are encoded already (``msgspec.Raw``): always
    decoded into the caller's type."""


def _first(outcome: CommitOutcome) -> Any:
    result = outcome.results[0]
    if isinstance(result, RpcError):
        raise result
    return result


def _append(p: AppendParams, now_us: int) -> _Op:
    return lambda store: _first(store.append_commit([p], now_us, False))


def _append_batch(p: AppendBatchParams, now_us: int) -> _Op:
    group = AppendGroup(p.appends)
    return lambda store: AppendBatchResult(
        results=_first(store.append_commit([group], now_us, False))
    )


def _sessions_get(p: SessionGetParams, now_us: int) -> _Op:
    return lambda store: with_event_time(store.get_session(p, _ENCODED), p.event_time)


def _listed(p: Any, got: Any) -> Any:
    if not p.event_time:
        got.sessions = [with_event_time(s, False) for s in got.sessions]
    return got


def _empty(run: Callable[[SqliteStore], object]) -> _Op:
    def op(store: SqliteStore) -> Empty:
        run(store)
        return Empty()

    return op


def _always(p: Any) -> bool:
    return True


def _never(p: Any) -> bool:
    return False


# What the daemon's request layer runs for each method (streamd.eventlog.requests
# and .service), and which calls it lets start inline.
_METHODS: dict[str, _Method] = {
    "eventlog/append": _Method(AppendParams, _append, _always, writes=True),
    "eventlog/append_batch": _Method(
        AppendBatchParams, _append_batch,
        lambda p: len(p.appends) <= inline.MAX_INLINE_GROUP, writes=True,
    ),
    "eventlog/since": _Method(
        SinceParams, lambda p, now: lambda store: store.since(p, _ENCODED), _never,
        writes=False, encoded=True,
    ),
    "eventlog/latest_seq": _Method(
        LatestSeqParams,
        lambda p, now: lambda store: LatestSeqResult(seq=store.latest_seq(p.filter)),
        lambda p: p.filter is None, writes=False,
    ),
    "eventlog/branches": _Method(
        BranchesParams,
        lambda p, now: lambda store: BranchesResult(branches=store.branches(p.filter, p.limit)),
        _never, writes=False,
    ),
    "eventlog/sessions.create": _Method(
        SessionCreateParams,
        lambda p, now: lambda store: with_event_time(store.create_session(p, now), False),
        _always, writes=True,
    ),
    "eventlog/sessions.get": _Method(
        SessionGetParams, _sessions_get,
        lambda p: p.recent is not None and p.recent <= inline.SMALL_READ_ROWS,
        writes=False, encoded=True,
    ),
    "eventlog/sessions.get_many": _Method(
        SessionsGetParams,
        lambda p, now: lambda store: _listed(p, store.get_sessions(p, _ENCODED)),
        _never, writes=False, encoded=True,
    ),
    "eventlog/sessions.list": _Method(
        SessionListParams,
        lambda p, now: lambda store: _listed(p, store.list_sessions_page(p)),
        lambda p: p.limit <= inline.SMALL_READ_ROWS, writes=False,
    ),
    # A session's events go with it (a cascade, as long as the session): never inline.
    "eventlog/sessions.delete": _Method(
        SessionDeleteParams,
        lambda p, now: _empty(lambda store: store.delete_session(p.app, p.user, p.session)),
        _never, writes=True,
    ),
    "eventlog/state.get": _Method(
        StateGetParams,
        lambda p, now: lambda store: store.get_state(p.app, p.user, p.session, p.as_of_seq),
        lambda p: p.as_of_seq is None, writes=False,
    ),
    "eventlog/retention.set": _Method(
        RetentionPolicy,
        lambda p, now: _empty(lambda store: store.set_retention(p, now)),
        _always, writes=True,
    ),
    "eventlog/retention.get": _Method(
        RetentionGetParams,
        lambda p, now: lambda store: RetentionResult(policies=store.retention_policies(p.app)),
        _never, writes=False,
    ),
    "eventlog/boot.record": _Method(
        BootRecordParams,
        lambda p, now: lambda store: BootRecordResult(
            id=store.record_boot(to_us(p.at), p.attempted)
        ),
        _always, writes=True,
    ),
    "eventlog/boot.update": _Method(
        BootUpdateParams,
        lambda p, now: _empty(lambda store: store.update_boot(p.id, p.attempted)),
        _always, writes=True,
    ),
    "eventlog/boot.recent": _Method(
        BootRecentParams,
        lambda p, now: lambda store: store.recent_boots_page(to_us(p.since), p.after),
        _never, writes=False,
    ),
    "eventlog/ping": _Method(
        PingParams, lambda p, now: _empty(lambda store: store.ping()), _always, writes=False,
    ),
}


def served_methods() -> dict[str, type]:
    """The wire methods an in-process log answers, each with the params type
    its params are read into (the daemon's: a test holds the two tables
    together)."""
    return {name: method.params for name, method in _METHODS.items()}


class LocalClient(calls.AwaitedEventLogMethods):
    """The event log in a SQLite file opened by this process (see the module
    docstring). Open with :meth:`open`; use on the event loop that opened it;
    close with :meth:`aclose` (or ``async with``). One dropped unclosed lets
    go when it is collected; the file closes with the last of its loop's
    clients (:mod:`streamd.client.local_log`)."""

    def __init__(self, log: OpenLog) -> None:
        self._log = log
        # Weakly: a service keeps its clients by loop in a WeakKeyDictionary,
        # which a client holding its loop would keep alive for ever.
        self._loop = weakref.ref(asyncio.get_running_loop())
        self._closed = False
        # Collected unclosed: its hold is let go with no event loop.
        self._finalizer = weakref.finalize(self, release_later, log)

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
        if str(database) == ":memory:":
            raise RpcError(errors.INVALID_PARAMS, "an in-process event log is a file: give a path")
        if (refused := target.file_error()) is not None:
            raise RpcError(errors.SOURCE_UNAVAILABLE, refused)
        # The loop's open log of this file, shared (streamd.client.local_log).
        options = SqliteOptions(synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        return cls(await open_log(target.path, options))

    async def __aenter__(self) -> LocalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Let go of the file once the calls already on its worker have run
        (this client's, and those of the loop's other clients of the file,
        which share it); the last of those clients closes the file. Later
        calls raise ``closed``. Idempotent; a cancelled close still lets go."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        closing = self._log.release()
        await (self._log.drained() if closing is None
               else asyncio.shield(asyncio.wrap_future(closing)))

    def abandon(self) -> None:
        """Let go without an event loop (its own has ended): the file is
        closed on the worker after what it still runs, if this was its last
        client; later calls raise ``closed``."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            self._log.release()

    @property
    def in_flight(self) -> int:
        """Calls waiting for the worker thread or running there (this
        client's and those of the loop's other clients of the file)."""
        return self._log.outstanding

    async def call(self, call: Call[T]) -> T:
        """One request, answered as the daemon answers it (see the module docstring)."""
        if self._closed:
            raise closed_error()
        if self._log.inherited:
            raise forked_error(self._log.path)
        if asyncio.get_running_loop() is not self._loop():
            # Its worker reports to the loop that opened it, and its
            # connection is that loop's clients': a client is its loop's.
            raise RuntimeError("a LocalClient is used on the event loop that opened it")
        method = _METHODS.get(call.method)
        if method is None:
            raise RpcError(
                errors.METHOD_NOT_FOUND,
                f"{call.method} is served by the daemon, not by an in-process log"
                " (watches, leases and compaction are jobs of a running log)",
            )
        # Decoded as the daemon decodes what it reads, into its params type:
        # the builders check nothing, and a Struct built in Python skips its
        # constraints.
        params = decode_params(
            call.method, msgspec.Raw(encode_params(call)), method.params
        )
        op = method.plan(params, int(time.time() * 1_000_000))
        value = await self._run(op, method.small(params), method.writes)
        if isinstance(value, call.result) and not method.encoded:
            return value
        return decode_result(_encoder.encode(value), call.result)

    async def _run(self, op: _Op, small: bool, writes: bool) -> Any:
        log = self._log
        gate = log.inline_closed_until
        if small and log.outstanding == 0 and time.monotonic() >= gate[writes]:
            started = time.monotonic()
            ran, value = log.try_inline(op)
            if ran:
                slow = inline.SLOW_WRITE_S if writes else inline.SLOW_READ_S
                if time.monotonic() - started > slow:
                    gate[writes] = time.monotonic() + inline.BACKOFF_S
                # An inline call does not suspend its caller, so a caller
                # awaiting call after call would starve the loop's other
                # tasks, and the callbacks the threads queue on it: one turn
                # of the loop every few milliseconds of them (a turn on every
                # call cost a tenth of an append's time).
                if time.monotonic() - log.turned >= _TURN_EVERY_S:
                    log.turned = time.monotonic()
                    await asyncio.sleep(0)
                return value
        log.turned = time.monotonic()  # the worker's answer is awaited: a turn
        return await asyncio.wrap_future(log.submit(op))
