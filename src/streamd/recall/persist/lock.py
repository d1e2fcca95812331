"""One writer per workdir, whichever processes meet on it.

Recall may run several commands on one source at once (concurrent ``recall
query``), so plain adapters and the resident daemon can share a workdir. A
build writes segments before the manifest that names them, and a save removes
whatever the manifest does not name, so two builds at once could delete each
other's sealed segments. The writer therefore holds an exclusive ``flock`` on
``<workdir>/streamd.lock`` from the start of a build to its last save; a
second process waits for it (and then reads what it published) instead.

``flock`` locks belong to the open file, so the kernel drops a lock the
moment its process dies, kill -9 included: a crashed writer never blocks the
next one.
"""

from __future__ import annotations

import fcntl
import os

LOCK_FILE = "streamd.lock"


class WorkdirLock:
    def __init__(self, workdir: str) -> None:
        self.path = os.path.join(workdir, LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never blocks. OSError if the
        workdir cannot hold a lock file (then nothing is written there either)."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock
