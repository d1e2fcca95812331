"""When the event log copies its WAL into the database, and from which connection.

The writer's connection makes no checkpoints of its own (SQLite's automatic
one would run inside the commit that crossed the threshold, and that append's
caller would wait for the copy and its fsyncs; see :mod:`.runner`). Instead,
once the writer's WAL holds :data:`CHECKPOINT_PAGES`, one background task
copies the bulk from the reader's connection, beside the writes, then what
they added meanwhile (a few pages) on the writer itself, between two of its
transactions: SQLite starts the WAL over only at a write that finds all of it
copied, which a checkpoint racing the writes never leaves behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from streamd.errors import RpcError, is_closed
from streamd.eventlog.sqlite.runner import ConnectionRunner
from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store import Backend, Runner, StoreCall

__all__ = ["CHECKPOINT_PAGES", "Checkpoints"]

logger = logging.getLogger(__name__)

CHECKPOINT_PAGES = 1000
"""WAL pages after which the log checkpoints (SQLite's own default threshold)."""


def _checkpoint_passive(store: Backend) -> tuple[int, int]:
    # Only a ConnectionRunner's log gets here, and both its connections are SQLite.
    assert isinstance(store, SqliteStore)
    return store.checkpoint_passive()


class Checkpoints:
    """The checkpoint policy of one log: :meth:`due` after every write."""

    def __init__(
        self,
        *,
        read: StoreCall,
        write: StoreCall,
        nursery: Callable[[], trio.Nursery],
        closed: Callable[[], bool],
        counted: Callable[[], None],
    ) -> None:
        self._read = read
        self._write = write
        self._nursery = nursery
        self._closed = closed
        self._counted = counted
        self._running = False
        # One checkpoint at a time: the background one and a compaction's
        # truncating one would otherwise find each other busy.
        self._lock = trio.Lock()
        # The failure last logged: one that repeats (a log stopped under us
        # is retried after every write) is logged once, not once a write.
        self._failing = ""

    @property
    def running(self) -> bool:
        """Whether a checkpoint is in progress."""
        return self._running

    def due(self, writer: Runner) -> None:
        """Start a checkpoint if the writer's WAL has grown past the threshold
        and none is running (one at a time)."""
        if (
            isinstance(writer, ConnectionRunner)
            and writer.wal_pages >= CHECKPOINT_PAGES
            and not self._running
            and not self._closed()
        ):
            self._running = True
            self._nursery().start_soon(self._checkpoint)

    async def truncate(self) -> bool:
        """Copy the whole WAL and truncate it (what a compaction ends with, so
        the space it gave back shows), after a background checkpoint in
        progress; false if a reader kept it from finishing."""
        async with self._lock:
            return await self._write(lambda store: store.checkpoint())

    async def _checkpoint(self) -> None:
        try:
            async with self._lock:
                await self._read(_checkpoint_passive)
                await self._write(_checkpoint_passive)
            self._counted()
            self._failing = ""
        except RpcError as exc:
            if not is_closed(exc) and exc.message != self._failing:
                logger.warning("checkpointing the event log: %s", exc)
            self._failing = exc.message
        finally:
            self._running = False
