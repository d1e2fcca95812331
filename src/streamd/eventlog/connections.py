"""The log's connections: opened on first use, closed once, run one call at a time each.

An :class:`~streamd.eventlog.log.EventLog` creates nothing until its first
operation, and "not open yet" is answered here alone: :meth:`Connections.ensure_open`
opens the writer's and the reader's connection, once for every caller waiting
(a task of the log's, never left half done, that a caller cancelled leaves
behind: see :mod:`~streamd.eventlog.opening`), and tells the log once, so it
can start the jobs that need the writer. Every store operation then
runs through :meth:`Connections.read` or :meth:`Connections.write` inside a
cancel scope that close cancels: an operation in flight when the log closes
raises ``closed`` instead of finishing against a connection about to go.

A read its caller calls small (a few rows: a ping, a state, a session's
newest events) runs inline on the event loop thread when the reader's worker
is idle (see :mod:`~streamd.eventlog.sqlite.runner`): two thread wake-ups
cost more than such a read, and a cold session load is a few of them.

A read its caller calls a scan (its cost may grow with the log, not with its
answer: a ``since`` by an author no event has reads the whole table, some
0.2-0.4 s at a million events) runs on a third connection of its own, opened
the first time one is asked for. On the reader it held every other client's
reads for as long as it took: at a million events a ``branches`` call (then
4.6 s) kept a ping waiting 4.3 s. In its own lane a scan waits only for
other scans.

On a server backend the other reads share a few connections
(:mod:`~streamd.eventlog.reader_pool`): one slow for its answer alone (a
whole long session) held up every other client's reads, a ping among them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import trio

from streamd.errors import RpcError
from streamd.eventlog import inline
from streamd.eventlog.opening import Opens, Shared
from streamd.eventlog.reader_pool import ReaderPool
from streamd.eventlog.server_runner import ServerRunner
from streamd.eventlog.sqlite.runner import NOT_RUN, ConnectionRunner, InlineGate
from streamd.eventlog.store import Backend, Role, Runner, StoreCall, closed_error

__all__ = ["NOT_ENTERED", "Connections"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

NOT_ENTERED = "use the EventLog as `async with EventLog(...) as log:`"


class Connections:
    """The writer's and the reader's :class:`~streamd.eventlog.store.Runner`.

    ``open_backend`` opens one connection for a role; ``on_open`` is called once,
    with the log's nursery and the writer, after both opened; ``after_write``
    runs after every write (the WAL checkpoint policy: not only appends fill
    the WAL); ``abandon_opens`` makes the opens under way give up, for close
    (:meth:`~streamd.eventlog.opener.Opener.abandon`)."""

    def __init__(
        self,
        open_backend: Callable[[Role], Awaitable[Runner]],
        *,
        on_open: Callable[[trio.Nursery, Runner], None],
        after_write: Callable[[Runner], None],
        abandon_opens: Callable[[], None] = lambda: None,
    ) -> None:
        self._open_backend = open_backend
        self._on_open = on_open
        self._after_write = after_write
        self._abandon_opens = abandon_opens
        self._nursery: trio.Nursery | None = None
        self._opens = Opens()
        self._first = Shared(self._opens, self._open_first)
        self._scans = Shared(self._opens, self._open_scanner)
        self._writer: Runner | None = None
        self._reader: Runner | None = None
        self._scanner: Runner | None = None
        self._readers: ReaderPool | None = None
        """A server backend's reads (the reader and those opened beside it)."""
        self._closed = False
        self._scopes: set[trio.CancelScope] = set()
        self._inline_reads = InlineGate(inline.SLOW_READ_S, inline.BACKOFF_S)

    def serve_in(self, nursery: trio.Nursery | None) -> None:
        """The nursery the log's jobs run in (``None`` once it has ended)."""
        self._nursery = nursery

    @property
    def nursery(self) -> trio.Nursery:
        """The log's nursery; RuntimeError outside ``async with``."""
        if self._nursery is None:
            raise RuntimeError(NOT_ENTERED)
        return self._nursery

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def opened(self) -> bool:
        return self._writer is not None

    @property
    def writer(self) -> Runner | None:
        """The writer's runner once open (close releases leases on it)."""
        return self._writer

    def check_open(self) -> None:
        """``closed`` once the log closed; RuntimeError outside ``async with``."""
        if self._closed:
            raise closed_error()
        if self._nursery is None:
            raise RuntimeError(NOT_ENTERED)

    async def ensure_open(self) -> tuple[Runner, Runner]:
        """The writer's and the reader's runner, opened once for every caller
        waiting; one cancelled leaves at once, and the open goes on."""
        if self._closed:
            raise closed_error()
        if self._writer is not None and self._reader is not None:
            return self._writer, self._reader
        return await self._first.get(self.nursery)

    async def _open_first(self) -> tuple[Runner, Runner]:
        writer = await self._open_backend("writer")
        try:
            reader = await self._open_backend("reader")
        except BaseException:
            await writer.aclose()
            raise
        if self._closed:  # closed while they opened: nobody will use them
            await reader.aclose()
            await writer.aclose()
            raise closed_error()
        self._writer, self._reader = writer, reader
        if isinstance(reader, ServerRunner):
            self._readers = ReaderPool(reader, self._open_another_reader, spawn=self._spawn)
        self._on_open(self.nursery, writer)
        return writer, reader

    @property
    def reader(self) -> Runner | None:
        """The reader's runner once open."""
        return self._reader

    async def open_reader(self) -> StoreCall:
        """Where a watch reads its history, opened if need be: the reader, or a
        server backend's reader pool (on the first reader alone, the pool lent
        it, busy with a watch's page, to the next read: a ping waited for it)."""
        _, reader = await self.ensure_open()
        return self._readers.run if self._readers is not None else reader.run

    async def read(
        self, op: Callable[[Backend], _T], *, small: bool = False, scan: bool = False
    ) -> _T:
        """``op`` on the reader's connection. ``small``: the caller knows the
        answer is a few rows, so it may run inline; ``scan``: its cost may
        grow with the log, so it runs on the scans' own connection (see the
        module docstring)."""
        if scan:
            return await self._scan(op)
        reader = self._reader
        if small and isinstance(reader, ConnectionRunner) and not self._closed:
            done = self._inline_reads.attempt(reader, op)
            if done is not NOT_RUN:
                return done
        return await self._call("reader", op)

    async def _scan(self, op: Callable[[Backend], _T]) -> _T:
        if self._closed:
            raise closed_error()
        with self.cancelled_by_close():
            scanner = self._scanner
            if scanner is None:
                await self.ensure_open()
                scanner = await self._scans.get(self.nursery)
            return await scanner.run(op)
        raise closed_error()

    async def _open_scanner(self) -> Runner:
        """The scans' connection, opened once for every scan waiting."""
        runner = await self._open_backend("reader")
        if self._closed:
            await runner.aclose()
            raise closed_error()
        self._scanner = runner
        return runner

    async def _open_another_reader(self) -> ServerRunner:
        """One more reader beside the first (a server backend's, all busy),
        opened in a task :meth:`_spawn` started."""
        if self._closed:
            raise closed_error()
        runner = await self._open_backend("reader")
        if self._closed:
            await runner.aclose()
            raise closed_error()
        assert isinstance(runner, ServerRunner)  # the first reader's backend
        return runner

    def _spawn(self, open_: Callable[[], Awaitable[None]]) -> None:
        """Run an open as a task of the log's, which close waits for."""
        self._opens.start(self.nursery, open_)

    async def write(self, op: Callable[[Backend], _T]) -> _T:
        try:
            return await self._call("writer", op)
        finally:
            if self._writer is not None:
                self._after_write(self._writer)

    async def _call(self, role: Role, op: Callable[[Backend], _T]) -> _T:
        """Run one store operation; if close interrupts it, raise ``closed``."""
        if self._closed:
            raise closed_error()
        with self.cancelled_by_close():
            writer, reader = await self.ensure_open()
            if role == "writer":
                return await writer.run(op)
            if self._readers is not None:
                return await self._readers.run(op)
            return await reader.run(op)
        raise closed_error()

    @contextmanager
    def cancelled_by_close(self) -> Iterator[trio.CancelScope]:
        """A scope that close cancels (a wait that must not outlive the log)."""
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)

    def begin_close(self) -> None:
        """Refuse new calls, cancel those in flight, and make the opens under
        way give up (a connect to a server that does not answer is not waited
        for)."""
        self._closed = True
        for scope in list(self._scopes):
            scope.cancel()
        self._abandon_opens()

    async def opening_done(self) -> None:
        """Until the opens under way have ended, each closing what it opened
        (the log being closed)."""
        await self._opens.ended()

    def expect_close(self) -> float | None:
        """A close is coming: each connection counts its grace from now (see
        :meth:`~streamd.eventlog.store.Runner.expect_close`), so both share
        one deadline; the earliest (Trio's clock), or None when neither gives
        a grace."""
        deadlines: list[float] = []
        for runner in self._open_runners():
            if (deadline := runner.expect_close()) is not None:
                deadlines.append(deadline)
        return min(deadlines, default=None)

    def interrupt(self) -> None:
        """Interrupt whatever any connection is running now."""
        for runner in self._open_runners():
            runner.interrupt()

    async def aclose(self) -> None:
        """Abandon what a connection is still doing and close them all."""
        self.interrupt()
        for runner in self._open_runners():
            try:
                await runner.aclose()
            except RpcError as exc:
                logger.warning("closing event log connection: %s", exc)

    def _open_runners(self) -> list[Runner]:
        """The connections opened so far, the writer last (it closes last)."""
        readers = self._readers.runners if self._readers is not None else [self._reader]
        return [r for r in (self._scanner, *readers, self._writer) if r is not None]
