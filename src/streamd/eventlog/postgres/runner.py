"""The PostgreSQL store as the Trio layer drives it: one worker thread per call,
one call at a time per connection, and a cancel that reaches the server.

Why synchronous psycopg in worker threads
------------------------------------------
psycopg 3 is the standard PostgreSQL driver; its async API runs only on
asyncio, as does asyncpg, and no maintained Trio or anyio-native driver exists.
So the choice was between psycopg's synchronous API in threads and an async
driver under trio-asyncio (an asyncio loop inside Trio). Measured on this
machine (2 vCPU, PostgreSQL 15 on a Unix socket, psycopg 3.3, trio-asyncio 0.16;
medians of 2,000 calls, each dispatched from Trio;
``python bench/eventlog_pg_bench.py --dispatch``), see the dependency table
of docs/install.md: the thread costs tens of microseconds per call more
than the asyncio drivers under trio-asyncio, far less than one append's commit,
and keeps the whole driver synchronous, the way the SQLite store is written and
tested, with no second event loop in the process and no asyncio dependency. A
call cancelled by Trio is not abandoned: its statement is cancelled on the
server (``cancel_safe``) and the call returns, so the next one never meets a
connection still busy with the last.

A server that does not answer at all (its backend stopped, the network
partitioned) is not waited out either: a cancelled or interrupted call still
running ``PostgresOptions.unresponsive_s`` after the cancel request was sent has
its connection cut (:meth:`PostgresStore.sever`), so it returns at once with an
error saying a write in flight may or may not have committed, and close never
hangs on the database.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import outcome
import trio

from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore
from streamd.eventlog.store.backend import Backend

__all__ = ["PostgresRunner"]

_T = TypeVar("_T")


class PostgresRunner:
    """A :class:`PostgresStore` opened for the Trio layer (a
    :class:`~streamd.eventlog.store.backend.Runner`)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._limiter = trio.CapacityLimiter(1)
        self._grace = store.options.unresponsive_s
        self._idle = threading.Event()  # no call on the worker thread now
        self._idle.set()

    @classmethod
    async def open(
        cls, conninfo: str, options: PostgresOptions | None = None, *, migrate: bool = True
    ) -> PostgresRunner:
        store = await trio.to_thread.run_sync(
            lambda: PostgresStore.open(conninfo, options, migrate=migrate)
        )
        return cls(store)

    @property
    def store(self) -> PostgresStore:
        return self._store

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        """``op(store)`` on a worker thread. Cancelled while it runs, the
        statement is cancelled on the server, the call is waited for (it
        returns promptly then), and Cancelled is raised. A server that has not
        answered within the grace (``unresponsive_s``) has the connection cut
        under the call, which then returns at once."""
        async with self._limiter:
            token = trio.lowlevel.current_trio_token()
            done = trio.Event()
            box: list[outcome.Outcome[_T]] = []

            def deliver(result: outcome.Outcome[_T]) -> None:
                box.append(result)
                self._idle.set()
                token.run_sync_soon(done.set)

            self._idle.clear()
            trio.lowlevel.start_thread_soon(lambda: op(self._store), deliver)
            try:
                await done.wait()
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    delivered = False
                    with trio.move_on_after(self._grace):
                        await trio.to_thread.run_sync(
                            self._store.cancel_running, abandon_on_cancel=True
                        )
                        delivered = True
                        await done.wait()
                    if not done.is_set() or not delivered:
                        # No answer, or a cancel request still on its way (it
                        # could hit the next statement): this connection is done.
                        self._store.sever()
                        await done.wait()
                raise
            return box[0].unwrap()

    def interrupt(self) -> None:
        """For close: every later call fails with ``closed``, and the running
        statement (if any) is cancelled, from a thread of its own so the event
        loop never waits on the network; a call still running after the grace
        has its connection cut (:meth:`PostgresStore.sever`)."""
        threading.Thread(target=self._store.interrupt, name="streamd-pg-cancel",
                         daemon=True).start()
        if not self._idle.is_set():
            threading.Thread(target=self._sever_unless_idle, name="streamd-pg-sever",
                             daemon=True).start()

    def _sever_unless_idle(self) -> None:
        if not self._idle.wait(self._grace):
            self._store.sever()

    async def aclose(self) -> None:
        async with self._limiter:
            await trio.to_thread.run_sync(self._store.close)
