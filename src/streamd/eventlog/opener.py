"""Choosing the log's backend from its target, and opening it: the one place
above the backend folders that knows which exist.

An :class:`Opener` gives the :class:`~streamd.eventlog.log.EventLog` what it
needs of a backend and nothing more: a :class:`~streamd.eventlog.store.Runner`
for each role (the writer, which migrates, and the reader), the
:class:`~streamd.eventlog.store.ChangeSource` that hears other processes'
commits, and why the storage has stopped serving for good, if it has.
:func:`opener_for` picks one from the target
(:mod:`~streamd.eventlog.dbtarget` has read the string). The PostgreSQL and
MySQL backends are imported only when a log is in one: their drivers are
optional extras.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import trio

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import dbtarget
from streamd.eventlog.server_runner import ServerRunner
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.sqlite.changes import FileChanges
from streamd.eventlog.sqlite.connection import prepare_file
from streamd.eventlog.sqlite.file_identity import DatabaseFile
from streamd.eventlog.sqlite.runner import ConnectionRunner, ThreadRunner
from streamd.eventlog.store import ChangeSource, Role, Runner, closed_error
from streamd.eventlog.store.reconnecting import Backoff, newest_outage, reconnecting_s

if TYPE_CHECKING:
    from streamd.eventlog.postgres.store import PostgresOptions

__all__ = [
    "Dispatch", "MysqlOpener", "Opener", "PostgresOpener", "Role", "SqliteOpener", "opener_for",
]

Dispatch = Literal["worker", "thread", "inline"]
"""How SQLite's operations meet Trio: each connection's own worker thread with
an inline path for short calls (``worker``, see
:mod:`~streamd.eventlog.sqlite.runner`), ``trio.to_thread``, or inline on the
event loop (tests under a mock clock)."""

Poll = Callable[[], Awaitable[int]]
"""The newest seq, read on the log's reader: a change source that cannot
listen polls it."""


class Opener(Protocol):
    async def open(self, role: Role) -> Runner:
        """A new connection for ``role``; the writer's migrates the schema."""
        ...

    def changes(self, poll: Poll) -> AbstractAsyncContextManager[ChangeSource]:
        """How this backend hears other processes' commits."""
        ...

    @property
    def fault(self) -> str | None:
        """Why the storage is not serving: for good (a file deleted or
        replaced under the log), or for now (an attempt to connect to a server
        failed, and none has succeeded since; the next call tries again); None
        while it serves."""
        ...

    @property
    def connecting_s(self) -> float | None:
        """How long the oldest connect under way has run, None while none
        does: a server that accepts and never answers holds one, and every
        call waiting for it, with no fault yet to show (none has failed). A
        connection the log opens and one of its connections making itself
        again (reconnecting) alike, a watch's listening one included (which
        no call waits for: :attr:`calls_wait`)."""
        ...

    @property
    def calls_wait(self) -> bool:
        """Whether a connect under way is one the log's calls wait for (an
        open, or a connection making itself again); False while none is, or
        while the one under way is a watch's listening connection's alone,
        which holds no call: watches poll beside it."""
        ...

    @property
    def reconnecting_s(self) -> float | None:
        """How long the log's connections, made once and lost since (a server
        gone away, restarted or no longer answering), have been trying to
        reach their server again, None while they are not: through failed
        attempts and the waits between them, until one reaches it. A watch's
        listening connection (PostgreSQL's LISTEN) is one of them: while it
        is lost, watches hear other hosts' appends only by polling."""
        ...

    def abandon(self) -> None:
        """The log is closing: opens under way end at once with ``closed``,
        as every later one does, rather than wait out a connect (a server
        backend's: what such a connect makes is closed when it is made)."""
        ...


class Listening(Protocol):
    """A change source that keeps a connection of its own (PostgreSQL's
    LISTEN), whose attempts to make it are the log's to show."""

    @property
    def attempts(self) -> Backoff: ...


def opener_for(
    target: dbtarget.DbTarget, options: SqliteOptions, dispatch: Dispatch, watch_interval: float
) -> Opener:
    if target.kind == "postgres":
        return PostgresOpener(target, options, watch_interval)
    if target.kind == "mysql":
        return MysqlOpener(target, options, watch_interval)
    return SqliteOpener(target, options, dispatch, watch_interval)


class SqliteOpener:
    """A file's two connections, sharing one guard of its identity: what either
    finds (the file deleted or replaced) fails both."""

    def __init__(
        self,
        target: dbtarget.DbTarget,
        options: SqliteOptions,
        dispatch: Dispatch,
        watch_interval: float,
    ) -> None:
        assert target.path is not None
        self._target = target
        self._path = str(target.target)
        self._options = options
        self._dispatch = dispatch
        self._watch_interval = watch_interval
        self._guard: DatabaseFile | None = None

    @property
    def fault(self) -> str | None:
        return None if self._guard is None else self._guard.fault

    @property
    def connecting_s(self) -> float | None:
        return None  # a file has no server to wait for

    @property
    def calls_wait(self) -> bool:
        return False

    @property
    def reconnecting_s(self) -> float | None:
        return None

    def abandon(self) -> None:
        pass  # a file opens in its own time: the close waits for it

    async def open(self, role: Role) -> Runner:
        assert self._target.path is not None
        if self._guard is None:
            self._guard = DatabaseFile(self._path)
        guard, path, options = self._guard, self._path, self._options
        guard.before_open()  # before prepare_file, which would create a file
        if role == "writer":
            if (refused := self._target.file_error()) is not None:
                raise RpcError(SOURCE_UNAVAILABLE, refused)
            # Only the default location is made: a mistyped directory fails.
            prepare_file(self._target.path, make_directory=self._target.origin == "default")
        migrate = role == "writer"
        if self._dispatch == "worker":
            return await ConnectionRunner.open(path, options, guard=guard, role=role)
        if self._dispatch == "thread":
            store = await trio.to_thread.run_sync(
                lambda: SqliteStore.open(path, options, migrate=migrate, guard=guard)
            )
            return ThreadRunner(store)
        return SqliteStore.open(path, options, migrate=migrate, guard=guard)

    def changes(self, poll: Poll) -> AbstractAsyncContextManager[ChangeSource]:
        # The file source confirms its wakes itself (PRAGMA data_version).
        return FileChanges(Path(self._path), fallback_interval=self._watch_interval)


# After a failed connection to a server, how long calls fail at once before
# the next attempt: doubling from the first to the second.
_RETRY_MIN_S = 0.25
_RETRY_MAX_S = 5.0


class _ServerOpener:
    """What the server backends' openers share: a server that goes away comes
    back (no fault is for good), and the checks before a connection is made."""

    def __init__(
        self, target: dbtarget.DbTarget, options: SqliteOptions, watch_interval: float
    ) -> None:
        self._target = target
        self._synchronous = options.synchronous
        self._watch_interval = watch_interval
        # By role: the writer's connection can be made when the reader's is
        # refused (a full max_connections, say).
        self._backoff: dict[Role, Backoff] = {
            role: Backoff(_RETRY_MIN_S, _RETRY_MAX_S, clock=trio.current_time)
            for role in ("writer", "reader")}
        # The connections opened, whose stores reconnect on their own.
        self._opened: weakref.WeakSet[ServerRunner] = weakref.WeakSet()
        # The change sources that connect on their own (PostgreSQL's LISTEN).
        self._listeners: weakref.WeakSet[Listening] = weakref.WeakSet()
        # The opens under way, and when each began: abandon() cancels them,
        # and the oldest is how long calls have waited for a connection.
        self._connecting: dict[trio.CancelScope, float] = {}
        self._abandoned = False

    def _links(self) -> list[Backoff]:
        """The attempts of the connections that connect on their own: those
        it opened, which reconnect, and the listening ones of watches. A
        watch that cannot listen hears other hosts' appends only by polling:
        its outage is the log's to show, even while the others serve."""
        return [*(r.store.attempts for r in list(self._opened)),
                *(c.attempts for c in list(self._listeners))]

    def _reconnects(self) -> list[Backoff]:
        """The attempts of the connections that were made and are lost when
        they try again: those it opened (made by it, so their own attempts
        are all reconnects), and the listeners that listened once (a first
        one's attempts show in connecting_s alone)."""
        return [*(r.store.attempts for r in list(self._opened)),
                *(a for c in list(self._listeners) if (a := c.attempts).succeeded_at)]

    @property
    def fault(self) -> str | None:
        # The opener's attempts and those of the connections it made, which
        # reconnect on their own: all reach the same server.
        failure = newest_outage([*self._backoff.values(), *self._links()])
        if failure is None:
            return None
        return f"{failure} (tried again at the next call)"

    @property
    def connecting_s(self) -> float | None:
        opening = min(self._connecting.values(), default=None)
        waits = [s for a in self._links() if (s := a.attempt_s()) is not None]
        if opening is not None:
            waits.append(trio.current_time() - opening)
        return max(waits, default=None)

    @property
    def calls_wait(self) -> bool:
        return bool(self._connecting) or any(
            r.store.attempts.attempt_s() is not None for r in list(self._opened))

    @property
    def reconnecting_s(self) -> float | None:
        return reconnecting_s(self._reconnects(), [*self._backoff.values(), *self._links()])

    async def _connected(self, role: Role, connect: Callable[[], Awaitable[Runner]]) -> Runner:
        """A connection, by ``connect``; after one that failed, none is tried
        for a while (``_RETRY_MIN_S`` doubling to ``_RETRY_MAX_S``) and calls
        fail at once saying when the next attempt is: the calls queued behind
        an attempt that waits out a connect timeout (a server that accepts and
        never answers) each waited out one of their own. The failure is also
        the log's fault, for ``streamd status`` (the errors name the database,
        never its password)."""
        if self._abandoned:
            raise closed_error()
        # Any role's: the log needs both, and the writer's connection (and its
        # schema check) is not worth making while the reader's is refused.
        now = trio.current_time()
        failing = max(self._backoff.values(), key=lambda b: b.wait())
        wait = failing.wait()
        if wait > 0:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"{failing.error} (next connection attempt in {int(wait * 1000)} ms)",
                {"reason": "reconnecting"},
            )
        runner: Runner | None = None
        with trio.CancelScope() as scope:  # abandon() cancels it
            self._connecting[scope] = now
            try:
                runner = await connect()
            except RpcError as exc:
                self._backoff[role].failed(exc.message)
                raise
            finally:
                del self._connecting[scope]
        if runner is None:
            raise closed_error()
        self._backoff[role].succeeded()
        if isinstance(runner, ServerRunner):
            self._opened.add(runner)
        return runner

    def abandon(self) -> None:
        """Every open under way ends now with ``closed``, and every later
        one: a server that accepts and never answers held a close (a stop, a
        Ctrl-C) for the whole connect timeout, for ever with
        ``connect_timeout=0``. The connect goes on on its thread, which closes
        what it makes (see :mod:`~streamd.eventlog.handoff`)."""
        self._abandoned = True
        for scope in list(self._connecting):
            scope.cancel()

    def _url(self) -> str:
        """The address to connect with, once it may be: a password in a
        caller's argument (as often as not a command line's) is refused."""
        if self._target.origin == "argument" and self._target.secret_keys:
            raise RpcError(
                SOURCE_UNAVAILABLE, dbtarget.password_refused(self._target, "the database given")
            )
        return str(self._target.target)


def _missing_driver(server: str, driver: str, extra: str, exc: ImportError) -> RpcError:
    from streamd import DISTRIBUTION

    return RpcError(
        SOURCE_UNAVAILABLE,
        f"the event log is in {server}, which needs {driver} ({exc}):"
        f" pip install '{DISTRIBUTION}[{extra}]'",
    )


class PostgresOpener(_ServerOpener):
    """Connections to a PostgreSQL database (each on a worker thread of its own,
    see :mod:`~streamd.eventlog.postgres.runner` for why); the writer migrates."""

    def _options(self) -> PostgresOptions:
        """The options of the store and of its listener (the same schema, so
        the same channel)."""
        from streamd.eventlog.postgres.store import PostgresOptions

        return PostgresOptions(synchronous=self._synchronous)

    async def open(self, role: Role) -> Runner:
        try:
            from streamd.eventlog.postgres.runner import PostgresRunner
        except ImportError as exc:
            raise _missing_driver("PostgreSQL", "psycopg", "postgres", exc) from None
        return await self._connected(role, lambda: PostgresRunner.open(
            self._url(), self._options(), migrate=role == "writer",
            where=self._target.description))

    def changes(self, poll: Poll) -> AbstractAsyncContextManager[ChangeSource]:
        """LISTEN for every host's commits; while that connection is down, poll
        the newest seq on the reader (see :mod:`~streamd.eventlog.postgres.changes`)."""
        from streamd.eventlog.postgres.changes import PgChanges

        changes = PgChanges(
            str(self._target.target),
            fallback_interval=self._watch_interval,
            poll=poll,
            options=self._options(),
        )
        self._listeners.add(changes)  # its attempts are the log's to show
        return changes


class MysqlOpener(_ServerOpener):
    """Connections to a MySQL or MariaDB database, each on a worker thread of
    its own (as PostgreSQL's); the writer migrates. Other hosts' commits are
    heard by polling the newest seq (:mod:`~streamd.eventlog.mysql.changes`)."""

    async def open(self, role: Role) -> Runner:
        try:
            from streamd.eventlog.mysql.runner import MysqlRunner
            from streamd.eventlog.mysql.store import MysqlOptions
        except ImportError as exc:
            raise _missing_driver("MySQL", "mysqlclient", "mysql", exc) from None
        return await self._connected(role, lambda: MysqlRunner.open(
            self._url(), MysqlOptions(synchronous=self._synchronous), migrate=role == "writer",
            where=self._target.description,
        ))

    def changes(self, poll: Poll) -> AbstractAsyncContextManager[ChangeSource]:
        """A poll of the newest seq on the reader, from 2 ms after a change up
        to 50 ms (or the watch interval, when shorter) while idle."""
        from streamd.eventlog.mysql.changes import CEILING_S, FLOOR_S, PolledChanges

        ceiling = min(CEILING_S, self._watch_interval)
        return PolledChanges(poll, ceiling=ceiling, floor=min(FLOOR_S, ceiling))
