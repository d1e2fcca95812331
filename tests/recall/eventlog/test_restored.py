"""A log the resident daemon's source opened itself, restored under it."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing
from support.recall import FAR, Peer, req

from streamd.daemon import Config, Daemon
from streamd.eventlog import EventLog
from streamd.recall.sources import SourceRegistry
from streamd.rpc import Server

from .conftest import call, ids, init, result, say, search

Connect = Callable[[], Awaitable[Peer]]


@asynccontextmanager
async def resident(db: Path) -> AsyncIterator[tuple[Connect, SourceRegistry]]:
    """A daemon sharing its Recall sources between connections, as the
    resident daemon does; yields how to open one more connection to it."""
    async with SourceRegistry() as registry:
        daemon = Daemon(Config(db=str(db), recall_source="eventlog", synchronous="NORMAL"),
                        sources=registry)
        async with daemon.running(), trio.open_nursery() as nursery:
            peers: list[Peer] = []

            async def connect() -> Peer:
                client, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(Server(daemon.methods_for).serve, server_end, server_end)
                peers.append(Peer(client))
                return peers[-1]

            try:
                yield connect, registry
            finally:
                for peer in peers:
                    await peer.close_input()


async def test_a_log_restored_under_a_shared_source_is_served_at_the_next_handshake(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other.db"
    backup = tmp_path / "backup.db"
    async with EventLog(other, synchronous="NORMAL") as log:
        for i in range(3):
            await say(log, f"old{i}", f"drill {i}")
    shutil.copy(other, backup)  # closed: the copy is the whole log
    (tmp_path / "work").mkdir()
    async with EventLog(other, synchronous="NORMAL") as log:
        for i in range(3, 6):
            await say(log, f"old{i}", f"drill {i}")
    with trio.fail_after(30):
        async with resident(tmp_path / "events.db") as (connect, registry):
            first = await connect()
            await result(first, init(other, tmp_path / "work"))
            assert len(ids(await result(first, search(2, "drill")))) == 6
            await first.close_input()
            os.rename(backup, other)  # the restore operations.md describes
            # Recall's next command: a new connection, the same source.
            peer = await connect()
            await result(peer, init(other, tmp_path / "work"))
            found = await call(peer, search(2, "drill"))
            assert "result" in found, found
            assert sorted(ids(found["result"])) == ["old0", "old1", "old2"]
            health = await result(peer, req(3, "recall/health", deadline=FAR))
            assert health["status"] == "healthy", health
            # The old file's source is gone, not left to idle for ten minutes.
            assert registry.open_count == 1
