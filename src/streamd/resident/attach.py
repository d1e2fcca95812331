"""``streamd attach``: the adapter protocol on stdio, relayed to the resident daemon.

A Recall core spawns its adapter afresh for every command and pays that
process's start-up each time; ``streamd serve`` pays 0.33 s of imports before it
can answer. This client imports only the standard library (never Trio, msgspec,
numpy or the daemon), so what a spawn costs is the interpreter starting plus a
round trip; the index, the event log and the builds stay warm in the daemon.

The rules it keeps, in order:

* **Find the daemon.** Connect to the per-user socket (:mod:`.paths`), check
  that the peer runs as this uid, and say ``streamd/hello`` (id
  ``streamd-attach-hello``; its answer is consumed, never relayed). A daemon
  OLDER than this client is asked to ``streamd/retire`` (it stops listening and
  lets go of its socket and lock at once, serves its current clients to their
  end, then exits) and a new one is started; a daemon as new or newer is used.
* **Start one when none answers.** ``sys.executable -m streamd daemon`` in a
  session (and so a process group) of its own, every descriptor closed, stdio
  on /dev/null, working directory ``/``: the Recall core signals this process's
  group on close and waits for this process's stdout to reach EOF, so the
  daemon must share neither. Then wait, bounded by ``START_TIMEOUT``, until the
  socket answers hello. Two clients racing to start one both spawn; the
  daemon's flock lets one serve, the other exits 1 at once, and both clients
  connect to the winner.
* **Relay byte for byte.** stdin -> socket in a thread, socket -> stdout in the
  main thread (which is where Python runs signal handlers, so a signal always
  interrupts whichever blocking call it is in). Only whole lines go to stdout:
  if the daemon dies mid-frame, the partial frame is dropped, never shown.
* **End the way the peer can tell.** stdin at EOF: half-close the socket
  (``SHUT_WR``) and keep relaying until the daemon closes; exit 0. The daemon
  closes after answering ``recall/shutdown`` (the last frame of that connection,
  and of that connection only: the daemon keeps running): exit 0, and stdout's
  EOF is how the core learns it. The daemon goes away otherwise (killed,
  stopped): nothing more is written, one line goes to stderr, exit 1.
  SIGTERM or SIGINT: exit 0 at once (the daemon sees the connection end as end
  of input and cancels that session's requests).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence

from streamd import __version__
from streamd.resident import paths
from streamd.resident.control import (
    ControlError,
    DaemonConnection,
    hello,
    pid_alive,
    version_key,
)

# How long a started daemon gets to answer before attach gives up. It needs
# about 0.4 s (imports, then the socket); the rest is room for a loaded machine.
START_TIMEOUT = 5.0
# How often the socket is tried while a daemon starts.
START_POLL = 0.01
READ_CHUNK = 1 << 16
# The method whose answer is a connection's last frame; seen in passing on the
# way in (the relay never parses frames), so that the daemon's close after it
# is known to be the end of the session rather than a failure.
_SHUTDOWN = b'"recall/shutdown"'

USAGE = f"""usage: streamd attach [--runtime-dir DIR] [--start-timeout S] [-- DAEMON-ARGS...]

Speak the adapter protocol on stdin/stdout and relay it to the resident
streamd daemon, starting one (`streamd daemon DAEMON-ARGS...`) when none
answers. Recall config: command = ".../streamd", args = ["attach"].

options:
  --runtime-dir DIR    the daemon's socket directory (default $STREAMD_RUNTIME_DIR,
                       else $XDG_RUNTIME_DIR/streamd, else $XDG_STATE_HOME/streamd/run)
  --start-timeout S    how long a daemon it starts gets to answer (default {START_TIMEOUT:g})
  -- DAEMON-ARGS...    options for a daemon it starts (see 'streamd daemon --help')
  -h, --help           show this help and exit"""


class AttachError(Exception):
    """A reason this client cannot serve, said in one line on stderr."""


def main(argv: Sequence[str]) -> int:
    _exit_on_signals()
    try:
        opts = _parse(argv)
    except AttachError as exc:
        print(f"streamd: {exc} (see 'streamd attach --help')", file=sys.stderr)
        return 2
    if opts is None:
        print(USAGE)
        return 0
    directory, timeout, daemon_args = opts
    if any(a == "--db" or a.startswith("--db=") for a in daemon_args):
        # Only then: attach imports nothing beyond the standard library.
        from streamd.eventlog.dbtarget import argv_error

        if (refused := argv_error(daemon_args)) is not None:
            print(f"streamd: {refused}", file=sys.stderr)
            return 2
    try:
        conn = connect(directory, daemon_args, timeout)
    except AttachError as exc:
        print(f"streamd attach: {exc}", file=sys.stderr)
        return 1
    return Relay(conn).run()


def _parse(argv: Sequence[str]) -> tuple[str, float, list[str]] | None:
    args = list(argv)
    directory = None
    timeout = START_TIMEOUT
    daemon_args: list[str] = []
    while args:
        arg = args.pop(0)
        if arg == "--":
            daemon_args = args
            break
        if arg in ("-h", "--help"):
            return None
        name, eq, value = arg.partition("=")
        if name not in ("--runtime-dir", "--start-timeout"):
            raise AttachError(f"unrecognized argument {arg!r}")
        if not eq:
            if not args:
                raise AttachError(f"{name} needs a value")
            value = args.pop(0)
        if name == "--runtime-dir":
            directory = os.path.abspath(value)
        else:
            try:
                timeout = float(value)
            except ValueError:
                timeout = -1.0
            if not 0 <= timeout < float("inf"):
                raise AttachError(f"--start-timeout must be a number of seconds, not {value!r}")
    if directory is not None:
        daemon_args = ["--runtime-dir", directory, *daemon_args]
    return directory or paths.runtime_dir(), timeout, daemon_args


def _exit_on_signals() -> None:
    def exit_now(signum: int, frame: object) -> None:
        # Nothing is buffered (stdout is written with os.write), so there is
        # nothing to flush; closing the socket ends the daemon's session.
        os._exit(0)

    signal.signal(signal.SIGTERM, exit_now)
    signal.signal(signal.SIGINT, exit_now)


# --- finding or starting the daemon -------------------------------------------


def _try_hello(sock_path: str) -> tuple[DaemonConnection, dict] | None:
    """A connection that has said hello, or None when nobody answers there."""
    try:
        conn = DaemonConnection.open(sock_path)
    except ControlError as exc:
        raise AttachError(str(exc)) from None
    except OSError as exc:
        raise AttachError(f"cannot connect to {sock_path}: {exc.strerror or exc}") from None
    if conn is None:
        return None
    try:
        return conn, hello(conn)
    except ControlError:
        # Closed or reset under us: a daemon retiring, dying, or still losing a
        # lock race. Treat it as nobody answering.
        conn.close()
        return None


def connect(directory: str, daemon_args: Sequence[str], timeout: float) -> DaemonConnection:
    sock_path = paths.socket_path(directory)
    try:
        paths.check_private_dir(directory)
        paths.check_socket_path(sock_path)
    except paths.UnsafeDirectory as exc:
        raise AttachError(str(exc)) from None
    found = _try_hello(sock_path)
    if found is not None:
        conn, info = found
        if version_key(info["version"]) >= version_key(__version__):
            conn.sock.settimeout(None)
            return conn
        # An older daemon: let it finish its clients while a new one serves.
        try:
            conn.call("streamd/retire", {}, "streamd-attach-retire")
        except ControlError:
            pass  # gone already, which is as good
        finally:
            conn.close()
    return _start(directory, sock_path, daemon_args, timeout)


def spawn_daemon(daemon_args: Sequence[str]) -> int:
    """Start ``streamd daemon`` outside this process's session and group, with no
    descriptor of ours; returns its pid."""
    import subprocess  # only here: most spawns find a daemon already

    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "daemon", *daemon_args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, start_new_session=True, cwd="/",
    )
    # Popen would warn at exit about a child still running; the daemon is meant
    # to outlive us (it is reparented to init when we exit).
    proc.returncode = 0
    return proc.pid


def _start(
    directory: str, sock_path: str, daemon_args: Sequence[str], timeout: float
) -> DaemonConnection:
    pid = spawn_daemon(daemon_args)
    deadline = time.monotonic() + timeout
    while True:
        found = _try_hello(sock_path)
        if found is not None:
            conn, _ = found
            _reap(pid)
            conn.sock.settimeout(None)
            return conn
        if time.monotonic() >= deadline:
            break
        time.sleep(START_POLL)
    _reap(pid)
    why = "it exited" if not pid_alive(pid) else "it still runs"
    raise AttachError(
        f"started a daemon (pid {pid}) but nothing answered on {sock_path} within "
        f"{timeout:g} s ({why}); see {paths.log_path()} or run `streamd daemon` to see why"
    )


def _reap(pid: int) -> None:
    # A daemon that lost the lock race exits at once; collect it so it does
    # not linger as a zombie for as long as this client relays.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# --- the relay ----------------------------------------------------------------


class Relay:
    def __init__(self, conn: DaemonConnection) -> None:
        self.sock = conn.sock
        self.first = conn.buffer  # read with the hello answer, not relayed yet
        self.pending = bytearray()  # the start of a frame whose newline is still to come
        self.stdin_closed = threading.Event()
        self.shutdown_sent = False

    def run(self) -> int:
        threading.Thread(target=self._pump_stdin, name="stdin", daemon=True).start()
        try:
            return self._pump_socket()
        finally:
            self.sock.close()

    def _pump_stdin(self) -> None:
        tail = b""
        while True:
            try:
                data = os.read(0, READ_CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            if not self.shutdown_sent:
                seen = tail + data
                self.shutdown_sent = _SHUTDOWN in seen
                tail = seen[-len(_SHUTDOWN):]
            try:
                self.sock.sendall(data)
            except OSError:
                return  # the daemon is gone; the socket side reports it
        # Only a real end of input: a daemon that vanished under a write must
        # not pass for a session the peer ended.
        self.stdin_closed.set()
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _pump_socket(self) -> int:
        died = None
        data = self.first
        while True:
            # Whole lines go out, the rest waits for its newline. Only the new
            # chunk is searched, and a frame of many chunks grows in place.
            cut = data.rfind(b"\n") + 1
            if cut:
                self.pending += data[:cut]
                if not _write_stdout(self.pending):
                    return 0  # nobody reads our stdout any more
                self.pending = bytearray(data[cut:])
            else:
                self.pending += data
            try:
                data = self.sock.recv(READ_CHUNK)
            except OSError as exc:
                died = exc.strerror or str(exc)
                break
            if not data:
                break
        if died is None and not self.pending and (
            self.stdin_closed.is_set() or self.shutdown_sent
        ):
            return 0
        if self.pending:
            why = "the daemon closed the connection in the middle of a frame"
        elif died is not None:
            why = f"the connection to the daemon broke ({died})"
        else:
            why = "the daemon closed the connection"
        print(f"streamd attach: {why}; the session is over", file=sys.stderr)
        return 1


def _write_stdout(data: bytes | bytearray) -> bool:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(1, view):]
    except OSError:
        return False
    return True
