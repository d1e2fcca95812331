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
is known by its real path (symbolic links resolved); a file reached through
two hard links is two files here, as it is to SQLite, which does not support
it.

Every log of one file in the process, whatever its loop, has one guard
(:class:`~streamd.eventlog.sqlite.file_identity.DatabaseFile`): a restore
noticed on one loop stops the logs of the others at once, before they write
into the ``-wal`` the restored file's connection will use. A file restored or
deleted under the log is not shared again: the old connection first empties
its ``-wal`` into the old file (which a new opener of the path would
otherwise apply to the restored one), and only then is the path opened
anew, with a guard of its own; an open that finds the old ``-wal`` cannot be
emptied yet (another connection is reading it) is refused, saying so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamd import errors
from streamd.errors import RpcError
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.sqlite.connection import prepare_file
from streamd.eventlog.sqlite.file_identity import DatabaseFile, is_file_fault

__all__ = ["OLD_WAL_LEFT", "OpenLog", "open_log"]

Op = Callable[[SqliteStore], Any]

OLD_WAL_LEFT = "old_wal_left"
"""``data.reason`` of an open refused because a replaced file's old ``-wal``
is still at the path, not emptied yet."""


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
        guard: DatabaseFile,
    ) -> None:
        self.store = store
        self._pool = pool
        self._key = key
        self._guard = guard
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
        # Under _registry_lock: clients holding the file open, and the close
        # submitted once the last has let go (never held again after it).
        self._holders = 0
        self._closing: concurrent.futures.Future[None] | None = None

    @property
    def path(self) -> str:
        """The file's real path."""
        return self._key.path

    def hold(self) -> bool:
        """One more client, unless the last has let go already. Under
        ``_registry_lock``."""
        if self._closing is not None:
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
        if not self.outstanding:
            return
        with _registry_lock:
            # Under the lock: the last client's release shuts the pool down.
            after = self._closing or self._pool.submit(_nothing)
        await asyncio.shield(asyncio.wrap_future(after))

    def release(self) -> concurrent.futures.Future[None] | None:
        """One client lets go; with the last, the file closes on the worker
        after what it still runs (the returned future). Any thread, loop or
        none (a collected client's finalizer)."""
        with _registry_lock:
            self._holders -= 1
            if self._holders > 0:
                return None
            self.forget()
            _let_guard_go(self._key.path, self._guard)
            try:
                self._closing = self._pool.submit(self.store.close)
            except RuntimeError:
                # The interpreter is exiting (only this shuts the pool down,
                # after this submit): its threads take no more work, so
                # nothing else uses the connection now.
                self.store.close()
                self._closing = concurrent.futures.Future()
                self._closing.set_result(None)
            self._pool.shutdown(wait=False)
            return self._closing


def _nothing() -> None:
    pass


# The open logs by loop, then by file and options. A loop's entry goes with
# the loop; a log leaves it when its last client lets go. Reentrant: a
# collected client's finalizer may let go on a thread already inside.
_registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, OpenLog]] = (
    weakref.WeakKeyDictionary()
)
_registry_lock = threading.RLock()
# Each file's guard, shared by its open logs on every loop, with how many
# there are: a guard outlives no log (it holds the identities of files that
# SQLite deletes when the last connection closes).
_guards: dict[str, tuple[DatabaseFile, int]] = {}
# One open of a file (and options) at a time on a loop, so that clients
# opening together share one connection. An entry lives while opens use it:
# a lock keeps its loop, and a loop kept by its own entry would never go.
_opening: dict[tuple[asyncio.AbstractEventLoop, _Key], tuple[asyncio.Lock, int]] = {}


def _held(loop: asyncio.AbstractEventLoop, key: _Key) -> OpenLog | None:
    with _registry_lock:
        log = _registry.get(loop, {}).get(key)
        return log if log is not None and log.hold() else None


async def open_log(database: str | os.PathLike[str], options: SqliteOptions) -> OpenLog:
    """The loop's open log of the SQLite file ``database`` (checked to be a
    file, or absent, by the caller) with ``options``, held once more; opened
    if none is (created if new, its schema migrated)."""
    loop = asyncio.get_running_loop()
    key = _Key(os.path.realpath(database), options)
    with _registry_lock:
        lock, users = _opening.get((loop, key)) or (asyncio.Lock(), 0)
        _opening[(loop, key)] = (lock, users + 1)
    try:
        async with lock:
            log = _held(loop, key)
            if log is not None:
                ours, closing = False, None
                try:
                    ours = await _still_ours(log)
                finally:
                    if not ours:  # replaced, or the check failed: the hold just taken goes
                        closing = log.release()
                if ours:
                    return log
                if closing is not None:
                    await asyncio.shield(asyncio.wrap_future(closing))
            log = await _open(key, loop)
            with _registry_lock:
                log.hold()
                _registry.setdefault(loop, {})[key] = log
            return log
    finally:
        with _registry_lock:
            lock, users = _opening[(loop, key)]
            if users == 1:
                del _opening[(loop, key)]
            else:
                _opening[(loop, key)] = (lock, users - 1)


async def _still_ours(log: OpenLog) -> bool:
    """Whether ``log``'s file is still the one at its path; when not, the
    log is shared no more, after its connection has emptied its ``-wal``
    into the old file (raises ``source_unavailable`` if it cannot yet). Its
    clients keep it: their calls fail, naming the cause."""
    if log.store.file_unchanged():
        return True
    # The worker's check trips the guard (every log of the file stops) and
    # empties the old -wal; a change gone by now (renamed away and back)
    # leaves the log as it was, and still ours.
    try:
        await asyncio.wrap_future(log.submit(SqliteStore.check_file))
        return True
    except RpcError as exc:
        if not is_file_fault(exc):
            raise
    if log.store.old_wal_left:
        raise _old_wal_left(log.path)
    with _registry_lock:
        log.forget()
    return False


def _old_wal_left(path: str) -> RpcError:
    return RpcError(
        errors.SOURCE_UNAVAILABLE,
        f"{path} was replaced or deleted under a log this process has open, and that"
        " log's write-ahead log beside it is not emptied yet (another connection is"
        " reading it, or the log's other clients have not made a call or closed since):"
        " the file there is not opened until it is, which would apply the old log to"
        " it. Close the services still open on the old file and try again",
        {"reason": OLD_WAL_LEFT, "path": path},
    )


async def _open(key: _Key, loop: asyncio.AbstractEventLoop) -> OpenLog:
    path = key.path
    with _registry_lock:
        guard, logs = _guards.get(path) or (None, 0)
        if guard is not None and guard.old_wal_left:
            raise _old_wal_left(path)
        if guard is None or guard.error is not None:
            guard, logs = DatabaseFile(path), 0
        _guards[path] = (guard, logs + 1)  # counted now; let go if the open fails
    try:
        return await _open_store(key, loop, guard)
    except BaseException:
        _let_guard_go(path, guard)
        raise


def _let_guard_go(path: str, guard: DatabaseFile) -> None:
    """A log of ``guard`` has closed (or failed to open)."""
    with _registry_lock:
        held, logs = _guards.get(path) or (None, 0)
        if held is not guard:
            return  # replaced after it tripped: the entry is the new guard's
        if logs > 1:
            _guards[path] = (guard, logs - 1)
        else:
            del _guards[path]


async def _open_store(
    key: _Key, loop: asyncio.AbstractEventLoop, guard: DatabaseFile
) -> OpenLog:
    path, options = key.path, key.options
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
    return OpenLog(store, pool, loop, key, guard)


def _close_opened(opening: concurrent.futures.Future[SqliteStore]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()
