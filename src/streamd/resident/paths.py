"""Where the resident daemon lives on disk, and the rules for its directory.

Standard library only: ``streamd attach`` imports this on every spawn.

* The socket directory is ``$STREAMD_RUNTIME_DIR`` when set (tests point it at a
  scratch directory), else ``$XDG_RUNTIME_DIR/streamd``, else
  ``$XDG_STATE_HOME/streamd/run`` (``~/.local/state/streamd/run``). It holds the
  socket (``streamd.sock``) and the lock file (``streamd.lock``).
* That directory must be private: a directory, not a symlink, owned by this
  uid, with no group or other permission bits. Whoever can write into it can
  replace the socket with one of their own and see every request, so the
  daemon refuses to serve from (and attach refuses to connect into) anything
  else, rather than repairing it.
* The daemon's log is ``$XDG_STATE_HOME/streamd/daemon.log``, beside the event
  log's default database.

Relative XDG values are ignored, as the XDG base directory spec says.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from streamd import regular_files

SOCKET_NAME = "streamd.sock"
LOCK_NAME = "streamd.lock"
LOG_NAME = "daemon.log"
# sun_path is 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH = 107


class UnsafeDirectory(Exception):
    """The socket directory exists but is not private to this user."""


def _xdg(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "")
    return value if value and os.path.isabs(value) else None


def state_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_STATE_HOME/streamd`` (``~/.local/state/streamd``)."""
    env = os.environ if env is None else env
    base = _xdg(env, "XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "streamd")


def runtime_dir(env: Mapping[str, str] | None = None) -> str:
    """The directory of the socket and the lock file (see the module docstring)."""
    env = os.environ if env is None else env
    override = env.get("STREAMD_RUNTIME_DIR")
    if override:
        return os.path.abspath(os.path.expanduser(override))
    xdg = _xdg(env, "XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "streamd")
    return os.path.join(state_dir(env), "run")


def socket_path(directory: str) -> str:
    return os.path.join(directory, SOCKET_NAME)


def lock_path(directory: str) -> str:
    return os.path.join(directory, LOCK_NAME)


def log_path(env: Mapping[str, str] | None = None) -> str:
    return os.path.join(state_dir(env), LOG_NAME)


class StrayFile(OSError):
    """A name of the directory (the lock file, the stop mark) holds something
    other than a regular file: a FIFO, a socket, a device, a directory."""


def open_regular(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` for the directory's own small files, refusing anything but
    a regular file with :class:`StrayFile`, without waiting
    (:mod:`streamd.regular_files`): a FIFO left in the lock file's place would
    otherwise block the read of every client that looks for the lock holder,
    with no timeout."""
    try:
        return regular_files.open_fd(path, flags, mode)
    except regular_files.NotRegularFile:
        raise StrayFile(f"{path} is not a regular file; remove it (streamd only ever "
                        "makes regular files there)") from None


def check_private_dir(directory: str) -> bool:
    """True if ``directory`` is private to this user, False if it does not exist;
    raises :class:`UnsafeDirectory` for anything else."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{directory} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        )
    if st.st_mode & 0o077:
        raise UnsafeDirectory(
            f"{directory} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700 "
            "(no group or other access)"
        )
    return True


def ensure_private_dir(directory: str) -> None:
    """Create ``directory`` with mode 0700 (its missing parents 0700 too, as the
    XDG spec asks of state directories) and check it as :func:`check_private_dir`
    does. An existing directory is never chmodded: refusing is safer than
    guessing why someone opened it up."""
    if check_private_dir(directory):
        return
    os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass  # someone else made it meanwhile: check theirs
    if not check_private_dir(directory):
        raise UnsafeDirectory(f"{directory} vanished while it was being created")


def check_socket_path(path: str) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UnsafeDirectory(
            f"socket path {path} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket "
            "address can hold; set STREAMD_RUNTIME_DIR to a shorter directory"
        )
