"""The in-process log's open file: one per event loop, file and options,
shared by the :class:`~streamd.client.local.LocalClient` objects opened on it.

A process often builds more than one session service on the same file: an
app that makes a service per request, a test fixture, a second agent. Each
used to open its own SQLite connection and worker thread, so that (a) two
services in one process fought over the file's write lock as two processes
do, each append of one waiting out the other's fsync in SQLite's busy
handler, and (b) every new service paid the file's open (SQLite's open, its
WAL index, the schema's parse: about half a millisecond on a 2 vCPU VM, most
of a small read's time). Shared, the clients of one loop queue on one
connection and one worker, as the daemon's callers do on its connection, and
a new client costs a look-up and a check of the file's identity.

What is shared is what belongs to the connection: the store, its worker
thread, the count of calls handed to the worker (nothing runs inline beside
them) and the inline gate. Each client keeps what is its own: being closed.
The file closes with its last client (or when the last is collected). A file
restored or deleted under the log is not shared again: the old connection
first empties its ``-wal`` into the old file (which a new opener of the path
would otherwise apply to the restored one), and the new client opens the
path anew (see :mod:`streamd.eventlog.sqlite.file_identity`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamd.errors import RpcError
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.sqlite.connection import prepare_file
from streamd.eventlog.sqlite.file_identity import DatabaseFile

__all__ = ["OpenLog", "open_log"]

Op = Callable[[SqliteStore], Any]


@dataclass(frozen=True, slots=True)
class _Key:
    path: str
    options: SqliteOptions


class OpenLog:
    """One open store, its worker thread and its inline gate, held by the
    clients of one event loop (see the module docstring)."""

    def __init__(
        self,
        store: SqliteStore,
        pool: concurrent.futures.ThreadPoolExecutor,
        loop: asyncio.AbstractEventLoop,
        key: _Key,
    ) -> None:
        self.store = store
        self._pool = pool
        self._key = key
        # Weakly: the registry is keyed by loop, weakly, and a log holding
        # its loop would keep the loop, and this file, for ever.
        self._loop = weakref.ref(loop)
        self.outstanding = 0
        """Calls handed to the worker and not finished there: nothing runs
        inline on the connection meanwhile."""
        self.inline_closed_until = {True: -math.inf, False: -math.inf}
        """By whether calls write: until when they go to the worker (a slow
        inline call closes the gate for a while)."""
        self.turned = time.monotonic()
        """When a caller last let the loop turn."""
        self._holders = 0  # clients holding the file open; under _registry_lock
        self._released = False  # the last let go: never held again

    def hold(self) -> bool:
        """One more client, unless the last has let go already. Under
        ``_registry_lock``."""
        if self._released:
            return False
        self._holders += 1
        return True

    def forget(self) -> None:
        """Shared no more: later opens of the path open it anew. Under
        ``_registry_lock``."""
        loop = self._loop()
        logs = None if loop is None else _registry.get(loop)
        if logs is not None and logs.get(self._key) is self:
            del logs[self._key]

    def submit(self, op: Op) -> concurrent.futures.Future[Any]:
        """``op`` on the worker, after what is queued there. Counted until the
        worker has finished it, not until its caller stops waiting: a
        cancelled caller's call may still be running."""
        self.outstanding += 1
        done = self._pool.submit(op, self.store)
        done.add_done_callback(self._finished_on_worker)
        return done

    def _finished_on_worker(self, _: concurrent.futures.Future[Any]) -> None:
        loop = self._loop()
        if loop is None:
            return  # the loop is gone, and its clients with it
        try:
            loop.call_soon_threadsafe(self._finished)
        except RuntimeError:
            pass  # the loop has closed: nothing runs on it any more

    def _finished(self) -> None:
        self.outstanding -= 1

    async def drained(self) -> None:
        """Once what is queued on the worker now has run."""
        if self.outstanding:
            await asyncio.shield(asyncio.wrap_future(self._pool.submit(_nothing)))

    def release(self) -> concurrent.futures.Future[None] | None:
        """One client lets go; with the last, the file closes on the worker
        after what it still runs (the returned future). Any thread, loop or
        none (a collected client's finalizer)."""
        with _registry_lock:
            self._holders -= 1
            if self._holders > 0:
                return None
            self._released = True
            self.forget()
        try:
            closing = self._pool.submit(self.store.close)
        except RuntimeError:
            # The interpreter is exiting: its threads have finished their
            # work and take no more, so nothing else uses the connection now.
            self.store.close()
            closing = None
        self._pool.shutdown(wait=False)
        return closing


def _nothing() -> None:
    pass


# The open logs by loop, then by file and options. A loop's entry goes with
# the loop; a log leaves it when its last client lets go. Reentrant: a
# collected client's finalizer may let go on a thread already inside.
_registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, OpenLog]] = (
    weakref.WeakKeyDictionary()
)
_registry_lock = threading.RLock()
# One open of a file at a time on a loop, so that two clients opening at once
# share one connection.
_opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _held(loop: asyncio.AbstractEventLoop, key: _Key) -> OpenLog | None:
    with _registry_lock:
        log = _registry.get(loop, {}).get(key)
        return log if log is not None and log.hold() else None


async def open_log(path: str, options: SqliteOptions) -> OpenLog:
    """The loop's open log of the SQLite file ``path`` (absolute, checked to
    be a file by the caller) with ``options``, held once more; opened if none
    is (created if new, its schema migrated)."""
    loop = asyncio.get_running_loop()
    key = _Key(path, options)
    with _registry_lock:
        opening = _opening.setdefault(loop, asyncio.Lock())
    async with opening:
        log = _held(loop, key)
        if log is not None:
            if log.store.file_unchanged():
                return log
            await _retire(log)
        log = await _open(path, options, loop, key)
        with _registry_lock:
            log.hold()
            _registry.setdefault(loop, {})[key] = log
        return log


async def _retire(log: OpenLog) -> None:
    """A log whose file has left the path: its connection empties its ``-wal``
    into the old file before the path is opened anew, and it is shared no
    more. Its clients keep it (their calls fail, naming the cause)."""
    try:
        await asyncio.wrap_future(log.submit(SqliteStore.check_file))
    except RpcError:
        pass  # the fault, as expected: its clients hear it at their next call
    with _registry_lock:
        log.forget()
    closing = log.release()  # the hold just taken
    if closing is not None:
        await asyncio.wrap_future(closing)


async def _open(
    path: str, options: SqliteOptions, loop: asyncio.AbstractEventLoop, key: _Key
) -> OpenLog:
    guard = DatabaseFile(path)
    prepare_file(Path(path), make_directory=False)
    # On the event loop, unless that would wait for another process's lock
    # or migrate the schema: then on the worker.
    store = SqliteStore.try_open_without_waiting(path, options, guard=guard)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="streamd-local")
    if store is None:
        opening = pool.submit(SqliteStore.open, path, options, guard=guard)
        try:
            store = await asyncio.wrap_future(opening)
        except BaseException:
            # Cancelled while the worker opens: close what it opens.
            opening.add_done_callback(_close_opened)
            pool.shutdown(wait=False)
            raise
    return OpenLog(store, pool, loop, key)


def _close_opened(opening: concurrent.futures.Future[SqliteStore]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
