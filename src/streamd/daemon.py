"""The daemon: which methods a connection gets, and the transports that carry them.

One process serves the Recall adapter methods and the event log methods on
every connection. The adapter is per connection (a Recall core spawns one
process per source). The event log is per process, and its lifetime follows
these rules:

* The daemon owns at most one :class:`EventLog`, shared by every connection (the
  stdio peer, every Unix-socket client), so one client's append wakes another
  client's watch at once and group commit batches appends across clients.
* It is created by the first ``eventlog/*`` call, not at start: a Recall core
  that never calls one never creates a database, and a bad event log option
  fails those calls (as ``source_unavailable``), never the Recall methods.
* It lives in the daemon's own nursery, opened by :meth:`Daemon.running`, which
  every serve function wraps around its connections. Leaving that block, by end
  of input, ``recall/shutdown``, SIGTERM/SIGINT or an error, closes the log after
  the connections are gone: appends in flight are answered, leases released,
  the WAL checkpointed, the worker threads joined. After that every eventlog
  call fails with ``closed``.

End of input on a connection (stdin's EOF, a socket client's half-close)
answers its event log requests still in flight, within the server's
``EOF_GRACE``, and cancels its Recall requests (see :mod:`streamd.rpc.server`).
A signal (SIGTERM, SIGINT) stops every connection at once (every request in
flight is cancelled, whatever its method, and still answered) and gives them
``SIGNAL_GRACE`` to flush; then whatever is left is cancelled, a write blocked
on a peer that never reads included, so the process exits in bounded time
whatever its peers do. One connection's failure ends that connection only.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import trio

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.lease_budget import DEFAULT_MAX_LEASES
from streamd.eventlog.model import DEFAULT_WATCH_BUFFER_BYTES, DEFAULT_WATCH_INTERVAL
from streamd.eventlog.watch_budget import DEFAULT_WATCH_TOTAL_BYTES
from streamd.recall.scanner import Offload, to_thread
from streamd.recall.service import RecallService
from streamd.recall.sources import SourceRegistry
from streamd.rpc import Connection, Method, MethodTable, Server
from streamd.rpc.accept import accept_forever
from streamd.rpc.held import DEFAULT_MAX_HELD_BYTES
from streamd.rpc.limit import MAX_CONNECTIONS
from streamd.rpc.stdio import StdinStream, StdoutStream, claim_stdout
from streamd.signals import cancel_on_signal

if TYPE_CHECKING:
    from streamd.eventlog import EventLog
    from streamd.eventlog.dbtarget import DbTarget
    from streamd.eventlog.requests import LogRequests
    from streamd.recall.eventlog.service import Hosting, LogRecallService

log = logging.getLogger("streamd")
EVENTLOG_PREFIX = "eventlog/"

# How long connections get after a signal to answer and flush before
# everything is cancelled. Closing the event log follows (it does not depend
# on any peer), all well inside the two seconds a supervisor may wait.
SIGNAL_GRACE = 1.0


RecallKind = Literal["stream", "eventlog"]


@dataclass(slots=True)
class Config:
    db: str | None = None  # None: $STREAMD_DB, else $XDG_STATE_HOME/streamd/events.db
    watch_interval: float = DEFAULT_WATCH_INTERVAL  # seconds between change polls without inotify
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    watch_buffer_bytes: int = DEFAULT_WATCH_BUFFER_BYTES  # what one stalled watch may hold
    # What all watches hold together; past it the one holding the most ends.
    watch_total_bytes: int = DEFAULT_WATCH_TOTAL_BYTES
    # What the recall/* methods index: JSONL streams (the reference adapter),
    # or an event log (``--eventlog``). A resident daemon serves each peer
    # what its hello asks.
    recall_source: RecallKind = "stream"
    # Connections served at once (see :mod:`streamd.rpc.limit`).
    max_connections: int = MAX_CONNECTIONS
    # Leases the event log holds at once (see :mod:`streamd.eventlog.lease_budget`).
    max_leases: int = DEFAULT_MAX_LEASES
    # What all connections hold together (see :mod:`streamd.rpc.held`).
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES


class Daemon:
    def __init__(
        self,
        config: Config | None = None,
        *,
        offload: Offload = to_thread,
        sources: SourceRegistry | None = None,
    ) -> None:
        """``sources``: share Recall sources across connections (the resident
        daemon); without it each connection has its own, as a process per
        source has."""
        self.config = config or Config()
        self.offload = offload
        self.sources = sources
        # Built on the first eventlog/* call (importing the event log costs a
        # cold Recall spawn ~30 ms it never needs), then once for good: one
        # lease table for every connection of this daemon.
        self._eventlog_methods: dict[str, Method] | None = None
        self._nursery: trio.Nursery | None = None
        self._stopped = False
        self._eventlog: EventLog | None = None
        self._opening: trio.Lock | None = None

    def methods_for(
        self,
        conn: Connection,
        client_dir: Callable[[], str | None] | None = None,
        recall_source: Callable[[], RecallKind] | None = None,
        control: Mapping[str, Method] | None = None,
    ) -> MethodTable:
        """``client_dir``: the peer's working directory, for its relative paths
        (see :class:`~streamd.recall.service.RecallService`); ``recall_source``:
        what its recall/* methods index, asked at each call (a resident peer
        says it in its hello), else the configured one; ``control``: methods
        of the transport's own (the resident daemon's ``streamd/*``)."""
        configured = self.config.recall_source
        kind = recall_source or (lambda: configured)
        tables: dict[RecallKind, dict[str, Method]] = {}

        def recall() -> dict[str, Method]:
            # Each kind's service is made on first use: a connection that
            # only appends never imports either.
            which = kind()
            if which not in tables:
                service: RecallService | LogRecallService
                if which == "eventlog":
                    from streamd.recall.eventlog.service import LogRecallService

                    service = LogRecallService(conn, self.log_for, offload=self.offload,
                                               sources=self.sources, client_dir=client_dir)
                else:
                    service = RecallService(conn, offload=self.offload, sources=self.sources,
                                            client_dir=client_dir)
                tables[which] = {m.name: m for m in service.methods()}
            return tables[which]

        # Made at the first recall/* call, not with the connection: a client of
        # the event log alone (an ADK service, a watcher) pays nothing for the
        # stream adapter, its scanner task or its cleanup, and its first
        # request is answered some 0.2 ms sooner.
        return _Methods(recall, self._eventlog_table, control or {})

    async def log_for(self, target: DbTarget) -> tuple[LogRequests, Hosting | None]:
        """The log an event-log Recall source reads: this daemon's own when the
        target is its database, else one of its own, hosted by the source,
        that runs no retention (a reader must never delete)."""
        from streamd.eventlog import EventLog, dbtarget
        from streamd.recall.eventlog.service import same_log

        try:
            own = dbtarget.resolve(self.config.db)
        except ValueError:
            own = None
        if own is not None and same_log(own, target):
            return (await self.eventlog()).requests, None
        cfg = self.config
        eventlog = EventLog(
            target.path if target.path is not None else target.conninfo,
            watch_interval=cfg.watch_interval,
            retention_interval=0,
        )
        return eventlog.requests, lambda: eventlog

    def _eventlog_table(self) -> dict[str, Method]:
        if self._eventlog_methods is None:
            from streamd.eventlog.service import eventlog_methods

            self._eventlog_methods = {m.name: m for m in eventlog_methods(self.eventlog)}
        return self._eventlog_methods

    def server(self) -> Server:
        return Server(self.methods_for, max_connections=self.config.max_connections,
                      max_held_bytes=self.config.max_held_bytes)

    @property
    def eventlog_opened(self) -> bool:
        """Whether an eventlog/* call has created the log (and so the database)."""
        return self._eventlog is not None and self._eventlog.opened

    @property
    def eventlog_fault(self) -> str | None:
        """Why the event log stopped serving (its file deleted or replaced
        under it), if it did; a restart is the recovery."""
        return None if self._eventlog is None else self._eventlog.fault

    @property
    def eventlog_connecting_s(self) -> float | None:
        """How long the event log has waited for a connect to its server, if
        one is under way (see :attr:`EventLog.connecting_s`)."""
        return None if self._eventlog is None else self._eventlog.connecting_s

    @property
    def eventlog_calls_wait(self) -> bool:
        """Whether the event log's calls wait for a connect under way (see
        :attr:`EventLog.calls_wait`)."""
        return self._eventlog is not None and self._eventlog.calls_wait

    @property
    def eventlog_reconnecting_s(self) -> float | None:
        """How long the event log has been trying to reach its server again,
        after losing it, if it is (see :attr:`EventLog.reconnecting_s`)."""
        return None if self._eventlog is None else self._eventlog.reconnecting_s

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Daemon]:
        """Host the shared event log for the duration of the block; close it on exit."""
        if self._nursery is not None or self._stopped:
            raise RuntimeError("a Daemon runs once")
        self._opening = trio.Lock()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield self
            finally:
                self._nursery = None
                self._stopped = True
                if self._eventlog is not None:
                    await self._eventlog.aclose()  # shielded inside
                nursery.cancel_scope.cancel()

    def stopping(self) -> None:
        """A stop began (a signal, ``streamd/stop``): the event log, closed once
        the connections have ended, gives a database server that does not
        answer one grace from now, shared by its connections, rather than a
        grace per busy connection after each was cancelled in turn."""
        if self._eventlog is not None:
            self._eventlog.expect_close()

    async def eventlog(self) -> EventLog:
        """The shared log, created on first use (the database opens on first call)."""
        from streamd.eventlog import EventLog, closed_error

        if self._stopped:
            raise closed_error()
        if self._eventlog is not None:
            return self._eventlog
        if self._nursery is None or self._opening is None:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                "the event log is served only while the daemon runs (Daemon.running)",
            )
        async with self._opening:
            if self._eventlog is None:
                if self._nursery is None:
                    raise closed_error()
                cfg = self.config
                try:
                    eventlog = EventLog(
                        cfg.db,
                        watch_interval=cfg.watch_interval,
                        synchronous=cfg.synchronous,
                        watch_buffer_bytes=cfg.watch_buffer_bytes,
                        watch_total_bytes=cfg.watch_total_bytes,
                        max_leases=cfg.max_leases,
                    )
                except ValueError as exc:
                    raise RpcError(SOURCE_UNAVAILABLE, f"event log configuration: {exc}") from exc
                await self._nursery.start(_host, eventlog)
                self._eventlog = eventlog
                log.info("event log at %s", eventlog.where)
        return self._eventlog


class _Methods(Mapping[str, Method]):
    """A connection's method table: its Recall methods, and the event log's,
    looked up (and so imported) only when a name under ``eventlog/`` is."""

    def __init__(self, recall: Callable[[], dict[str, Method]],
                 eventlog: Callable[[], dict[str, Method]], control: Mapping[str, Method]):
        self._recall = recall
        self._eventlog = eventlog
        self._control = control

    def __getitem__(self, name: str) -> Method:
        if name in self._control:
            return self._control[name]
        if name.startswith(EVENTLOG_PREFIX):
            return self._eventlog()[name]
        return self._recall()[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._control
        yield from self._recall()
        yield from self._eventlog()

    def __len__(self) -> int:
        return len(self._control) + len(self._recall()) + len(self._eventlog())


async def _host(eventlog: EventLog, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    # The log's writer, watchers and pollers are tasks of its own nursery,
    # which lives here, in the daemon's nursery, not in any connection's.
    async with eventlog:
        task_status.started()
        await trio.sleep_forever()


def _graceful(server: Server, daemon: Daemon) -> Callable[[], Awaitable[None]]:
    """What a signal does before it cancels everything: stop reading, answer
    what is in flight (-32007), and flush, within the grace period."""

    async def wind_down() -> None:
        daemon.stopping()
        server.stop()
        with trio.move_on_after(SIGNAL_GRACE):
            await server.wait_stopped()

    return wind_down


def _only_broken(exc: BaseException) -> bool:
    """A peer that hung up mid-write, possibly reported through nurseries."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_broken(inner) for inner in exc.exceptions)
    return isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | OSError)


async def serve_stdio(daemon: Daemon) -> None:
    frames = claim_stdout()
    server = daemon.server()
    # running() outermost: the log closes after the connection has ended.
    async with daemon.running(), trio.open_nursery() as nursery:
        nursery.start_soon(cancel_on_signal, nursery.cancel_scope, _graceful(server, daemon))
        await server.serve(StdinStream(0), StdoutStream(frames))
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
        except Exception as exc:
            # Every other client is still being served: this one's failure,
            # whatever it is, ends this connection and nothing else.
            if not _only_broken(exc):
                log.exception("connection failed")
        finally:
            await trio.aclose_forcefully(stream)

    try:
        # running() outermost: the log closes after every client has gone.
        async with daemon.running(), trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_signal, nursery.cancel_scope, _graceful(server, daemon))
            task_status.started(path)
            # Not trio.serve_listeners: it logs a traceback at every retry of
            # an accept short of descriptors, ten a second.
            await accept_forever(listener, handle, nursery)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
