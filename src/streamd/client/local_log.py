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
is known by its real path (symbolic links resolved), and watched by the
path its first client gave; a file reached through two hard links is two
files here, as it is to SQLite, which does not support it.

A file deleted or replaced under the process (a restore) is the delicate
case: the old connections still hold the old ``-wal`` and ``-shm``, which
sit at the path beside the restored file, and a new connection there would
have SQLite apply the old ``-wal`` to the restored file, share that ``-wal``
with old connections still writing into it, or share the ``-shm`` with a
connection whose close drops its locks. So the logs of each file are known
across every loop, and the path is opened anew only once every old
connection has closed (each log's guard,
:class:`~streamd.eventlog.sqlite.file_identity.DatabaseFile`, trips and
empties the old ``-wal`` into the old file as it closes): an open waits for
closes under way, and is refused, saying what to do, while clients still
hold the old file (``old_file_open``) or while an old ``-wal`` that could not
be emptied is still at the path (``old_wal_left``). Each log has a guard of
its own, recorded at its open: a guard shared with a log that closes would
hold the identity of a ``-wal`` SQLite deletes at that close.

Every call into SQLite made here, on a worker or inline on a loop, passes
through one :class:`streamd.forks.Gate`: a fork waits until none is inside
SQLite. A child forked while a thread was inside held SQLite's own locks,
and its first open of any log waited for ever (21 of 300 children of a
process appending on a loop in a thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from streamd import errors, forks
from streamd.errors import RpcError
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.sqlite import errors as sqlite_errors
from streamd.eventlog.sqlite.connection import prepare_file
from streamd.eventlog.sqlite.file_identity import DatabaseFile, is_file_fault

__all__ = [
    "FORKED", "OLD_FILE_OPEN", "OLD_WAL_LEFT", "OpenLog", "forked_error", "open_log",
    "release_later",
]

logger = logging.getLogger(__name__)

Op = Callable[[SqliteStore], Any]
_R = TypeVar("_R")

OLD_FILE_OPEN = "old_file_open"
"""``data.reason`` of an open refused because the file was replaced while
clients in this process still hold the old one."""
OLD_WAL_LEFT = "old_wal_left"
"""``data.reason`` of an open refused because a replaced file's old ``-wal``,
not emptied, is still at the path."""
FORKED = errors.FORKED
"""``data.reason`` of the refusal of a file (or a log) that was open in this
process's parent when it forked."""


@dataclass(frozen=True, slots=True)
class _Key:
    path: str
    options: SqliteOptions


@dataclass(eq=False)
class _File:
    """One database file's logs in the process, on every loop. Under ``_lock``."""

    logs: set[OpenLog] = field(default_factory=set)
    """Open, or closing: a log leaves once its store has closed."""
    opening: set[DatabaseFile] = field(default_factory=set)
    """The guards of opens under way (an open cancelled while the worker
    opens stays here until the worker's connection has closed)."""
    stale: DatabaseFile | None = None
    """The guard of a closed log that left the old ``-wal`` of a replaced
    file at the path, not emptied."""
    stale_pin: int | None = None
    """A descriptor on that ``-wal``, so that its inode stays its own."""

    def closed(self, guard: DatabaseFile) -> None:
        """Under ``_lock``: a connection watched by ``guard`` has closed; if
        it left the old ``-wal`` of a replaced file at the path, opens are
        refused until that is gone."""
        if self.stale is None and guard.old_wal_at_path():
            self.stale, self.stale_pin = guard, guard.old_wal_pin()

    def unstale(self) -> None:
        """Under ``_lock``: the old ``-wal`` is gone; stop asking."""
        if self.stale_pin is not None:
            os.close(self.stale_pin)
        self.stale = self.stale_pin = None


class OpenLog:
    """One open store, its worker thread and its inline gate, held by the
    clients of one event loop (see the module docstring)."""

    def __init__(
        self,
        store: SqliteStore,
        pool: concurrent.futures.ThreadPoolExecutor,
        loop: asyncio.AbstractEventLoop,
        key: _Key,
        file: _File,
        guard: DatabaseFile,
    ) -> None:
        self.store = store
        self._pool = pool
        self._key = key
        self._file = file
        self.guard = guard
        """The log's own guard of its file."""
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
        # Under _lock: clients holding the file open, and the close submitted
        # once the last has let go (never held again after it).
        self._holders = 0
        self.closing: concurrent.futures.Future[None] | None = None
        self.inherited = False
        """Open in this process's parent when it forked: never used here (see
        :func:`_forget_after_fork`)."""

    @property
    def path(self) -> str:
        """The file's real path."""
        return self._key.path

    def hold(self) -> bool:
        """One more client, unless the last has let go already. Under ``_lock``."""
        if self.closing is not None:
            return False
        self._holders += 1
        return True

    def forget(self) -> None:
        """Shared no more on its loop: later opens there do not join it.
        Under ``_lock``."""
        loop = self._loop()
        logs = None if loop is None else _registry.get(loop)
        if logs is not None and logs.get(self._key) is self:
            del logs[self._key]

    def submit(self, op: Op) -> concurrent.futures.Future[Any]:
        """``op`` on the worker, after what is queued there. Counted until the
        worker has finished it, not until its caller stops waiting: a
        cancelled caller's call may still be running."""
        self.outstanding += 1
        done = self._pool.submit(_in_sqlite, op, self.store)
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
        """Once what is queued on the worker now (any client's) has run."""
        if not self.outstanding or self.inherited:
            return  # (the parent's worker did not come across the fork)
        with _lock:
            # Under the lock: the last client's release shuts the pool down.
            after = self.closing or self._pool.submit(_nothing)
        await asyncio.shield(asyncio.wrap_future(after))

    def release(self) -> concurrent.futures.Future[None] | None:
        """One client lets go; with the last, the file closes on the worker
        after what it still runs (the returned future). Any thread, loop or
        none; never from inside a collection (see :func:`release_later`)."""
        with _lock:
            self._holders -= 1
            if self._holders > 0:
                return None
            self.forget()
            if self.inherited:
                # The parent's: its worker did not come across the fork, and
                # nothing of it is used here (see _forget_after_fork).
                closing = self.closing = concurrent.futures.Future()
                closing.set_result(None)
                return closing
            try:
                closing = self._pool.submit(_in_sqlite, self.store.close)
            except RuntimeError:
                # The interpreter is exiting (only this shuts the pool down,
                # after this submit): its threads take no more work, so
                # nothing else uses the connection now.
                _in_sqlite(self.store.close)
                closing = concurrent.futures.Future()
                closing.set_result(None)
            self.closing = closing
            self._pool.shutdown(wait=False)
        closing.add_done_callback(self._closed)
        return closing

    def try_inline(self, op: Op) -> tuple[bool, Any]:
        """``store.try_without_waiting(op)``, on the calling thread."""
        return _in_sqlite(self.store.try_without_waiting, op)

    def _closed(self, _: concurrent.futures.Future[None]) -> None:
        file = self._file
        with _lock:
            file.logs.discard(self)
            file.closed(self.guard)
            _drop_if_unused(self._key.path, file)


def release_later(log: OpenLog) -> None:
    """:meth:`OpenLog.release` for a client collected unclosed. Dropped by
    its last reference (or at exit) it is released at once. Inside a
    collection, which may come at any allocation, even one made holding this
    module's lock, the worker pool's or threading's own (a release or a
    thread started there could deadlock), it is queued for a thread started
    beforehand, with the first log."""
    if _collecting:
        _releases.put(log)
    else:
        log.release()


_collecting = False


def _note_collection(phase: str, info: dict[str, int]) -> None:
    global _collecting
    _collecting = phase == "start"


gc.callbacks.append(_note_collection)
_releases: queue.SimpleQueue[OpenLog] = queue.SimpleQueue()
_releaser: threading.Thread | None = None


def _release_queued() -> None:
    while True:
        log = _releases.get()
        try:
            log.release()
        except Exception:  # the thread must go on for the next ones
            logger.exception("releasing a collected in-process client's log failed")


def _start_releaser() -> None:
    """The thread that releases collected clients' logs, started with the
    first log (never from a finalizer). Under ``_lock``."""
    global _releaser
    if _releaser is None or not _releaser.is_alive():
        _releaser = threading.Thread(target=_release_queued, name="streamd-release", daemon=True)
        _releaser.start()


def _nothing() -> None:
    pass


_sqlite = forks.Gate()


def _in_sqlite(call: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
    """``call(*args, **kwargs)``, a call into SQLite: a fork waits for it
    (see the module docstring)."""
    _sqlite.enter()
    try:
        return call(*args, **kwargs)
    finally:
        _sqlite.leave()


_lock = threading.Lock()
# The open logs by loop, then by file and options. A loop's entry goes with
# the loop; a log leaves it when its last client lets go.
_registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, OpenLog]] = (
    weakref.WeakKeyDictionary()
)
# Each file's logs on every loop, by real path. An entry goes with its last
# log's close, unless that left an old -wal at the path.
_files: dict[str, _File] = {}
# One open of a file (and options) at a time on a loop, so that clients
# opening together share one connection. An entry lives while opens use it:
# a lock keeps its loop, and a loop kept by its own entry would never go.
_opening: dict[tuple[asyncio.AbstractEventLoop, _Key], tuple[asyncio.Lock, int]] = {}


def _forget_after_fork() -> None:
    """In a forked child: the parent's logs are not the child's, and the
    files they had open are not the child's to use.

    SQLite connections must not cross a fork, and more than the connections
    came across: SQLite's own table of the process's open files, with the
    locks the parent held. A connection the child opened to such a file would
    believe it holds those locks without holding them, and write beside the
    parent (the file was corrupted so). So the parent's logs are marked
    inherited: their calls refused, their release a no-op (nothing handed to
    the parent's worker, which did not come across), and so are new opens of
    their files (:func:`forked_error`). Other files open as usual, with a lock
    and a releaser of the child's own; SQLite's own locks come across free,
    as the fork waited until no call of ours was inside SQLite (``_sqlite``)."""
    global _lock, _releases, _releaser
    inherited = [log for file in _files.values() for log in file.logs]
    _forked_paths.update(path for path, file in _files.items() if file.logs or file.opening)
    for log in inherited:
        log.inherited = True
    # A replaced file's old -wal left at its path is as much the child's
    # danger as the parent's: those refusals (old_wal_left) stay.
    stale = {path: file for path, file in _files.items()
             if file.stale is not None and path not in _forked_paths}
    _lock = threading.Lock()
    _releases, _releaser = queue.SimpleQueue(), None
    _registry.clear()
    _files.clear()
    _files.update(stale)
    _opening.clear()


def forked_error(path: str) -> RpcError:
    """The refusal of a log, or a file, that this process inherited open."""
    return RpcError(
        errors.SOURCE_UNAVAILABLE,
        f"{path} was open in this process's parent when it forked: SQLite's connections"
        " and locks do not survive a fork, and this process using that file could"
        " corrupt it. Close the services or clients on it before forking (then a child"
        " opens it as its own), or keep the log in a daemon",
        {"reason": FORKED, "path": path},
    )


# Files open in the parent when this process forked (by real path).
_forked_paths: set[str] = set()


os.register_at_fork(after_in_child=_forget_after_fork)


def _drop_if_unused(path: str, file: _File) -> None:
    """Under ``_lock``: forget ``file`` once nothing uses it, unless it must
    go on refusing opens (an old ``-wal`` left at the path)."""
    if file.logs or file.opening or _files.get(path) is not file:
        return
    if file.stale is None or not file.stale.old_wal_at_path():
        file.unstale()
        del _files[path]


def _held(loop: asyncio.AbstractEventLoop, key: _Key) -> OpenLog | None:
    with _lock:
        logs = _registry.get(loop)
        log = None if logs is None else logs.get(key)
        return log if log is not None and log.hold() else None


async def open_log(database: str | os.PathLike[str], options: SqliteOptions) -> OpenLog:
    """The loop's open log of the SQLite file ``database`` (checked to be a
    file, or absent, by the caller) with ``options``, held once more; opened
    if none is (created if new, its schema migrated)."""
    loop = asyncio.get_running_loop()
    key = _Key(os.path.realpath(database), options)
    with _lock:
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
            log = await _open(key, os.path.abspath(database), loop)
            with _lock:
                log.hold()
                _registry.setdefault(loop, {})[key] = log
            return log
    finally:
        with _lock:
            lock, users = _opening[(loop, key)]
            if users == 1:
                del _opening[(loop, key)]
            else:
                _opening[(loop, key)] = (lock, users - 1)


async def _still_ours(log: OpenLog) -> bool:
    """Whether ``log``'s file is still the one at its path; when not, the
    log is shared no more (its clients keep it: their calls fail, naming
    the cause)."""
    if log.store.file_unchanged():
        return True
    # The worker's check trips the guard and empties the old -wal; a change
    # gone by now (renamed away and back) leaves the log as it was, and
    # still ours.
    try:
        await asyncio.wrap_future(log.submit(SqliteStore.check_file))
        return True
    except RpcError as exc:
        if not is_file_fault(exc):
            raise
    with _lock:
        log.forget()
    return False


async def _open(key: _Key, given: str, loop: asyncio.AbstractEventLoop) -> OpenLog:
    """A new log of the file, beside its open logs on other loops or options,
    or once every log of a replaced file has closed (see the module
    docstring)."""
    path = key.path
    guard = DatabaseFile(given)
    while True:
        with _lock:
            _start_releaser()
            file, closing = _file_to_open(path)
            if not closing:
                file.opening.add(guard)
                break
        # The old file's last connections are closing: each empties the old
        # -wal as it closes, and then the path is free.
        await asyncio.gather(*(asyncio.shield(asyncio.wrap_future(c)) for c in closing))
    log = await _open_store(key, given, loop, file, guard)
    with _lock:
        file.opening.discard(guard)
        file.logs.add(log)
    return log


def _file_to_open(path: str) -> tuple[_File, list[concurrent.futures.Future[None]]]:
    """Under ``_lock``: the file entry a new log of ``path`` joins, or the
    closes to wait for first; raises what refuses the open."""
    if path in _forked_paths:
        raise forked_error(path)
    file = _files.get(path)
    if file is None:
        file = _files[path] = _File()
        return file, []
    # The connections the file has now: its logs' and the opens' under way.
    holding = [log.guard for log in file.logs if log.closing is None] + list(file.opening)
    if holding:
        try:
            if all(guard.unchanged() for guard in holding):
                return file, []
        except OSError as exc:  # the path cannot be looked up
            raise sqlite_errors.translate_os(exc) from exc
        raise _old_file_open(path, len(holding))
    closing = [log.closing for log in file.logs if log.closing is not None]
    if closing:
        # Closing with nothing live: SQLite may delete the -wal at the last
        # close, under a new connection's first look at it.
        return file, closing
    if file.stale is not None:
        if file.stale.old_wal_at_path():
            raise _old_wal_left(path)
        file.unstale()
    return file, []


def _old_file_open(path: str, held: int) -> RpcError:
    return RpcError(
        errors.SOURCE_UNAVAILABLE,
        f"{path} was replaced or deleted while this process had it open, and"
        f" {held} {'connection here still holds' if held == 1 else 'connections here still hold'}"
        " the old file (the calls of its clients answer database_file_replaced): the path is"
        " opened anew once they are closed. Close the services or clients still open"
        " on it, then open the log again",
        {"reason": OLD_FILE_OPEN, "path": path},
    )


def _old_wal_left(path: str) -> RpcError:
    return RpcError(
        errors.SOURCE_UNAVAILABLE,
        f"{path} was replaced or deleted while this process had it open, and the old"
        f" write-ahead log left at {path}-wal could not be emptied into the old file"
        " (another connection was reading it): opening the path would apply it to the"
        f" file there. If {path}-wal and {path}-shm are still the old ones, remove"
        " them, then open the log again",
        {"reason": OLD_WAL_LEFT, "path": path},
    )


async def _open_store(
    key: _Key, given: str, loop: asyncio.AbstractEventLoop, file: _File, guard: DatabaseFile
) -> OpenLog:
    """The new log's store and worker. If the open fails, its count in
    ``file`` goes: at once, or, for an open cancelled while the worker opens,
    once the worker's connection (it may open after all) has closed: till
    then it is a connection to the file, which a replaced file's new open
    must not go beside."""
    # Opened, and watched, by the path as given: the one a replacement
    # would be made at.
    path, options = given, key.options
    orphaned = False
    try:
        prepare_file(Path(path), make_directory=False)
        # On the event loop, unless that would wait for another process's
        # lock or migrate the schema: then on the worker.
        store = _in_sqlite(SqliteStore.try_open_without_waiting, path, options, guard=guard)
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="streamd-local")
        if store is None:
            opening = pool.submit(_in_sqlite, SqliteStore.open, path, options, guard=guard)
            try:
                store = await asyncio.wrap_future(opening)
            except BaseException:
                # Cancelled while the worker opens: close what it opens.
                orphaned = True
                opening.add_done_callback(
                    functools.partial(_close_orphan, key.path, file, guard)
                )
                pool.shutdown(wait=False)
                raise
        return OpenLog(store, pool, loop, key, file, guard)
    except BaseException:
        if not orphaned:
            _open_failed(key.path, file, guard)
        raise


def _open_failed(path: str, file: _File, guard: DatabaseFile) -> None:
    with _lock:
        file.opening.discard(guard)
        _drop_if_unused(path, file)


def _close_orphan(
    path: str,
    file: _File,
    guard: DatabaseFile,
    opening: concurrent.futures.Future[SqliteStore],
) -> None:
    try:
        if not opening.cancelled() and opening.exception() is None:
            _in_sqlite(opening.result().close)
    finally:
        with _lock:
            file.closed(guard)
        _open_failed(path, file, guard)
