"""Where the differential test of the ADK service (tests/adk/test_against_in_memory.py)
keeps each example's log: a fresh SQLite file in this process, or a daemon of the
test's own."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient
from support.serve_socket import serving


class Log:
    """Where each example's service keeps its log; each example's names its own."""

    def prefix(self) -> str:
        return ""

    async def service(self, write_behind: bool) -> StreamdSessionService:
        raise NotImplementedError

    async def release(self, service: StreamdSessionService) -> None:
        await service.close()


class FileLog(Log):
    """A fresh SQLite file in this process for each example (``database=``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = itertools.count()

    async def service(self, write_behind: bool) -> StreamdSessionService:
        db = self.root / f"events-{next(self.count)}.db"
        return StreamdSessionService(database=db, synchronous="NORMAL", write_behind=write_behind)


class DaemonLog(Log):
    """One ``streamd serve --socket`` for the test, each example on apps and event
    ids of its own (event ids are the log's, across every session)."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.count = itertools.count()
        self.clients: dict[int, AsyncClient] = {}

    def prefix(self) -> str:
        return f"x{next(self.count)}-"

    async def service(self, write_behind: bool) -> StreamdSessionService:
        client = await AsyncClient.connect_socket(self.socket)
        service = StreamdSessionService(client, write_behind=write_behind)
        self.clients[id(service)] = client
        return service

    async def release(self, service: StreamdSessionService) -> None:
        try:
            await service.close()
        finally:
            await self.clients.pop(id(service)).aclose()


@contextlib.contextmanager
def daemon_log() -> Iterator[DaemonLog]:
    """A ``streamd serve --socket`` while the block runs (in a short path: a
    socket's is limited), and its examples' logs."""
    root = Path(tempfile.mkdtemp(prefix="sdo-", dir="/tmp"))
    try:
        sock = str(root / "s.sock")
        with serving(sock, root / "events.db", "--synchronous", "NORMAL"):
            yield DaemonLog(sock)
    finally:
        shutil.rmtree(root, ignore_errors=True)
