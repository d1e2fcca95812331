"""One resident daemon per socket directory: an exclusive flock on ``streamd.lock``.

The kernel releases a flock when its holder dies however it dies (kill -9
included), so a lock is never stale, and whoever holds it may treat any
socket file it finds as a leftover to replace. The lock file is never
removed: unlinking it while someone holds its inode would let a third
process lock a new file of the same name, and then two daemons would run.
It carries the holder's pid, for people and for ``streamd status``;
:func:`lock_holder` reads who holds it without taking it.

Standard library only.
"""

from __future__ import annotations

import fcntl
import os

from streamd.resident import paths


class AlreadyRunning(Exception):
    """Another daemon holds the lock."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        who = f" (pid {pid})" if pid is not None else ""
        super().__init__(f"another streamd daemon is already running{who}; it holds {path}")


class InstanceLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now or raise :class:`AlreadyRunning`; never waits.
        Raises :class:`~streamd.resident.paths.StrayFile` if the lock file's
        name holds anything but a regular file."""
        fd = paths.open_regular(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def still_named(self) -> bool:
        """Whether the lock file's path still names the file we hold locked
        (it was not deleted, nor replaced)."""
        if self._fd is None:
            return False
        try:
            ours, named = os.fstat(self._fd), os.lstat(self.path)
        except OSError:
            return False
        return (ours.st_dev, ours.st_ino) == (named.st_dev, named.st_ino)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # a reader must not take our pid for a live holder
        except OSError:
            pass
        os.close(fd)  # closing the only descriptor releases the flock


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --- who holds it, read without taking it ---------------------------------------


def lock_holder(directory: str, *, confirmed: bool = False) -> int | None:
    """The pid the lock file names, if that process holds the file's lock.
    Read only: taking the lock, even briefly, could make a daemon starting
    right then give up. The kernel's table of locks says who holds it; a pid
    merely alive could be another process's, given the number after the
    daemon was killed (kill -9 leaves its pid in the file). Where there is no
    table to ask (no /proc, or one of another pid namespace) a live pid is
    taken for the holder, unless ``confirmed`` is asked for: a pid about to be
    sent a signal must be the holder, never a stranger given its number."""
    try:
        fd = paths.open_regular(paths.lock_path(directory), os.O_RDONLY)
        try:
            inode = os.fstat(fd).st_ino
            pid = int(os.read(fd, 32).split()[0])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return None  # a FIFO there (StrayFile) included: nobody holds a lock on it
    if not _proc_is_ours():
        # A /proc of another pid namespace (a sandbox that made one without
        # mounting its own): its lock table and its /proc/PID number processes
        # as that namespace does, never matching the pid the daemon wrote.
        # The pid's life, asked of the kernel in our namespace, is all we know.
        return pid if not confirmed and _signalable(pid) else None
    held = flock_holders(inode)
    if held is None:  # no table to read (no /proc): the pid's life is all we know
        return pid if not confirmed and pid_alive(pid) else None
    return pid if pid in held else None


def _proc_is_ours() -> bool:
    """Whether ``/proc`` numbers processes as this process's pid namespace
    does (``/proc/self`` is named by its pid there); True without a /proc."""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False


def _signalable(pid: int) -> bool:
    """Whether ``pid`` is a process of this pid namespace (a zombie too)."""
    if pid <= 0:
        return False  # not one process: kill would ask about a group
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def flock_holders(inode: int) -> set[int] | None:
    """The pids holding a flock on a file of inode number ``inode``, from
    ``/proc/locks``; None when it cannot be read. Matched on the inode alone:
    the device number there is the superblock's, which ``stat`` does not
    always give (btrfs subvolumes, overlays); the caller also wants the pid
    its file names, which makes another file of the same number harmless."""
    try:
        with open("/proc/locks", "rb") as f:
            table = f.read()
    except OSError:
        return None
    holders: set[int] = set()
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:56789 0 EOF"; a waiter's line has "->".
        fields = line.split()
        if len(fields) < 6 or fields[1] != b"FLOCK":
            continue
        try:
            if int(fields[5].rsplit(b":", 1)[1]) == inode:
                holders.add(int(fields[4]))
        except (ValueError, IndexError):
            continue
    return holders


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``T`` stopped,
    ``Z`` zombie...), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None
