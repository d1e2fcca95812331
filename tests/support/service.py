"""An eventlog service served in process, and its calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from streamd.eventlog import EventLog
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Server
from support.rpc_client import Client


@dataclass
class Daemonish:
    """One shared EventLog and a way to open client connections to it."""

    log: EventLog
    nursery: trio.Nursery
    server: Server

    @classmethod
    def serving(cls, log: EventLog, nursery: trio.Nursery) -> Daemonish:
        """``log`` served as the daemon serves it, its connections in ``nursery``."""
        return cls(log, nursery, _server(lambda: log))

    async def connect(self) -> Client:
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.server.serve, server_end, server_end)
        return Client(client_end)


def _server(factory: Callable[[], Any]) -> Server:
    # Built once, as the daemon builds them: one table of who holds which lease.
    methods = {m.name: m for m in eventlog_methods(factory)}
    return Server(lambda conn: methods)


def event(event_id: str, content: Any = None, **kw: Any) -> dict[str, Any]:
    return {"id": event_id, "author": kw.pop("author", "agent"), "content": content, **kw}


def append(event_id: str, session: str = "s", **kw: Any) -> dict[str, Any]:
    metadata = kw.pop("metadata", None)
    params = {"app": "app", "user": "u", "session": session, "event": event(event_id, **kw)}
    if metadata is not None:
        params["metadata"] = metadata
    return params


# 1.4 MB of content: two entries fit the 4 MiB reply budget, three do not.
HEAVY = "x" * 1_400_000

