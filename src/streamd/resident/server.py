"""``streamd daemon``: the resident per-user daemon behind ``streamd attach``.

It serves what ``streamd serve --socket`` serves (the event log and the Recall
methods, every connection its own session) plus the control methods of
:mod:`.control`, on the per-user socket of :mod:`.paths`. The rules:

* **One per user (per socket directory).** The directory is created 0700 and
  refused if it is anyone else's or open to others. The daemon's
  :class:`~.claim.Claim` (the exclusive flock of :mod:`.lock`, then the
  socket), taken before the daemon's imports, makes a second daemon fail at
  once. It removes the socket only while the file is still the one it
  bound, and binds it again if the file vanishes while it serves (a cleaner
  of /tmp) and its lock file is still there.
* **Peers of this uid only.** Every accepted connection's SO_PEERCRED is read
  before a byte is: another uid is closed unanswered (and logged). The
  socket's 0600 mode already keeps others out; this holds even when someone
  loosened the modes.
* **A connection is a session.** ``recall/shutdown`` ends that connection (the
  RPC server answers it as the connection's last frame and closes); nothing a
  client sends on the Recall or event log methods stops the daemon. Only
  ``streamd/stop``, SIGTERM, SIGINT and the idle timer do, all by the same
  path: stop reading every connection, answer what is in flight, flush within
  ``SIGNAL_GRACE``, then close the sources and the event log.
* **Retire** hands the name over: the listener closes, the socket file and the
  lock are released before the answer goes out (so the client that asked can
  start a successor at once), and the daemon exits when its last connection
  ends.
* **Idle exit.** With no connection for ``idle_exit`` seconds the daemon stops
  (0: never). The Recall sources it shares (``SourceRegistry``) close on their
  own idle timer, which is shorter by default.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket as pysocket
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from streamd import __version__
from streamd.daemon import SIGNAL_GRACE, Daemon, RecallKind
from streamd.errors import INVALID_PARAMS, SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import dbtarget
from streamd.resident import paths, stopmark
from streamd.resident.dbmatch import db_mismatch
from streamd.rpc import Connection, Method, MethodTable, Request, Server
from streamd.rpc.accept import accept_forever

if TYPE_CHECKING:
    from streamd.recall.sources import SourceRegistry
    from streamd.resident.claim import Claim

log = logging.getLogger("streamd.resident")

DEFAULT_IDLE_EXIT = 900.0
# How often a serving daemon checks that its socket file is still there.
NAME_CHECK = 1.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(slots=True)
class ResidentOptions:
    runtime_dir: str
    log_file: str = ""  # shown by streamd/status; the CLI configures the logging itself
    idle_exit: float = DEFAULT_IDLE_EXIT  # seconds without a connection; 0: never
    version: str = __version__  # what hello and status announce


class HelloParams(msgspec.Struct):
    # Not forbid_unknown_fields: a newer client must always get an answer from
    # an older daemon, or it could not tell it to retire.
    client_version: str = ""
    cwd: str = ""  # the client's working directory: where its relative paths start
    db: str = ""  # the event log the client was told to use ("": whichever this serves)
    # What the client's recall/* methods index: "stream" (JSONL files, the
    # reference adapter) or "eventlog" (``streamd attach --eventlog``).
    recall_source: str = "stream"


class _Peer:
    """What one connection's client said of itself in its hello."""

    __slots__ = ("cwd", "recall_source")

    def __init__(self) -> None:
        self.cwd: str | None = None
        self.recall_source: RecallKind = "stream"


class NoParams(msgspec.Struct):
    pass


class Hello(msgspec.Struct):
    version: str
    pid: int
    started_at: str


class Status(msgspec.Struct):
    version: str
    pid: int
    uptime_s: float
    connections: int  # clients connected besides the one asking
    sources: int  # Recall sources open (shared across connections)
    socket: str
    db: str
    log: str
    db_fault: str | None = None  # why the event log stopped serving, if it did
    # How long a connect to the event log's server has been under way, if one
    # is (whether calls wait for it: db_calls_wait): a server that never
    # answers shows here before any fault does. A reconnect's too, and a
    # watch's listening connection's (PostgreSQL). Seconds, rounded to
    # milliseconds.
    db_connecting_s: float | None = None
    # Whether the event log's calls wait for that connect: false while the one
    # under way is a watch's listening connection's alone (watches poll).
    db_calls_wait: bool = False
    # How long the event log has been trying to reach its server again after
    # losing it, if it is: the outage so far, through failed attempts (the
    # newest one's error is db_fault) and the waits between them.
    db_reconnecting_s: float | None = None


class ResidentDaemon:
    """Owns the socket directory, the lock, the listener and the daemon's life."""

    def __init__(
        self, daemon: Daemon, options: ResidentOptions, claim: Claim,
        sources: SourceRegistry | None = None,
    ) -> None:
        """``claim``: taken (:meth:`Claim.take`) before the daemon's imports,
        so that a daemon losing a race to start costs little (:mod:`.claim`)."""
        self.daemon = daemon
        self.options = options
        self.sources = sources
        self.claim = claim
        self.socket_path = claim.socket_path
        self.server = Server(self._methods_for,
                             max_connections=daemon.config.max_connections,
                             max_held_bytes=daemon.config.max_held_bytes)
        self.connections = 0
        self.retired = False
        self.started_at = time.time()
        self._started = 0.0  # trio time
        self._changed = trio.Event()  # pulsed whenever connections or retired change
        self._stop = trio.Event()
        self._listening = trio.CancelScope()
        # The accept loops, one a bound socket (see ``_keep_name``); within ``_listening``.
        self._listeners: trio.Nursery | None = None

    # --- serving -------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until stopped, idle or retired and drained."""
        try:
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.claim.listener()))
            self._started = trio.current_time()
            log.info("streamd daemon %s started: pid %d, socket %s, idle exit %s",
                     self.options.version, os.getpid(), self.socket_path,
                     f"{self.options.idle_exit:g} s" if self.options.idle_exit else "never")
            sources = self.sources if self.sources is not None else contextlib.nullcontext()
            async with sources, self.daemon.running(), trio.open_nursery() as n:
                n.start_soon(self._stop_when_asked, n.cancel_scope)
                n.start_soon(self._watch_clients)
                n.start_soon(self._accept, listener, n)
                task_status.started(self.socket_path)
        finally:
            self.claim.release()
            log.info("streamd daemon exited")

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        with self._listening:
            async with trio.open_nursery() as listeners:
                self._listeners = listeners
                listeners.start_soon(self._accept_on, listener, nursery)
                listeners.start_soon(self._keep_name, nursery)

    async def _keep_name(self, nursery: trio.Nursery) -> None:
        """Bind the socket again if its file vanishes while we serve.

        A cleaner of /tmp (or a person) may delete it: then nobody can reach
        us, and the lock we hold keeps every daemon a client starts from
        serving, for as long as we run. Holding the lock, we own the name, so
        we take it back; unless the lock file went too (a daemon may then
        hold a new one, and the name is its), or another file is there."""
        while self.claim.bound and not self.retired:
            await trio.sleep(NAME_CHECK)
            if not self.claim.bound or self.retired or os.path.lexists(self.socket_path):
                continue
            if not self.claim.lock.still_named():
                log.warning("the socket file %s and the lock file are gone: not binding "
                            "again (a daemon started since may hold a new lock)",
                            self.socket_path)
                return
            log.warning("the socket file %s is gone: binding it again", self.socket_path)
            try:
                sock = self.claim.bind()
            except (OSError, paths.UnsafeDirectory) as exc:
                log.error("cannot bind %s again: %s", self.socket_path, exc)
                continue
            # The old listener stays open, unreachable, until we stop.
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            assert self._listeners is not None
            self._listeners.start_soon(self._accept_on, listener, nursery)

    async def _accept_on(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        await accept_forever(listener, self._handle, nursery)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            pid, uid = _peer(stream)
            if uid != os.geteuid():
                log.warning("refused a connection from uid %d (pid %d): not this user", uid, pid)
                return
            self.connections += 1
            self._pulse()
            try:
                await self.server.serve(stream, stream)
            except Exception as exc:
                # This connection ends; every other one is still served.
                if not _only_broken(exc):
                    log.exception("connection failed")
            finally:
                self.connections -= 1
                self._pulse()
        finally:
            await trio.aclose_forcefully(stream)

    def _methods_for(self, conn: Connection) -> MethodTable:
        peer = _Peer()
        async def hello(p: HelloParams, req: Request) -> Hello:
            return await self._hello(p, peer)

        control = {m.name: m for m in (
            Method("streamd/hello", HelloParams, hello),
            Method("streamd/status", NoParams, self._status),
            Method("streamd/stop", NoParams, self._stop_method),
            Method("streamd/retire", NoParams, self._retire),
        )}
        return self.daemon.methods_for(conn, lambda: peer.cwd, lambda: peer.recall_source,
                                       control=control)

    # --- control methods -----------------------------------------------------

    async def _hello(self, p: HelloParams, peer: _Peer) -> Hello:
        log.debug("hello from a client of version %s", p.client_version or "?")
        if p.cwd:
            if not os.path.isabs(p.cwd):
                raise RpcError(INVALID_PARAMS, "streamd/hello: cwd must be an absolute path")
            peer.cwd = p.cwd
        if p.recall_source not in ("stream", "eventlog"):
            raise RpcError(INVALID_PARAMS, "streamd/hello: recall_source is \"stream\" or "
                           f"\"eventlog\", not {p.recall_source!r}")
        peer.recall_source = "eventlog" if p.recall_source == "eventlog" else "stream"
        if p.db:
            mismatch = db_mismatch(self.daemon.config.db, p.db)
            if mismatch is not None:
                raise RpcError(SOURCE_UNAVAILABLE, mismatch)
        return Hello(self.options.version, os.getpid(), _rfc3339(self.started_at))

    async def _status(self, p: NoParams, req: Request) -> Status:
        return Status(
            version=self.options.version,
            pid=os.getpid(),
            uptime_s=round(trio.current_time() - self._started, 3),
            connections=max(self.connections - 1, 0),
            sources=self.sources.open_count if self.sources is not None else 0,
            socket=self.socket_path,
            db=dbtarget.describe(self.daemon.config.db),
            log=self.options.log_file,
            db_fault=self.daemon.eventlog_fault,
            db_connecting_s=_rounded(self.daemon.eventlog_connecting_s),
            db_calls_wait=self.daemon.eventlog_calls_wait,
            db_reconnecting_s=_rounded(self.daemon.eventlog_reconnecting_s),
        )

    async def _stop_method(self, p: NoParams, req: Request) -> dict[str, Any]:
        # The answer is queued before the wind-down stops this connection's
        # reader, and the writer flushes it before the connection closes.
        log.info("stopping: asked by streamd/stop")
        self._asked_to_stop()
        return {}

    async def _retire(self, p: NoParams, req: Request) -> dict[str, Any]:
        if not self.retired:
            log.info("retiring: no new connections; exiting after the %d open ones end",
                     self.connections)
            self.retired = True
            self._listening.cancel()
            self.claim.release()
            self._pulse()
        return {}

    # --- ending --------------------------------------------------------------

    def _asked_to_stop(self) -> None:
        """Stop, leaving the mark that keeps daemons spawned before now from
        serving once the lock is free (:mod:`.stopmark`): written before the
        wind-down, which ends with the lock released."""
        # A retired daemon no longer speaks for the directory: its successor,
        # spawned after the retirement, must start.
        if not self._stop.is_set() and not self.retired:
            try:
                stopmark.mark_stopped(self.options.runtime_dir)
            except OSError as exc:
                log.warning("could not leave the stop mark in %s: %s",
                            self.options.runtime_dir, exc.strerror or exc)
        self._stop.set()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _watch_clients(self) -> None:
        """Stop when retired and drained, or idle for ``idle_exit`` seconds."""
        idle = self.options.idle_exit
        while True:
            changed = self._changed
            if not self.connections:
                if self.retired:
                    log.info("retired and no connection left: exiting")
                    self._stop.set()
                    return
                if idle > 0:
                    with trio.move_on_after(idle):
                        await changed.wait()
                    if not changed.is_set():
                        log.info("no client for %g s: exiting", idle)
                        self._stop.set()
                        return
                    continue
            await changed.wait()

    async def _stop_when_asked(self, scope: trio.CancelScope) -> None:
        # The receiver stays open through the wind-down, so a second signal
        # cannot kill the process by its default action half way.
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with trio.open_nursery() as waiting:

                async def on_signal() -> None:
                    async for signum in signals:
                        log.info("received %s: stopping", signal.Signals(signum).name)
                        self._asked_to_stop()
                        return

                waiting.start_soon(on_signal)
                await self._stop.wait()
                waiting.cancel_scope.cancel()
            self._listening.cancel()
            self.daemon.stopping()
            self.server.stop()
            with trio.move_on_after(SIGNAL_GRACE):
                await self.server.wait_stopped()
        scope.cancel()


def _peer(stream: trio.SocketStream) -> tuple[int, int]:
    creds = stream.socket.getsockopt(
        pysocket.SOL_SOCKET, pysocket.SO_PEERCRED, struct.calcsize("3i")
    )
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _only_broken(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_broken(inner) for inner in exc.exceptions)
    return isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | OSError)


def _rfc3339(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
