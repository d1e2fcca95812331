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
from streamd.eventlog.store import Backend, Runner

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


class ReaderPool:
    """The reader's runner and the ones opened beside it when it was busy.

    Invariant: every runner is either lent to one read or in ``_idle``; the
    semaphore counts the reads in flight, so one is taken only when a runner
    is idle or fewer than ``size`` are open. An idle runner may still be
    busy: a read cancelled while the server did not answer returns at once,
    and its thread holds the connection until the driver gives up (a whole
    connect timeout); a read takes one that is not, or opens another while
    fewer than ``size`` are open, and waits for a busy one only then."""

    def __init__(
        self, first: Pooled, open_reader: Callable[[], Awaitable[Pooled]], size: int | None = None
    ) -> None:
        size = READERS if size is None else size
        if size < 1:
            raise ValueError("a reader pool holds one connection at least")
        self._size = size
        self._open_reader = open_reader
        self._all: list[Pooled] = [first]
        self._idle: list[Pooled] = [first]
        self._slots = trio.Semaphore(size)
        self._returned = trio.lowlevel.ParkingLot()  # reads waiting for a busy runner

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
        # The last returned that is free: warm, under light load.
        free = next((i for i in reversed(range(len(self._idle))) if not self._idle[i].busy), None)
        if free is not None:
            return self._idle.pop(free)
        if self._idle and len(self._all) >= self._size:
            return self._idle.pop()  # every connection is held: wait on one
        try:
            # Shielded: a connection half opened when its caller was cancelled
            # would be one nobody closes.
            with trio.CancelScope(shield=True):
                runner = await self._open_reader()
        except RpcError as exc:
            if is_closed(exc):
                raise
            logger.info("reading on the %d open connection(s): another was refused: %s",
                        len(self._all), exc)
            if self._idle:
                return self._idle.pop()  # one a cancelled call still holds: wait on it
            # Every runner is lent, so one comes back.
            while not self._idle:
                await self._returned.park()
            return self._idle.pop()
        self._all.append(runner)
        return runner
