"""``streamd attach``: the adapter protocol on stdio, relayed to the resident daemon.

A Recall core spawns its adapter afresh for every command and pays that
process's start-up each time; ``streamd serve`` pays 0.33 s of imports before it
can answer. This client imports only the standard library (never Trio, msgspec,
numpy or the daemon), so what a spawn costs is the interpreter starting plus a
round trip; the index, the event log and the builds stay warm in the daemon.

The rules it keeps, in order:

* **Find the daemon.** Connect to the per-user socket (:mod:`.paths`), check
  that the peer runs as this uid and is the process that holds the
  directory's lock (anything else listening there is never spoken to), and
  say ``streamd/hello`` (id ``streamd-attach-hello``; its answer is consumed,
  never relayed) with this process's working directory and the event log it
  was told to use (:func:`.launch.asks`): a daemon serving another log
  refuses, naming both. A daemon OLDER than this client is asked to
  ``streamd/retire`` (it stops listening and lets go of its socket and lock
  at once, serves its current clients to their end, then exits) and a new
  one is started; a daemon as new or newer is used.
* **Start one when none answers.** ``sys.executable -m streamd daemon`` in a
  session (and so a process group) of its own, every descriptor closed, stdin
  and stdout on /dev/null, working directory ``/``, every path it is given
  made absolute first (:mod:`.launch`): the Recall core signals this
  process's group on close and waits for this process's stdout to reach
  EOF, so the daemon must share neither. Its stderr is a startup pipe until
  it serves, so a daemon that cannot start is reported at once, in its own
  words. Two clients racing to start one both spawn; the daemon's flock lets
  one serve, the other exits 1 at once, and both clients connect to the
  winner.
* **Wait within the start timeout, and no longer.** Every connect (a full
  listen queue is waited for), every hello and every poll is bounded by what
  is left of it; a lock holder that does not answer in that time is named.
* **Relay byte for byte.** stdin -> socket in a thread, socket -> stdout in the
  main thread (which is where Python runs signal handlers, so a signal always
  interrupts whichever blocking call it is in). Only whole lines go to stdout:
  if the daemon dies mid-frame, the partial frame is dropped, never shown.
* **End the way the peer can tell.** stdin at EOF: half-close the socket
  (``SHUT_WR``) and keep relaying until the daemon closes; exit 0. The daemon
  closes after answering ``recall/shutdown`` (the last frame of that connection,
  and of that connection only: the daemon keeps running): exit 0, and stdout's
  EOF is how the core learns it. Which close that was is told from frames
  (:mod:`.ending`), never from bytes seen in passing. The daemon goes away otherwise (killed,
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
from streamd.cli import output
from streamd.resident import launch, paths
from streamd.resident.control import (
    ControlError,
    DaemonConnection,
    NoAnswer,
    NotAccepting,
    Refused,
    hello,
    say,
    version_key,
)
from streamd.resident.ending import SessionEnd, last_line
from streamd.resident.lock import lock_holder, process_state

# How long a started daemon gets to answer before attach gives up. It needs
# about 0.4 s (imports, then the socket); the rest is room for a loaded machine.
START_TIMEOUT = 5.0
# How often the socket is tried while a daemon starts.
START_POLL = 0.01
READ_CHUNK = 1 << 16

USAGE = f"""usage: streamd attach [--eventlog] [--runtime-dir DIR] [--start-timeout S]
                      [-- DAEMON-ARGS...]

Speak the adapter protocol on stdin/stdout and relay it to the resident
streamd daemon, starting one (`streamd daemon DAEMON-ARGS...`) when none
answers. Recall config: command = ".../streamd", args = ["attach"] (JSONL
streams) or ["attach", "--eventlog"] (an event log).

options:
  --eventlog           the Recall source is an event log (the handshake's location
                       is the log) instead of JSONL streams
  --runtime-dir DIR    the daemon's socket directory (default $STREAMD_RUNTIME_DIR,
                       else $XDG_RUNTIME_DIR/streamd, else $XDG_STATE_HOME/streamd/run)
  --start-timeout S    how long a daemon it starts gets to answer (default {START_TIMEOUT:g})
  -- DAEMON-ARGS...    options for a daemon it starts (see 'streamd daemon --help')
  -h, --help           show this help and exit"""


class AttachError(Exception):
    """A reason this client cannot serve, said in one line on stderr."""


def main(argv: Sequence[str]) -> int:
    _exit_on_signals()
    # Left closed, the daemon socket would take the lowest free number: as
    # descriptor 0 the relay reads its own socket for input and waits for
    # ever; as 1 the answers go back to the daemon (and with 2 closed a
    # message for stderr would go to stdout, among the frames).
    output.open_standard_descriptors()
    try:
        opts = _parse(argv)
    except AttachError as exc:
        print(f"streamd: {exc} (see 'streamd attach --help')", file=sys.stderr)
        return 2
    if opts is None:
        say(USAGE)  # its reader may be gone (`| head -1`): exit 0 all the same
        return 0
    directory, timeout, daemon_args, recall_source = opts
    if any(a == "--db" or a.startswith("--db=") for a in daemon_args):
        # Only then: attach imports nothing beyond the standard library.
        from streamd.eventlog.dbtarget import argv_error

        if (refused := argv_error(daemon_args)) is not None:
            print(f"streamd: {refused}", file=sys.stderr)
            return 2
    from streamd.cli import terminal

    terminal.notice("attach")
    try:
        conn = connect(directory, daemon_args, timeout, recall_source=recall_source)
    except AttachError as exc:
        print(f"streamd attach: {exc}", file=sys.stderr)
        return 1
    return Relay(conn).run()


def _parse(argv: Sequence[str]) -> tuple[str, float, list[str], str] | None:
    args = list(argv)
    recall_source = "stream"
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
        if arg == "--eventlog":
            recall_source = "eventlog"
            continue
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
    # Where the daemon it starts will serve: a --runtime-dir after -- too.
    directory = launch.runtime_dir_of(daemon_args, launch.caller_cwd())
    return directory or paths.runtime_dir(), timeout, daemon_args, recall_source


def _exit_on_signals() -> None:
    def exit_now(signum: int, frame: object) -> None:
        # Nothing is buffered (stdout is written with os.write), so there is
        # nothing to flush; closing the socket ends the daemon's session.
        os._exit(0)

    signal.signal(signal.SIGTERM, exit_now)
    signal.signal(signal.SIGINT, exit_now)


# --- finding or starting the daemon -------------------------------------------


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.at - time.monotonic(), 0.0)


def _not_answering(pid: int, what: str, deadline: _Deadline) -> AttachError:
    state = process_state(pid)
    why = (f"it is stopped (resume it with `kill -CONT {pid}`, or end it)" if state == "T"
           else "it may be swamped or hung; see its log, or end it")
    return AttachError(f"the daemon (pid {pid}) holds the lock but {what} within "
                       f"{deadline.seconds:g} s: {why}")


def _probe(
    directory: str, sock_path: str, asks: dict[str, str], deadline: _Deadline
) -> tuple[DaemonConnection, dict] | None:
    """A connection that has said hello, or None when no daemon of this
    directory listens there. Every wait is bounded by ``deadline``."""
    try:
        conn = DaemonConnection.open(sock_path, deadline.left())
    except NotAccepting:
        holder = lock_holder(directory)
        if holder is None:
            raise AttachError(f"something listens on {sock_path} but does not take "
                              "connections, and no streamd daemon holds its lock") from None
        raise _not_answering(holder, "took no connection", deadline) from None
    except ControlError as exc:
        raise AttachError(str(exc)) from None
    except OSError as exc:
        raise AttachError(f"cannot connect to {sock_path}: {exc.strerror or exc}") from None
    if conn is None:
        return None
    # Only the lock holder is this directory's daemon. Whatever else listens
    # there (a stray server, a test's socket) is never spoken to: the daemon
    # that takes the lock replaces its socket file.
    holder = lock_holder(directory)
    if holder is None or conn.peer_pid() != holder:
        conn.close()
        return None
    try:
        return conn, hello(conn, **asks)
    except Refused as exc:
        conn.close()
        raise AttachError(f"the daemon (pid {holder}) refused this client: {exc.message}") \
            from None
    except NoAnswer:
        conn.close()
        raise _not_answering(holder, "did not answer streamd/hello", deadline) from None
    except ControlError:
        # Closed or reset under us: a daemon retiring or dying. Nobody answers.
        conn.close()
        return None


def connect(
    directory: str, daemon_args: Sequence[str], timeout: float, *, start: bool = True,
    recall_source: str = "stream",
) -> DaemonConnection:
    """Find this directory's daemon (or, with ``start``, start one), all within
    ``timeout``; AttachError says why not. ``recall_source``: what this
    client's recall/* methods index (said in the hello)."""
    deadline = _Deadline(timeout)
    sock_path = paths.socket_path(directory)
    try:
        paths.check_private_dir(directory)
        paths.check_socket_path(sock_path)
    except paths.UnsafeDirectory as exc:
        raise AttachError(str(exc)) from None
    except OSError as exc:
        raise AttachError(f"cannot use the runtime directory {directory}: "
                          f"{exc.strerror or exc}") from None
    cwd = launch.caller_cwd()
    asks = launch.asks(daemon_args, os.environ, cwd)
    if recall_source != "stream":
        asks["recall_source"] = recall_source
    found = _probe(directory, sock_path, asks, deadline)
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
    if not start:
        raise AttachError(f"no daemon answers on {sock_path}")
    return _start(directory, sock_path, daemon_args, asks, deadline)


def _start(
    directory: str, sock_path: str, daemon_args: Sequence[str], asks: dict[str, str],
    deadline: _Deadline,
) -> DaemonConnection:
    try:
        daemon = launch.Launched(daemon_args, launch.caller_cwd())
    except OSError as exc:
        raise AttachError(f"cannot start a daemon: {exc.strerror or exc}") from None
    try:
        while True:
            found = _probe(directory, sock_path, asks, deadline)
            if found is not None:
                conn, _ = found
                conn.sock.settimeout(None)
                return conn
            if not deadline.left():
                break
            if daemon.wait(min(START_POLL, deadline.left())):
                # Its pipe has ended: it serves (the next probe finds it), or
                # it exited, and then only a lost race is worth waiting on.
                if daemon.exited and lock_holder(directory) is None:
                    raise AttachError(f"{daemon.reason()}; nothing serves on {sock_path}")
                time.sleep(min(START_POLL, deadline.left()))
    finally:
        daemon.close()
    why = "it exited" if daemon.exited else "it still runs"
    raise AttachError(
        f"started a daemon (pid {daemon.pid}) but nothing answered on {sock_path} within "
        f"{deadline.seconds:g} s ({why}); see {launch.log_file(daemon_args)} or run "
        "`streamd daemon` to see why"
    )


# --- the relay ----------------------------------------------------------------


class Relay:
    def __init__(self, conn: DaemonConnection) -> None:
        self.sock = conn.sock
        self.first = conn.buffer  # read with the hello answer, not relayed yet
        self.pending = bytearray()  # the start of a frame whose newline is still to come
        self.stdin_closed = threading.Event()
        self.end = SessionEnd()  # fed by the stdin thread only
        self.written = bytearray()  # the last whole lines written to stdout

    def run(self) -> int:
        threading.Thread(target=self._pump_stdin, name="stdin", daemon=True).start()
        try:
            return self._pump_socket()
        finally:
            self.sock.close()

    def _pump_stdin(self) -> None:
        while True:
            try:
                data = os.read(0, READ_CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            # Before the bytes go: the answer to a shutdown can only follow.
            self.end.sent(data)
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
                self.written = self.pending
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
        if not self.pending and (
            (died is None and self.stdin_closed.is_set())
            # The daemon answered a shutdown as its last frame, and closed: the
            # session is over as the peer asked, whatever came after it.
            or (self.written and self.end.answered(last_line(self.written)))
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
