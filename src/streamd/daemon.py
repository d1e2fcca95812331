"""The daemon: which methods a connection gets, and the transports that carry them.

One process serves the Recall adapter methods and the event log methods on
every connection. The adapter is per connection (a Recall core spawns one
process per source); the event log is shared, opened lazily on the first
``eventlog/*`` call so a core that never calls one never creates a database.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .recall_service import RecallService
from .rpc import Connection, Method, MethodTable, Server
from .stdio import StdinStream, StdoutStream, claim_stdout

log = logging.getLogger("streamd")


@dataclass(slots=True)
class Config:
    db: str | None = None
    watch_interval: float = 0.2
    synchronous: str = "FULL"


class Daemon:
    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self._eventlog_methods: list[Method] | None = None

    def methods_for(self, conn: Connection) -> MethodTable:
        table = {m.name: m for m in RecallService(conn).methods()}
        for m in self._shared_methods(conn):
            table[m.name] = m
        return table

    def _shared_methods(self, conn: Connection) -> list[Method]:
        try:
            from .eventlog.service import eventlog_methods
        except ImportError:
            return []
        return eventlog_methods(self, conn)

    def server(self) -> Server:
        return Server(self.methods_for)


async def _until_signal(cancel: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s, exiting", signal.Signals(signum).name)
            cancel()
            return


async def serve_stdio(daemon: Daemon) -> None:
    frames = claim_stdout()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_signal, nursery.cancel_scope.cancel)
        await daemon.server().serve(StdinStream(0), StdoutStream(frames))
        nursery.cancel_scope.cancel()


def _prepare_socket_path(path: str) -> None:
    """Remove a stale socket file; refuse to clobber anything else or a live server."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"streamd: {path} exists and is not a socket")
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody is listening: a leftover from a crash
        return
    finally:
        probe.close()
    raise SystemExit(f"streamd: another server is listening on {path}")


async def serve_socket(daemon: Daemon, path: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    _prepare_socket_path(path)
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(128)
    listener = trio.SocketListener(sock)
    log.info("listening on %s", path)
    server = daemon.server()

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await server.serve(stream, stream)
        except trio.BrokenResourceError:
            pass

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_signal, nursery.cancel_scope.cancel)
            task_status.started(path)
            await trio.serve_listeners(handle, [listener])
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
