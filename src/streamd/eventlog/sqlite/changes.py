"""The database file may have changed: a wake for cross-process watchers.

:class:`FileChanges` returns from :meth:`~FileChanges.wait` when the database or
its WAL may have been written by anyone, learned from inotify on Linux and by
sleeping ``fallback_interval`` elsewhere. It knows nothing of SQLite's contents:
a wake is only a *maybe*.

The rules of a wake
-------------------
* **Missed wakes are not allowed, spurious ones are.** A write that happens after
  ``wait()`` returned makes a later ``wait()`` return: the kernel queues events
  from the moment ``inotify_add_watch`` returns, whether or not anyone is waiting,
  and one ``wait()`` drains everything queued into a single return.
* **The directory is watched, not the files.** SQLite creates, truncates and
  deletes ``<db>-wal`` as connections come and go, and a watch on a file dies
  with its inode; the directory's watch sees every incarnation. Events are kept
  only for the database's name and ``<db>-wal`` (:func:`wakes`). The path is
  resolved first, as SQLite resolves symlinks and keeps the WAL beside the target.
* **A commit becomes visible after its last write.** SQLite writes a commit's
  frames to the WAL, fsyncs them (``synchronous=FULL``), and only then publishes
  the commit in the wal-index header, in ``-shm`` through ``mmap``, which inotify
  cannot see. So the event arrives *before* the commit can be read: measured on
  ext4 with FULL, every one of 100 commits from another process was still
  invisible when its last event was read, and became visible 0.25 to 9 ms later.
  A wake on the event alone would read too early, find nothing, and then sleep
  until the next write. Hence **rechecks**: after a batch of events, ``wait()``
  also returns 1, 2, 4 ... ms later (each step at most ``fallback_interval``),
  until :data:`SETTLE_HORIZON` seconds have passed with no event
  (:class:`Rechecks`). A commit whose fsync outlasts the horizon is seen at the
  next write to the database.
* **When there is no notification, poll.** Not Linux, ``inotify_simple`` not
  installed (or its import failing for want of a descriptor), ``inotify_init``
  or ``inotify_add_watch`` failing (``EMFILE`` at the per-user instance limit,
  ``ENOSPC`` at ``fs.inotify.max_user_watches``, a missing directory), or
  ``STREAMD_NO_INOTIFY=1``: each ``wait()`` then sleeps ``fallback_interval``.
  Set the variable where inotify does not see writes made by other hosts, as
  on NFS, SMB or other network filesystems; it sees every local process's,
  across containers sharing the mount. A watch that the kernel drops (the
  directory deleted, its filesystem unmounted) turns into polling too.
  Which mode is used, and why for polling, is logged once at INFO.

For the log that wires it in
----------------------------
* **Confirm every wake.** Read ``PRAGMA data_version`` (and the newest seq) on
  the reader before waking watchers. A process's own writer causes wakes too
  (its commits write the same WAL, and ``data_version`` moves for them as seen
  from the reader), so compare the newest seq with what the writer has already
  fanned out (:meth:`~streamd.eventlog.fanout.Fanout.external`) and wake nobody
  for your own commits. A wake that a commit of your own writer covers (one
  begun after the wake, whose seq read inside its transaction shows any other
  process's commit to the fan-out) needs no read at all: under a steady writer
  that is every wake (:class:`~streamd.eventlog.watch_hub.WatchHub`).
* **Arm before the baseline.** Enter ``FileChanges`` *before* the first
  confirmation read: a commit between that read and ``add_watch`` would
  otherwise raise no event and go unseen. Entered first, such a commit queues
  an event and the next ``wait()`` returns at once.
* **One task waits at a time** (as on a socket: under inotify a second raises
  :class:`trio.BusyResourceError`).
* **What it costs and buys.** Measured on this machine (2 vCPU, ext4, FULL):
  another process's commit is read 0.9 ms (p50) and 4 ms (p99) after its commit
  returned, against 103 / 197 ms when polling every 200 ms. Each isolated
  foreign commit brings about six wakes in its first 50 ms and some thirty in
  all over the horizon; this process's own writer brings one to four wakes
  per commit (one per commit when it commits back to back), each a
  confirmation read, so keep that read cheap.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

import trio

if TYPE_CHECKING:
    from inotify_simple import INotify

__all__ = [
    "NO_INOTIFY_ENV",
    "SETTLE_HORIZON",
    "FileChanges",
    "Mode",
    "Rechecks",
    "Verdict",
    "judge",
    "wakes",
]

logger = logging.getLogger(__name__)

Mode = Literal["inotify", "poll"]

NO_INOTIFY_ENV = "STREAMD_NO_INOTIFY"

SETTLE_HORIZON = 5.0
"""Seconds after the last event during which ``wait()`` keeps rechecking for a
commit still being made visible: as long as the log's busy timeout, past which
a writer stuck in its fsync has stopped every other writer anyway."""
# Measured gaps from last event to visible: median 0.5 ms, 9 ms at most. Doubling
# from 1 ms sees a commit at most about one gap after it became visible, for
# about log2(gap / 1 ms) rechecks.
_FIRST_RECHECK = 0.001

# inotify(7) values, spelled here so the filter imports (and is tested) where
# inotify_simple does not.
IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

# IN_MODIFY: every WAL frame SQLite writes (pwrite), every truncation of the WAL,
# and checkpoints into the database file: each commit raises it.
# IN_MOVED_TO: a database replaced by rename (a restored backup) writes nothing
# under its name. IN_CREATE: a database or WAL linked into place likewise; rare.
# Not IN_CLOSE_WRITE: SQLite keeps its files open, so it comes only when a
# connection closes, after the IN_MODIFY of anything it wrote. Not IN_DELETE:
# SQLite deletes a WAL only once it is checkpointed, which raised IN_MODIFY.
WATCH_MASK = IN_MODIFY | IN_MOVED_TO | IN_CREATE
# IN_Q_OVERFLOW, IN_IGNORED and IN_UNMOUNT arrive whatever the mask.


class RawEvent(Protocol):
    """What :func:`judge` reads of an event (``inotify_simple.Event`` has it)."""

    @property
    def mask(self) -> int: ...
    @property
    def name(self) -> str: ...


def watched_names(db_name: str) -> frozenset[str]:
    """The names in the directory whose writes may be commits. Not ``-shm``: its
    changes are made through ``mmap`` and raise no event (its truncation when
    the first connection opens is not a commit)."""
    return frozenset((db_name, f"{db_name}-wal"))


def wakes(mask: int, name: str, names: frozenset[str]) -> bool:
    """Whether one event may mean a write to the database. An overflow lost
    events we cannot name, so it always counts."""
    if mask & IN_Q_OVERFLOW:
        return True
    return bool(mask & WATCH_MASK) and name in names


class Verdict(NamedTuple):
    wake: bool
    lost: bool
    """The kernel dropped the watch (directory deleted, filesystem unmounted):
    no event will ever come again."""


def judge(events: Iterable[RawEvent], names: frozenset[str]) -> Verdict:
    """One batch of events, as one answer: one wake per batch, however many
    writes it holds."""
    wake = lost = False
    for event in events:
        wake = wake or wakes(event.mask, event.name, names)
        lost = lost or bool(event.mask & (IN_IGNORED | IN_UNMOUNT))
    return Verdict(wake or lost, lost)


class Rechecks:
    """When to look again after a write was seen, for a commit that becomes
    visible after its last event (the module docstring says why). Times are any
    monotonic clock's seconds; :meth:`due` is ``inf`` when nothing is pending."""

    def __init__(self, *, first: float, cap: float, horizon: float) -> None:
        self._first = first
        self._cap = cap
        self._horizon = horizon
        self._last_write = -math.inf
        self._step = first
        self._due = math.inf

    def due(self) -> float:
        return self._due

    def saw_write(self, now: float) -> None:
        """A batch of events: start over, the newest write is the one to settle."""
        self._last_write = now
        self._step = self._first
        self._due = now + self._first

    def fired(self, now: float) -> None:
        """A recheck was handed out: the next one comes after twice the delay,
        unless the horizon has passed by then."""
        self._step = min(2 * self._step, self._cap)
        due = now + self._step
        self._due = due if due - self._last_write <= self._horizon else math.inf


def _disabled_by_env() -> bool:
    return os.environ.get(NO_INOTIFY_ENV, "").strip() not in ("", "0")


def _arm(directory: Path) -> tuple[INotify | None, str]:
    """An inotify instance watching ``directory``, or None and why not. Never
    leaves an fd open when it returns None."""
    if _disabled_by_env():
        return None, f"{NO_INOTIFY_ENV} is set"
    if sys.platform != "linux":
        return None, f"inotify exists only on Linux, not {sys.platform}"
    try:
        # Imported here: it costs 15 ms (ctypes.util) that only a watcher needs.
        import inotify_simple
    except (ImportError, OSError) as exc:
        # OSError: the import lists the directories of sys.path, which takes a
        # descriptor, so with every one taken (a flood of connections) it is
        # EMFILE. Raised on, it ended the watch hub's poller, the log, the daemon.
        return None, f"inotify_simple cannot be imported ({exc})"
    try:
        # Non-blocking: reads happen on the event loop's thread.
        ino = inotify_simple.INotify(nonblocking=True)
    except OSError as exc:
        return None, f"inotify_init failed ({exc}; fs.inotify.max_user_instances?)"
    try:
        ino.add_watch(directory, WATCH_MASK | IN_ONLYDIR)
    except OSError as exc:
        ino.close()
        return None, f"cannot watch {directory} ({exc}; fs.inotify.max_user_watches?)"
    except BaseException:
        ino.close()
        raise
    return ino, ""


_announced: set[str] = set()


def _announce(message: str) -> None:
    # Once per process: a log enters FileChanges each time its watches resume.
    if message not in _announced:
        _announced.add(message)
        logger.info("%s", message)


class FileChanges:
    """Wakes when the database or its WAL may have been written by anyone.

    ``async with FileChanges(path, fallback_interval=0.2) as changes:`` then
    ``await changes.wait()`` in a loop, confirming each wake. Single use; the
    inotify fd is closed on leaving the block, cancelled or not.
    """

    def __init__(self, db_path: Path, *, fallback_interval: float) -> None:
        if not fallback_interval > 0:
            raise ValueError("fallback_interval must be positive")
        real = Path(os.path.realpath(db_path))
        self._directory = real.parent
        self._names = watched_names(real.name)
        self._interval = fallback_interval
        self._rechecks = Rechecks(
            first=_FIRST_RECHECK, cap=fallback_interval, horizon=SETTLE_HORIZON
        )
        self._inotify: INotify | None = None  # open exactly while mode is "inotify"
        self._mode: Mode = "poll"
        self._reason = ""
        self._state: Literal["new", "open", "closed"] = "new"

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def reason(self) -> str:
        """Why it polls ("" under inotify), for diagnostics."""
        return self._reason

    async def __aenter__(self) -> FileChanges:
        if self._state != "new":
            raise RuntimeError("FileChanges can be entered once")
        # Before the fd exists, so a cancellation here cannot leak it.
        await trio.lowlevel.checkpoint()
        self._state = "open"
        self._inotify, self._reason = _arm(self._directory)
        if self._inotify is not None:
            self._mode = "inotify"
            _announce(f"watching {self._directory} with inotify for other processes' commits")
        else:
            self._poll_because(self._reason)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = "closed"
        self._close()

    def _close(self) -> None:
        ino, self._inotify = self._inotify, None
        if ino is not None:
            # Tells a task parked in wait_readable on it (another task's wait())
            # before the fd number can be reused.
            trio.lowlevel.notify_closing(ino.fileno())
            ino.close()

    def _poll_because(self, reason: str) -> None:
        self._close()
        self._mode = "poll"
        self._reason = reason
        _announce(
            f"polling {self._directory} every {self._interval:g} s for other processes'"
            f" commits: {reason}"
        )

    def expect_commit(self) -> None:
        """Recheck as after a write seen, from now: for a commit that may be
        under way without an event to come (one whose WAL write came before
        the watch was armed and whose fsync ends after it), so it is noticed
        once visible rather than at the caller's slow safety poll."""
        if self._inotify is not None:
            self._rechecks.saw_write(trio.current_time())

    async def wait(self) -> None:
        """Return when a write may have happened since the previous wait()
        returned (or since entry, for the first call), or when a write seen
        before may just have become readable. Spurious wakes are allowed;
        missed ones are not."""
        if self._state != "open":
            raise trio.ClosedResourceError("FileChanges is not entered")
        while True:
            ino = self._inotify
            if ino is None:
                await trio.sleep(self._interval)
                return
            with trio.move_on_at(self._rechecks.due()) as recheck:
                await trio.lowlevel.wait_readable(ino.fileno())
            if recheck.cancelled_caught:
                self._rechecks.fired(trio.current_time())
                return
            try:
                verdict = judge(ino.read(timeout=0), self._names)
            except BlockingIOError:
                continue  # readable, then drained by someone else: nothing to judge
            if verdict.lost:
                self._poll_because(f"the kernel dropped the watch on {self._directory}")
                return
            if verdict.wake:
                self._rechecks.saw_write(trio.current_time())
                return
