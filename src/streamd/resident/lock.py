"""One resident daemon per socket directory: an exclusive flock on ``streamd.lock``.

The kernel releases a flock when its holder dies however it dies (kill -9
included), so a lock is never stale, and whoever holds it may treat any
socket file it finds as a leftover to replace. The lock file is never
removed: unlinking it while someone holds its inode would let a third
process lock a new file of the same name, and then two daemons would run.
It carries the holder's pid, for people and for ``streamd status``.

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
