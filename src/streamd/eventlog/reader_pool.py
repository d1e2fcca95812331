"""A server backend's reads: a few connections, each read on one that is free.

A PostgreSQL or MySQL connection runs one statement at a time, and the log
had one for every read that may not scan the log (the scans have a lane of
their own, :mod:`~streamd.eventlog.connections`). A read that takes long
for its answer alone (a whole long session, every session of a user, a page
of events for an index) held every other client's reads for as long as it
ran, a ping among them: a 1 s read made a ping of another client take 1 s.
The server runs statements of several connections at once, so reads take the
first free connection here, and one more is opened (up to :data:`READERS`)
only when every one is busy: an idle daemon keeps the one it had, and a
slow read holds up only what comes after :data:`READERS` of them. A server
that refuses one more (at its own connection limit, or restarting) costs the
read nothing but the wait it had with one reader: it waits for a busy one.

Nor does a server that accepts one more and never answers it: the read that
asked for it waited out the connect (for ever with ``connect_timeout=0``)
while the slow read ended and gave its connection back, and the reads behind
it waited too. A connection is opened in a task of its own (the log's, which
its close waits for and makes give up), and a read takes whichever comes
first: a connection given back, or the one opened.

SQLite keeps its one reader: its small reads run inline on the event loop
when it is idle (:mod:`~streamd.eventlog.sqlite.runner`), and its file is
read by one process's connections through one page cache anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio

from streamd.errors import RpcError, is_closed
from streamd.eventlog.store import Backend, Runner, closed_error

__all__ = ["READERS", "ReaderPool"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

READERS = 4
"""Connections one log reads through at most: a slow read and a few small ones
at once, while a daemon's connections stay a handful (the writer, the scans'
lane and, on PostgreSQL, the listener besides) of a server's hundred or so."""


class Pooled(Runner, Protocol):
    """A connection the pool lends (a :class:`~streamd.eventlog.server_runner.ServerRunner`)."""

    @property
    def busy(self) -> bool:
        """Whether a call still holds it (one its caller left, say)."""
        ...

    def on_free(self, wake: Callable[[], object]) -> None:
        """Have ``wake`` called (on the Trio thread) each time a call gives
        it back, one its caller left among them."""
        ...


class ReaderPool:
    """The reader's runner and the ones opened beside it when it was busy.

    Invariant: every runner is either lent to one read or in ``_idle``; the
    semaphore counts the reads in flight, so one is taken only when a runner
    is idle or fewer than ``size`` are open. An idle runner may still be
    busy: a read cancelled while the server did not answer returns at once,
    and its thread holds the connection until the driver gives up (a whole
    connect timeout); a read takes one that is not, or has another opened
    while fewer than ``size`` are open (one open at a time, by ``spawn``:
    a task of the log's), and waits for a busy one only when none opens.

    ``open_reader`` raises RpcError when refused (``closed``: the log is
    closing, and so are the reads waiting)."""

    def __init__(
        self,
        first: Pooled,
        open_reader: Callable[[], Awaitable[Pooled]],
        *,
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
        size: int | None = None,
    ) -> None:
        size = READERS if size is None else size
        if size < 1:
            raise ValueError("a reader pool holds one connection at least")
        self._size = size
        self._open_reader = open_reader
        self._spawn = spawn
        self._all: list[Pooled] = [first]
        self._idle: list[Pooled] = [first]
        self._slots = trio.Semaphore(size)
        # Reads waiting for a runner given back, come free or opened, or for
        # the open's end.
        self._returned = trio.lowlevel.ParkingLot()
        first.on_free(self._returned.unpark_all)
        self._opening = False
        self._closed = False

    @property
    def runners(self) -> list[Pooled]:
        """Every connection opened so far, the first one first."""
        return list(self._all)

    async def run(self, op: Callable[[Backend], _T]) -> _T:
        """``op`` on a free connection; the next one opened if none is."""
        async with self._slots:
            runner = await self._take()
            try:
                return await runner.run(op)
            finally:
                self._idle.append(runner)
                self._returned.unpark()

    async def _take(self) -> Pooled:
        asked = False  # for another connection: once a read, not again when refused
        while True:
            if self._closed:
                raise closed_error()
            # The last returned that is free: warm, under light load.
            free = next(
                (i for i in reversed(range(len(self._idle))) if not self._idle[i].busy), None)
            if free is not None:
                return self._idle.pop(free)
            if not asked and not self._opening and len(self._all) < self._size:
                asked = self._opening = True
                self._spawn(self._open_another)
            if self._idle and not self._opening:
                # Held by a cancelled call's thread, and no other to come:
                # wait on one, for as long as that thread runs.
                return self._idle.pop()
            # A runner given back or come free, or the open's end.
            await self._returned.park()

    async def _open_another(self) -> None:
        """One more connection, kept for the reads to come, or refused."""
        try:
            runner = await self._open_reader()
        except RpcError as exc:
            if is_closed(exc):
                self._closed = True
            else:
                logger.info("reading on the %d open connection(s): another was refused: %s",
                            len(self._all), exc)
        else:
            runner.on_free(self._returned.unpark_all)
            self._all.append(runner)
            self._idle.append(runner)
        finally:
            self._opening = False
            self._returned.unpark_all()
