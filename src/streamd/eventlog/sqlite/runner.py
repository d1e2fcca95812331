"""An SQLite connection as the Trio layer drives it: a worker thread of its
own, and short calls made inline on the event loop thread.

Why not ``apsw.aio``
--------------------
An agent loop appends one event, waits for it, and only then produces the
next; a cold session load is a handful of small reads, each awaited. Each hop
to a worker thread and back wakes a sleeping thread twice and costs the event
loop two turns; measured on a 2-core VM, an ``apsw.aio`` call that does
nothing takes about 95 us, where the same call made inline takes 4 us, and a
durable append's whole commit (SQL and fsync) is 200-400 us. A ``ping``
through the daemon cost about 100 us more CPU on the thread than inline. So
the writer's and the reader's connection are both a :class:`ConnectionRunner`:

* **Every operation may run on the worker thread**, in the order submitted
  (:meth:`ConnectionRunner.run`), as with ``apsw.aio``: a call whose caller is
  cancelled before it starts is skipped, and one already running is
  interrupted at SQLite's next progress check (its transaction rolls back).
* **A short one may run inline** (:meth:`ConnectionRunner.try_inline`), on
  the event loop thread, when nothing is queued or running on the worker (so
  the connection is free and nothing submitted before it is overtaken). The
  busy handler does not wait there: a lock another connection holds makes
  the inline attempt give up (a write at ``BEGIN IMMEDIATE``, before anything
  is written) and the call goes to the worker thread, which waits for the
  lock as usual. The event loop is thus blocked for one small transaction
  (and, for a write, its fsync) at most, never for another process's lock.
  Which calls qualify is the caller's decision: a lone append
  (:class:`streamd.eventlog.writer.GroupCommitWriter`), a read whose answer is
  a few rows (:meth:`streamd.eventlog.connections.Connections.read`). An
  inline call that took long (a disk that has turned slow) keeps the next
  ones on the worker for a while (:class:`InlineGate`).

The connection is an ordinary (synchronous) APSW connection, used by one
thread at a time: the event loop's only while the worker is idle, and the
worker's otherwise. The writer's makes no checkpoints of its own: SQLite's
automatic one runs inside the commit that takes the WAL past 1,000 pages (some
hundred appends), and that commit's caller (and, inline, the event loop) would
wait for the copy and its fsyncs; the event log checkpoints from its reader's
connection instead, beside the writes (:attr:`ConnectionRunner.wal_pages` says
when).
"""

from __future__ import annotations

import enum
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Literal, TypeVar

import outcome
import trio

from streamd.eventlog.sqlite.connection import SqliteOptions
from streamd.eventlog.sqlite.file_identity import DatabaseFile
from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store.backend import Backend, Role

__all__ = ["NOT_RUN", "ConnectionRunner", "InlineGate", "ThreadRunner"]

_T = TypeVar("_T")


class _NotRun(enum.Enum):
    NOT_RUN = enum.auto()


NOT_RUN: Final = _NotRun.NOT_RUN
"""What :meth:`ConnectionRunner.try_inline` returns when the call was not made."""

# SQLite steps between checks for a cancelled caller: apsw.aio's default
# (some ten checks a second on a long statement).
_PROGRESS_STEPS = 50_000


class _Call:
    __slots__ = ("cancelled", "done", "op", "result")

    def __init__(self, op: Callable[[Backend], Any]) -> None:
        self.op = op
        self.done = trio.Event()
        self.cancelled = False
        self.result: outcome.Outcome[Any] | None = None


class InlineGate:
    """Whether inline calls are allowed now: after one that took longer than
    ``slow_s`` (the disk or the machine has turned slow), none for
    ``backoff_s``, so a slow disk stalls the event loop once, not on every
    call. Times are Trio's clock (a test's mock clock moves it)."""

    def __init__(self, slow_s: float, backoff_s: float) -> None:
        self._slow_s = slow_s
        self._backoff_s = backoff_s
        self._closed_until = -math.inf

    @property
    def open(self) -> bool:
        return trio.current_time() >= self._closed_until

    def attempt(
        self, runner: ConnectionRunner, op: Callable[[Backend], _T]
    ) -> _T | Literal[_NotRun.NOT_RUN]:
        """``runner.try_inline(op)`` if the gate is open, timed (of the wall
        clock: it blocks the loop) to close the gate after a slow one."""
        if not self.open:
            return NOT_RUN
        started = time.monotonic()
        done = runner.try_inline(op)
        if done is not NOT_RUN and time.monotonic() - started > self._slow_s:
            self._closed_until = trio.current_time() + self._backoff_s
        return done


class ConnectionRunner:
    """A :class:`~streamd.eventlog.sqlite.store.SqliteStore` opened for the
    Trio layer (a :class:`~streamd.eventlog.store.backend.Runner`), with a
    worker thread of its own and an inline path (see the module docstring)."""

    def __init__(self, store: SqliteStore, role: Role = "writer") -> None:
        self._store = store
        self._token = trio.lowlevel.current_trio_token()
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._outstanding = 0  # calls queued or running; touched on the loop thread only
        self._current: _Call | None = None  # the worker's call, for the progress check
        self._stopped = trio.Event()
        store.set_progress_check(self._abandoned, _PROGRESS_STEPS)
        self._thread = threading.Thread(target=self._work, name=f"streamd-log-{role}", daemon=True)
        self._thread.start()

    @classmethod
    async def open(
        cls,
        path: str,
        options: SqliteOptions,
        *,
        guard: DatabaseFile | None = None,
        role: Role = "writer",
    ) -> ConnectionRunner:
        """Open on a worker thread: the writer's connection migrates the
        schema (which may take a while) and leaves checkpoints to the
        reader's."""
        writer = role == "writer"

        def opened() -> SqliteStore:
            store = SqliteStore.open(path, options, migrate=writer, guard=guard)
            if writer:
                store.leave_checkpoints_to_others()
            return store

        return cls(await trio.to_thread.run_sync(opened), role)

    @property
    def store(self) -> SqliteStore:
        return self._store

    @property
    def wal_pages(self) -> int:
        """Pages in the WAL after the last commit."""
        return self._store.wal_pages

    @property
    def idle(self) -> bool:
        """Nothing queued or running on the worker thread."""
        return self._outstanding == 0

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        """``op(store)`` on the worker thread, after every call submitted before it."""
        call = _Call(op)
        self._outstanding += 1
        self._queue.put(call)
        try:
            await call.done.wait()
        except BaseException:
            call.cancelled = True  # skipped if not started, interrupted if running
            raise
        assert call.result is not None
        return call.result.unwrap()

    def try_inline(self, op: Callable[[Backend], _T]) -> _T | Literal[_NotRun.NOT_RUN]:
        """``op(store)`` here and now, or :data:`NOT_RUN` (nothing written)
        when the worker is busy or another connection holds the write lock."""
        if self._outstanding:
            return NOT_RUN
        attempt = self._store.try_without_waiting(op)
        return attempt[1] if attempt[0] else NOT_RUN

    def expect_close(self) -> float | None:
        return None  # SQLite's close interrupts at once: it gives nothing a grace

    def interrupt(self) -> None:
        self._store.interrupt()

    async def aclose(self) -> None:
        try:
            # Shielded: a close skipped because its caller was cancelled would
            # leave the connection open, its final checkpoint never made.
            with trio.CancelScope(shield=True):
                await self.run(lambda _: self._store.close())
        finally:
            self._queue.put(None)
            with trio.CancelScope(shield=True):
                await self._stopped.wait()

    # -- the worker thread --

    def _abandoned(self) -> bool:
        call = self._current
        return call is not None and call.cancelled

    def _work(self) -> None:
        store = self._store
        try:
            while (call := self._queue.get()) is not None:
                if not call.cancelled:
                    self._current = call
                    call.result = outcome.capture(call.op, store)
                    self._current = None
                try:
                    self._token.run_sync_soon(self._finished, call)
                except trio.RunFinishedError:
                    return  # the event loop is gone: nobody is waiting
        finally:
            try:
                self._token.run_sync_soon(self._stopped.set)
            except trio.RunFinishedError:
                pass

    def _finished(self, call: _Call) -> None:
        self._outstanding -= 1
        call.done.set()


class ThreadRunner:
    """A synchronously opened store driven through ``trio.to_thread``, one call
    at a time (``dispatch="thread"``)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._limiter = trio.CapacityLimiter(1)

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        return await trio.to_thread.run_sync(op, self._store, limiter=self._limiter)

    def expect_close(self) -> float | None:
        return None  # as ConnectionRunner's

    def interrupt(self) -> None:
        self._store.interrupt()

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self._store.close, limiter=self._limiter)
