"""A daemon's claim on its socket directory: the lock, then the socket's name.

Standard library only, and that is the point of this module: ``streamd
daemon`` takes its claim before it imports Trio, numpy and the daemon (some
0.4 s of CPU). Clients racing to start the daemon each spawn one, and every
one of them but the winner exits as soon as it finds the lock taken; while
the lock was taken after those imports, each loser paid for them first. Fifty
``streamd attach`` spawned at once on two cores were fifty daemons importing
together, the winner among them: it served after 5 s, and the clients whose
start timeout ran out first failed. Taken first, a loser costs the
interpreter's start and the option parsing, and the winner's socket listens
from its first milliseconds (clients wait in its queue, bounded by their own
timeouts, until it serves).

The rules of the name:

* **The lock first.** The exclusive flock of :mod:`.lock` decides who
  serves; a second daemon fails at once (:class:`~.lock.AlreadyRunning`).
  Holding it, the claim may replace any socket file it finds (a daemon
  killed with -9 leaves one); anything else there is refused.
* **A stop since its spawn holds a daemon back** (:mod:`.stopmark`), checked
  once the lock is held.
* **Only our own socket file is removed**: the one whose device and inode we
  bound, so a name a successor took (after a retirement) stays its.
"""

from __future__ import annotations

import os
import socket
import stat

from streamd.resident import paths, stopmark
from streamd.resident.lock import InstanceLock

# The kernel's queue of connections not accepted yet: clients wait in it
# while the daemon that holds the name still starts.
BACKLOG = 128


class Claim:
    """The lock and the listening socket of one socket directory."""

    def __init__(self, runtime_dir: str) -> None:
        self.runtime_dir = runtime_dir
        self.socket_path = paths.socket_path(runtime_dir)
        self.lock = InstanceLock(paths.lock_path(runtime_dir))
        # Bound and listening until the server takes it (``listener``).
        self._sock: socket.socket | None = None
        self._bound: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file

    @property
    def bound(self) -> bool:
        """Whether a socket file of ours is (or was meant to be) in place."""
        return self._bound is not None

    def take(self) -> None:
        """Make (or check) the private directory, take the lock and bind the
        socket: everything that can refuse to start happens here. Raises
        :class:`~streamd.resident.paths.UnsafeDirectory`,
        :class:`~streamd.resident.lock.AlreadyRunning`,
        :class:`~streamd.resident.stopmark.StoppedSinceSpawn` (a client
        spawned it before the last stop) or OSError."""
        paths.check_socket_path(self.socket_path)
        paths.ensure_private_dir(self.runtime_dir)
        self.lock.acquire()
        if stopmark.stopped_since(self.runtime_dir, os.environ):
            self.lock.release()
            raise stopmark.StoppedSinceSpawn
        try:
            self._sock = self.bind()
        except BaseException:
            self.lock.release()
            raise

    def listener(self) -> socket.socket:
        """The bound, listening socket, handed over once to whoever serves it."""
        sock, self._sock = self._sock, None
        if sock is None:
            raise RuntimeError("take() the claim before serving it")
        return sock

    def bind(self) -> socket.socket:
        """Bind and listen on the socket's name, replacing a socket file left
        there (we hold the lock, so whoever bound it is gone). Raises
        :class:`~streamd.resident.paths.UnsafeDirectory` for anything else
        in its place, or OSError."""
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise paths.UnsafeDirectory(f"{self.socket_path} exists and is not a socket")
            os.unlink(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
            st = os.lstat(self.socket_path)
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        self._bound = (st.st_dev, st.st_ino)
        return sock

    def release(self) -> None:
        """Close a socket not handed over, remove our socket file (only if it
        still is ours) and drop the lock. Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        bound, self._bound = self._bound, None
        if bound is not None:
            try:
                st = os.lstat(self.socket_path)
                if (st.st_dev, st.st_ino) == bound:
                    os.unlink(self.socket_path)
            except OSError:
                pass
        self.lock.release()
