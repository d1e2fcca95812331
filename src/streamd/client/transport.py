"""Where a client's bytes go: the resident daemon's socket, any ``streamd serve
--socket``, or a ``streamd`` process spawned on stdio.

Blocking and standard-library only; the asyncio and Trio clients run these in a
thread. Finding and starting the resident daemon is
:func:`streamd.resident.attach.connect`'s job, reused as it is: the per-user
socket, the peer-uid check, ``streamd/hello``, retiring an older daemon, and
starting one (in a session of its own) when none answers.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

from streamd import errors
from streamd.errors import SOURCE_UNAVAILABLE, RpcError, invalid_params
from streamd.eventlog import dbtarget
from streamd.resident import attach, launch, paths
from streamd.resident.control import ControlError

__all__ = [
    "EXIT_GRACE", "START_TIMEOUT", "forked_error", "open_daemon_socket", "open_socket",
    "stdio_command",
]

START_TIMEOUT = attach.START_TIMEOUT
EXIT_GRACE = 10.0
"""How long closing a client waits for the ``streamd`` it spawned to exit once
its input has ended (it closes its log first), before it kills it: a child
that was stopped (SIGSTOP) or hangs would hold the close for ever. Killing it
loses nothing acknowledged: every answered append was committed."""


def forked_error(pid: int) -> RpcError:
    """The refusal of a client used in a process forked from the one that
    opened it (``pid``): the connection is the parent's, shared, and the
    child has neither its reader nor its event loop."""
    return RpcError(
        errors.CLOSED,
        f"this client's connection is its parent's (pid {pid}), which this process forked"
        " from: nothing was sent; open a client in this process",
        {"reason": errors.FORKED, "pid": pid},
    )


def open_daemon_socket(
    runtime_dir: str | None = None,
    *,
    start_daemon: bool = True,
    daemon_args: Sequence[str] = (),
    start_timeout: float = START_TIMEOUT,
) -> tuple[socket.socket, bytes]:
    """A blocking socket to the resident daemon (started with ``streamd daemon
    DAEMON_ARGS`` when none answers and ``start_daemon``), and the bytes read
    past its hello, within ``start_timeout`` (a daemon too busy to take the
    connection is waited for that long). ``daemon_args`` shape a daemon
    started here; one already running keeps its own, but refuses a client
    whose ``--db`` (or ``$STREAMD_DB``) names another event log. Relative
    paths mean what they mean here, in the arguments and in the Recall
    handshake alike."""
    args = checked_args(daemon_args)
    if runtime_dir:
        args = ["--runtime-dir", os.path.abspath(runtime_dir), *args]
    # Where a daemon started with them serves (daemon_args may say it too).
    directory = launch.runtime_dir_of(args, launch.caller_cwd()) or paths.runtime_dir()
    try:
        conn = attach.connect(directory, args, start_timeout, start=start_daemon)
    except (attach.AttachError, ControlError, paths.UnsafeDirectory) as exc:
        raise RpcError(SOURCE_UNAVAILABLE, f"cannot reach the streamd daemon: {exc}") from None
    except OSError as exc:
        raise RpcError(
            SOURCE_UNAVAILABLE, f"cannot reach the streamd daemon: {exc.strerror or exc}"
        ) from None
    conn.sock.settimeout(None)
    return conn.sock, conn.buffer


def open_socket(path: str) -> socket.socket:
    """A blocking socket to ``streamd serve --socket PATH`` (no hello: that
    server has no control methods)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise RpcError(
            SOURCE_UNAVAILABLE, f"cannot connect to {path}: {exc.strerror or exc}"
        ) from None
    return sock


def stdio_command(args: Sequence[str] = ()) -> list[str]:
    """The command of a ``streamd`` serving JSON-RPC on stdio with this
    interpreter (``args``: ``--db PATH`` and the other serve options). It reads
    until end of input and exits 0, closing the log cleanly."""
    return [sys.executable, "-m", "streamd", *checked_args(args)]


def checked_args(args: Sequence[str]) -> list[str]:
    """``args``, once every ``--db`` in them is one the daemon would take:
    checked here, before a process is started, because a password on its
    command line would show in ``ps`` (and the daemon's refusal would reach
    this client only as "it exited")."""
    if (refused := dbtarget.argv_error(args)) is not None:
        raise invalid_params(refused)
    return list(args)
