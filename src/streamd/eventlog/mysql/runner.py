"""The MySQL store as the Trio layer drives it: the shared
:class:`~streamd.eventlog.server_runner.ServerRunner`, for the reason the
PostgreSQL store uses it (:mod:`~streamd.eventlog.postgres.runner`): mysqlclient
is synchronous (it releases the GIL while it waits on the server), and the
asyncio-only drivers do not run under Trio."""

from __future__ import annotations

from streamd.eventlog.handoff import made_on_thread
from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore
from streamd.eventlog.server_runner import ServerRunner

__all__ = ["MysqlRunner"]


class MysqlRunner(ServerRunner):
    """A :class:`MysqlStore` opened for the Trio layer."""

    def __init__(self, store: MysqlStore) -> None:
        super().__init__(store, store.options.unresponsive_s, store.where)
        self._mysql = store

    @classmethod
    async def open(
        cls, url: str, options: MysqlOptions | None = None, *, migrate: bool = True,
        where: str = "a MySQL database",
    ) -> MysqlRunner:
        # A caller that leaves (a close, a Ctrl-C) does not wait for a server
        # that accepts and never answers: the connect's thread closes what it
        # makes (see :mod:`~streamd.eventlog.handoff`). ``where`` names the
        # database in its refusal, never with its password.
        store = await made_on_thread(
            lambda: MysqlStore.open(url, options, migrate=migrate), MysqlStore.close, where
        )
        return cls(store)

    @property
    def store(self) -> MysqlStore:
        return self._mysql
