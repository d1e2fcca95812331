"""The PostgreSQL store as the Trio layer drives it: the shared
:class:`~streamd.eventlog.server_runner.ServerRunner` (one worker thread per
call, one call at a time per connection, a cancel that reaches the server).

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
"""

from __future__ import annotations

from streamd.eventlog.handoff import made_on_thread
from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore
from streamd.eventlog.server_runner import ServerRunner

__all__ = ["PostgresRunner"]


class PostgresRunner(ServerRunner):
    """A :class:`PostgresStore` opened for the Trio layer."""

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store, store.options.unresponsive_s, store.where)
        self._pg = store

    @classmethod
    async def open(
        cls, conninfo: str, options: PostgresOptions | None = None, *, migrate: bool = True,
        where: str = "a PostgreSQL database",
    ) -> PostgresRunner:
        # A caller that leaves (a close, a Ctrl-C) does not wait for a server
        # that accepts and never answers: the connect's thread closes what it
        # makes (see :mod:`~streamd.eventlog.handoff`). ``where`` names the
        # database in its refusal, never with its password.
        store = await made_on_thread(
            lambda: PostgresStore.open(conninfo, options, migrate=migrate), PostgresStore.close,
            where,
        )
        return cls(store)

    @property
    def store(self) -> PostgresStore:
        return self._pg
