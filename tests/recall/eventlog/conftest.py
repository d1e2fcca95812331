"""An event-log Recall source served in process: a daemon, its log, a peer."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import trio
import trio.testing
from support.recall import FAR, Peer, req

from streamd.daemon import Config, Daemon
from streamd.eventlog import EventLog
from streamd.eventlog.model import Event
from streamd.rpc import Server


@asynccontextmanager
async def served(db: Path, **config: Any):
    """Yields (peer, log): a ``streamd --eventlog`` connection, and the
    daemon's own event log at ``db``."""
    daemon = Daemon(Config(db=str(db), recall_source="eventlog", synchronous="NORMAL",
                           **config))
    async with daemon.running():
        log = await daemon.eventlog()
        await log.latest_seq()  # the database exists from here on
        client, server_end = trio.testing.memory_stream_pair()
        peer = Peer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Server(daemon.methods_for).serve, server_end, server_end)
            try:
                yield peer, log
            finally:
                await peer.close_input()


def init(location: str | Path, workdir: Path, id: Any = 1, **settings: Any) -> dict[str, Any]:
    return req(id, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
               workdir=str(workdir), source_id="log", location=str(location), settings=settings)


def search(id: Any, query: str, **extra: Any) -> dict[str, Any]:
    return req(id, "recall/search", query=query, filters=extra.pop("filters", {}),
               limit=extra.pop("limit", 10), deadline=FAR, **extra)


def expand(id: Any, locator: str, detail: str = "full", budget: int = 0) -> dict[str, Any]:
    return req(id, "recall/expand", locator=locator, detail=detail, budget_bytes=budget,
               deadline=FAR)


async def call(peer: Peer, frame: dict[str, Any]) -> dict[str, Any]:
    await peer.send(frame)
    answer = await peer.recv()
    assert answer is not None and answer["id"] == frame["id"], answer
    return answer


async def result(peer: Peer, frame: dict[str, Any]) -> dict[str, Any]:
    answer = await call(peer, frame)
    assert "result" in answer, answer
    return answer["result"]


def ids(found: dict[str, Any]) -> list[str]:
    return [c["source_record_id"] for c in found["candidates"]]


async def say(log: EventLog, event_id: str, content: Any, *, session: str = "s1",
              author: str = "user", app: str = "chat", user: str = "u1", branch: str = "",
              invocation: str = "", at: datetime | None = None) -> int:
    """Append one event; its seq."""
    appended = await log.append(app, user, session, Event(
        id=event_id, author=author, content=content, branch=branch, invocation_id=invocation,
        timestamp=at))
    return appended.seq
