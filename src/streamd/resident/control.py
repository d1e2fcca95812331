"""A blocking client for the daemon's control methods, and ``streamd status`` /
``streamd stop`` for people.

Standard library only: ``streamd attach`` says hello through it on every spawn,
and ``status`` and ``stop`` must answer in milliseconds, without Trio.

The control methods exist on the daemon socket only (a stdio peer is a single
Recall session and has no daemon to control):

* ``streamd/hello {client_version}`` -> ``{version, pid, started_at}``
* ``streamd/status {}`` -> ``{version, pid, uptime_s, connections, sources,
  socket, db, log, db_fault, db_connecting_s, db_calls_wait, db_reconnecting_s}``
  (``db_fault``: why the event log stopped serving, or why it cannot now: a
  server it cannot reach; null while it serves; ``db_connecting_s``: how long
  a connect to its server has been under way, a reconnect's too, null while
  none is; ``db_calls_wait``: whether calls wait for it, false when it is a
  watch's listening connection's alone; ``db_reconnecting_s``: how long it
  has been trying to reach its server again after losing it, null while it
  is not)
* ``streamd/stop {}`` -> ``{}``, then the daemon winds down as on SIGTERM
* ``streamd/retire {}`` -> ``{}`` once it has stopped listening and released its
  socket and lock; it serves its current connections to their end, then exits
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence

from streamd import __version__, errors
from streamd.resident import paths, stopmark
from streamd.resident.lock import lock_holder, pid_alive

# Not `from typing import TYPE_CHECKING`: importing typing costs milliseconds
# on every spawn.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HELLO_ID = "streamd-attach-hello"
# How long a control call waits for its answer. A healthy daemon answers in
# about a millisecond; a daemon that cannot answer in this long is reported,
# not waited for.
CALL_TIMEOUT = 5.0
# How long `streamd stop` waits for the daemon to exit after it has agreed to.
STOP_WAIT = 10.0
READ_CHUNK = 1 << 16
# The longest answer line a control call takes. The daemon's are a few
# hundred bytes; whatever else listens on the socket may send anything, and
# must cost neither unbounded memory nor a wait past the call's timeout.
MAX_ANSWER = 1 << 20


class ControlError(Exception):
    """The daemon answered with an error, answered nonsense, or went away."""


class Refused(ControlError):
    """The daemon answered the call with an error (it runs, and said no)."""

    def __init__(self, method: str, code: Any, message: str, data: Any = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        super().__init__(f"{method}: {message} ({code})")


class NoAnswer(ControlError):
    """The daemon took the connection but did not answer in time."""


class NotAccepting(ControlError):
    """Something listens on the socket but its queue of pending connections
    stayed full for as long as we could wait."""


def version_key(version: str) -> tuple[int, ...]:
    """``"0.10.2"`` -> ``(0, 10, 2)``; the leading digits of each dotted part, so
    a local suffix (``0.2.0.dev1``, ``1.0rc1``) compares by its numbers."""
    key = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        key.append(int(digits) if digits else 0)
    while key and key[-1] == 0:
        key.pop()
    return tuple(key)


class DaemonConnection:
    """One blocking connection to the daemon socket."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self.sock = sock
        self.path = path
        # Bytes read past the last answer taken (kept for the relay).
        self.buffer = b""

    @classmethod
    def open(cls, path: str, timeout: float = CALL_TIMEOUT) -> DaemonConnection | None:
        """Connect, or None when nobody listens there (no file, a stale file).

        A listener whose queue of pending connections is full (a daemon
        stalled, or swamped) is waited for, up to ``timeout``, then
        :class:`NotAccepting`; calls on the connection then wait ``timeout``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect_waiting(sock, path, timeout)
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
            sock.close()
            return None
        except BlockingIOError:
            sock.close()
            raise NotAccepting(
                f"{path} did not take the connection within {max(timeout, 0):g} s: its "
                "queue of pending connections is full"
            ) from None
        except BaseException:
            sock.close()
            raise
        sock.settimeout(max(timeout, _MIN_WAIT))
        conn = cls(sock, path)
        uid = conn.peer_uid()
        if uid != os.geteuid():
            sock.close()
            raise ControlError(f"the server on {path} runs as uid {uid}, not as this user")
        return conn

    def peer_uid(self) -> int:
        return self._peer()[1]

    def peer_pid(self) -> int:
        """The process that listens on the socket (it called listen(2))."""
        return self._peer()[0]

    def _peer(self) -> tuple[int, int]:
        creds = self.sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
        )
        pid, uid, _gid = struct.unpack("3i", creds)
        return pid, uid

    def call(self, method: str, params: dict[str, Any], request_id: Any = 1) -> Any:
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        unsent: OSError | None = None
        # One bound for the whole answer, not for each read: a peer that
        # trickles bytes must not keep the call waiting past it.
        timeout = self.sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            try:
                self.sock.sendall(json.dumps(frame).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError) as exc:
                # A daemon that refused the connection may have closed it
                # before the request went out: what it said is still there.
                unsent = exc
            while True:
                try:
                    line = self._line(deadline)
                except ControlError:
                    if unsent is not None:
                        raise unsent from None
                    raise
                try:
                    reply = json.loads(line)
                except ValueError:
                    raise ControlError(f"{method}: the daemon answered a line that is not "
                                       "JSON") from None
                if isinstance(reply, dict) and (
                        reply.get("id") == request_id
                        # An error with no id: the daemon refused the connection.
                        or (reply.get("id") is None and "error" in reply)):
                    break
        except TimeoutError:
            raise NoAnswer(f"{method}: no answer from {self.path} within "
                           f"{timeout or 0:g} s") from None
        except OSError as exc:
            raise ControlError(f"{method}: the connection to {self.path} failed: "
                               f"{exc.strerror or exc}") from None
        finally:
            self.sock.settimeout(timeout)
        if "error" in reply:
            err = reply["error"] if isinstance(reply["error"], dict) else {}
            raise Refused(method, err.get("code"), str(err.get("message")), err.get("data"))
        return reply.get("result")

    def _line(self, deadline: float | None) -> bytes:
        """The next line, read by ``deadline`` (``time.monotonic``; None: no
        bound) and no longer than ``MAX_ANSWER``. Only new bytes are searched
        for the newline."""
        held = bytearray(self.buffer)
        searched = 0
        while (cut := held.find(b"\n", searched)) < 0:
            if len(held) > MAX_ANSWER:
                raise ControlError(f"the server on {self.path} answered a line longer than "
                                   f"{MAX_ANSWER} bytes")
            searched = len(held)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.sock.settimeout(left)
            chunk = self.sock.recv(READ_CHUNK)
            if not chunk:
                raise ControlError(f"the daemon on {self.path} closed the connection")
            held += chunk
        self.buffer = bytes(held[cut + 1:])
        return bytes(held[:cut])

    def wait_closed(self, timeout: float) -> bool:
        """Read (and drop) until the daemon closes the connection."""
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self.sock.recv(READ_CHUNK):
                    return True
        except TimeoutError:
            return False
        except OSError:
            return True  # reset: gone as well
        return False

    def close(self) -> None:
        self.sock.close()


def hello(conn: DaemonConnection, **asks: Any) -> dict[str, Any]:
    """Say hello; ``asks``: what this client needs of the daemon (``cwd``: the
    directory its relative paths mean; ``db``: the event log it was told to
    use), refused by a daemon that cannot give it. An older daemon ignores
    what it does not know."""
    params = {"client_version": __version__, **{k: v for k, v in asks.items() if v}}
    result = conn.call("streamd/hello", params, HELLO_ID)
    if not isinstance(result, dict) or not isinstance(result.get("version"), str):
        raise ControlError(f"streamd/hello: unexpected answer {result!r}")
    return result


def _connect_waiting(sock: socket.socket, path: str, timeout: float) -> None:
    """connect(2), waiting up to ``timeout`` for room in a full listen queue.

    A socket with a Python timeout is non-blocking, and a Unix socket's
    connect then fails at once with EAGAIN when the listener's queue is full
    (it never reports "in progress" the way TCP does). A blocking connect
    with SO_SNDTIMEO is the kernel's own bounded wait: it sleeps until the
    listener accepts someone, and gives EAGAIN only when the time is up.

    The wait is taken in slices of :data:`_CONNECT_SLICE`: a sleeping connect
    looks the path up again only when it wakes, so a listener that never
    accepts (a stray whose queue our probes filled) would hold it for the
    whole timeout though a daemon had meanwhile put its socket in its place."""
    if timeout < _MIN_WAIT:
        sock.setblocking(False)
        sock.connect(path)
        return
    sock.setblocking(True)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        _timeval(max(min(left, _CONNECT_SLICE), _MIN_WAIT)))
        try:
            sock.connect(path)
            break
        except BlockingIOError:
            if deadline - time.monotonic() < _MIN_WAIT:
                raise
    # No longer wanted: every later send is bounded by the Python timeout.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(0))
    # Interrupted by a signal whose handler returned, connect may report
    # success on a socket that is not connected (Python waits for "writable",
    # which an unconnected Unix socket always is).
    sock.getpeername()


# Below this a wait is not worth a system call; SO_SNDTIMEO 0 would mean "forever".
_MIN_WAIT = 0.001
# How long one connect(2) sleeps on a full queue before it looks the path up again.
_CONNECT_SLICE = 0.05


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))


# --- streamd status / streamd stop -------------------------------------------

_RUNTIME_DIR_HELP = (
    "  --runtime-dir DIR  the daemon's socket directory (default $STREAMD_RUNTIME_DIR,\n"
    "                     else $XDG_RUNTIME_DIR/streamd, else $XDG_STATE_HOME/streamd/run)\n"
    "  -h, --help         show this help and exit"
)

STATUS_USAGE = f"""usage: streamd status [--json] [--runtime-dir DIR]

Whether the resident daemon runs, and what it holds. Exit 0 if it runs, 3 if it
does not, 1 if something holds its socket but does not answer.

options:
  --json             print one compact JSON line instead of lines for people
{_RUNTIME_DIR_HELP}"""

STOP_USAGE = f"""usage: streamd stop [--runtime-dir DIR]

Stop the resident daemon (as SIGTERM would) and wait for it to exit. Exit 0
whether or not one was running; 1 if it did not exit in time.

options:
{_RUNTIME_DIR_HELP}"""


def _parse(argv: Sequence[str], usage: str, flags: Sequence[str]) -> dict[str, Any] | int:
    """Options, or an exit status: 0 after --help, 2 after the one line a
    mistake gets (as every streamd command says it: ``streamd: ...``)."""
    command = usage.split()[2]
    opts: dict[str, Any] = {"json": False, "runtime_dir": None}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            say(usage)
            return 0
        if arg == "--json" and "--json" in flags:
            opts["json"] = True
        elif arg == "--runtime-dir":
            if not args:
                return _usage_error("--runtime-dir needs a value", command)
            opts["runtime_dir"] = os.path.abspath(args.pop(0))
        elif arg.startswith("--runtime-dir="):
            opts["runtime_dir"] = os.path.abspath(arg.split("=", 1)[1])
        else:
            return _usage_error(f"unrecognized argument {arg!r}", command)
    return opts


def say(text: str) -> None:
    """A line on stdout, whose reader may be gone (``streamd status | head -1``):
    then the rest goes to /dev/null, and the exit status, which is what
    ``status`` means, is still the one the daemon's state gives."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Later lines and the interpreter's last flush must not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _usage_error(message: str, command: str) -> int:
    print(f"streamd: {message} (see 'streamd {command} --help')", file=sys.stderr)
    return 2


def _directory(opts: dict[str, Any]) -> str:
    return opts["runtime_dir"] or paths.runtime_dir()


def _uptime(seconds: float) -> str:
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{s}s")
    return " ".join(parts)


def _json_line(value: dict[str, Any]) -> str:
    """One compact JSON object, the line every ``--json`` prints."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def at_limit(refusal: Refused) -> bool:
    """Whether the daemon refused the connection for its connection limit."""
    data = refusal.data
    return isinstance(data, dict) and data.get("reason") == errors.TOO_MANY_CONNECTIONS


def status_main(argv: Sequence[str]) -> int:
    opts = _parse(argv, STATUS_USAGE, ["--json"])
    if isinstance(opts, int):
        return opts
    directory = _directory(opts)
    sock = paths.socket_path(directory)
    try:
        paths.check_private_dir(directory)
        # A path no daemon can bind is said as attach and the daemon say it,
        # not as a daemon that does not answer.
        paths.check_socket_path(sock)
        conn = DaemonConnection.open(sock)
        if conn is None:
            result = None
        else:
            try:
                result = conn.call("streamd/status", {})
            except Refused as exc:
                if not at_limit(exc):
                    raise
                # It runs, and serves as many clients as it takes.
                pid = conn.peer_pid()
                if opts["json"]:
                    say(_json_line({"running": True, "socket": sock, "pid": pid,
                                      "refused": exc.message}))
                else:
                    say(f"streamd daemon: running, pid {pid}, but it refused this"
                          f" connection: {exc.message}")
                return 0
            finally:
                conn.close()
    except (ControlError, paths.UnsafeDirectory, OSError) as exc:
        if opts["json"]:
            say(_json_line({"running": False, "socket": sock, "error": str(exc)}))
        elif isinstance(exc, paths.UnsafeDirectory):  # no daemon was asked anything
            print(f"streamd status: {exc}", file=sys.stderr)
        else:
            print(f"streamd daemon: not answering on {sock}: {exc}", file=sys.stderr)
        return 1
    if result is None:
        holder = lock_holder(directory)
        if opts["json"]:
            say(_json_line({"running": False, "socket": sock, "lock_holder": holder}))
        elif holder is not None:
            say(f"streamd daemon: not answering on {sock}, though pid {holder} holds its lock")
        else:
            say(f"streamd daemon: not running (socket {sock})")
        return 1 if holder is not None else 3
    if opts["json"]:
        say(_json_line({"running": True, **result}))
        return 0
    say(f"streamd daemon {result['version']}: running, pid {result['pid']}, "
          f"up {_uptime(result['uptime_s'])}")
    say(f"  socket       {result['socket']}")
    say(f"  clients      {result['connections']} connected, "
          f"{result['sources']} Recall sources open")
    say(f"  event log    {event_log_line(result)}")
    if result.get("db_fault"):
        say(f"  EVENT LOG FAULT  {result['db_fault']}")
    say(f"  daemon log   {result['log']}")
    return 0


def event_log_line(status: dict[str, Any]) -> str:
    """The event log's database, and the connect its calls wait for: the
    first one (a server that never answers fails no attempt, so no fault
    shows), or the ones after it lost its server (how long it has been
    without it, which the newest failure alone does not say). A watch's
    listening connection's connect holds no call: said so, not that calls
    wait."""
    db, waited = status["db"], status.get("db_connecting_s")
    lost = status.get("db_reconnecting_s")
    # A daemon from before the field: its connects were all calls'.
    calls = status.get("db_calls_wait", True)
    if lost is not None:
        now = ("no attempt under way" if waited is None
               else f"an attempt unanswered for {int(waited)} s; calls wait for it" if calls
               else f"a watch's attempt unanswered for {int(waited)} s; watches poll meanwhile")
        return f"reconnecting to {db} for {int(lost)} s ({now})"
    if waited is not None and calls:
        return f"connecting to {db} for {int(waited)} s (no answer yet; calls wait for it)"
    if waited is not None:
        return f"{db} (a watch's connect unanswered for {int(waited)} s; watches poll meanwhile)"
    return str(db)


def stop_main(argv: Sequence[str]) -> int:
    opts = _parse(argv, STOP_USAGE, [])
    if isinstance(opts, int):
        return opts
    directory = _directory(opts)
    sock = paths.socket_path(directory)
    try:
        paths.check_socket_path(sock)
        if paths.check_private_dir(directory):
            # First: daemons that racing clients spawned may still be starting,
            # none serving yet; whoever of them takes the lock later must not
            # serve (the daemon that gets the stop below leaves a mark too).
            stopmark.mark_stopped(directory)
        conn = DaemonConnection.open(sock)
        if conn is None:
            # No socket, yet a daemon may hold the lock (its socket file was
            # deleted, by a cleaner of /tmp, say): it serves nobody, and keeps
            # every daemon a client starts from serving. SIGTERM stops it.
            pid = lock_holder(directory, confirmed=True) or 0
            if not pid:
                say(f"streamd daemon: not running (socket {sock}); nothing to stop")
                return 0
            print(f"streamd stop: the daemon (pid {pid}) holds the lock but nothing listens"
                  f" on {sock}; sending it SIGTERM", file=sys.stderr)
            os.kill(pid, signal.SIGTERM)
        else:
            try:
                pid = hello(conn)["pid"]
                conn.call("streamd/stop", {}, 2)
                conn.wait_closed(STOP_WAIT)
            except Refused as exc:
                # Refused before any method (it serves as many connections as it
                # takes): the daemon that holds the lock and listens here is
                # stopped the other way it takes, SIGTERM.
                pid = conn.peer_pid()
                if not at_limit(exc) or pid != lock_holder(directory):
                    raise
                print(f"streamd stop: the daemon (pid {pid}) refused the connection"
                      f" ({exc.message}); sending it SIGTERM", file=sys.stderr)
                os.kill(pid, signal.SIGTERM)
            finally:
                conn.close()
    except (ControlError, paths.UnsafeDirectory, OSError) as exc:
        print(f"streamd stop: {exc}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + STOP_WAIT
    while pid_alive(pid):
        if time.monotonic() > deadline:
            print(f"streamd stop: pid {pid} agreed to stop but still runs after "
                  f"{STOP_WAIT:g} s", file=sys.stderr)
            return 1
        time.sleep(0.01)
    say(f"streamd daemon: stopped (pid {pid})")
    return 0
