"""A daemon that stalls, a listener that never answers, a daemon that cannot
start, and a session's end told from frames: what ``streamd attach`` and
``Client.connect`` do about each.

Real processes in a private world (``support.resident``). A stall is a real
daemon stopped with SIGSTOP; a full listen queue is that daemon's own, filled
with real connections. Waits are on observed states (the process blocked in
connect(2), per ``/proc/PID/syscall``; a pipe drained, per FIONREAD), never on
sleeps; the few time bounds are generous upper bounds only.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.frozen import freeze
from support.resident import Attached, World, make_world, pid_alive, point_clients_at, req, wait_for

import streamd
from streamd.client import Client
from streamd.errors import RpcError

pytestmark = pytest.mark.subprocess

SYS_CONNECT = 42  # x86_64


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, attach_kind: str) -> Iterator[World]:
    for w in make_world(attach_kind):
        point_clients_at(w, monkeypatch)
        yield w


def in_syscall(task: str, number: int) -> bool:
    """Whether ``/proc/<task>`` is blocked in system call ``number``."""
    try:
        fields = Path(f"/proc/{task}/syscall").read_text().split()
    except OSError:
        return False
    return bool(fields) and fields[0] == str(number)


class Stopped:
    """A daemon stopped with SIGSTOP, optionally with its listen queue full."""

    def __init__(self, world: World, fill: bool) -> None:
        self.proc = world.start_daemon()
        self.pid = self.proc.pid
        self.pending: list[socket.socket] = []
        freeze(self.pid)
        while fill:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(world.socket))
            except BlockingIOError:
                s.close()
                break
            self.pending.append(s)
            assert len(self.pending) < 10_000, "the listen queue never filled"

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        for s in self.pending:
            s.close()


@pytest.fixture
def stopped(world: World) -> Iterator[callable]:
    made: list[Stopped] = []

    def make(fill: bool = False) -> Stopped:
        made.append(Stopped(world, fill))
        return made[-1]

    yield make
    for s in made:
        s.close()


def check_session(out: bytes) -> None:
    answers = {json.loads(line)["id"]: json.loads(line) for line in out.splitlines()}
    assert set(answers) == {1, 2, 3, 4}, out
    assert answers[4] == {"jsonrpc": "2.0", "id": 4, "result": {}}


# --- a full listen queue ------------------------------------------------------


def test_attach_waits_for_a_full_listen_queue_and_is_served_once_it_drains(
    world: World, stopped
) -> None:
    daemon = stopped(fill=True)
    assert len(daemon.pending) > 100  # the kernel's queue, not ours
    proc = world.attach("--start-timeout", "120")
    wait_for(lambda: proc.poll() is not None or in_syscall(str(proc.pid), SYS_CONNECT), 60,
             "attach to wait in connect(2) or give up")
    assert proc.poll() is None, proc.stderr.read()
    daemon.resume()
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    check_session(out)
    assert world.daemons() == [daemon.pid]  # it waited for that one: no second daemon


@pytest.mark.no_attach
def test_client_connect_waits_for_a_full_listen_queue_without_starting_a_daemon(
    world: World, stopped
) -> None:
    daemon = stopped(fill=True)
    got: list[Client | BaseException] = []
    started = threading.Event()
    tid: list[int] = []

    def connect() -> None:
        tid.append(threading.get_native_id())
        started.set()
        try:
            got.append(Client.connect(start_daemon=False, start_timeout=120))
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    assert started.wait(30)
    wait_for(lambda: got or in_syscall(f"self/task/{tid[0]}", SYS_CONNECT), 60,
             "the client to wait in connect(2) or give up")
    assert not got, got
    daemon.resume()
    thread.join(60)
    (client,) = got
    assert isinstance(client, Client), client
    with client:
        assert client.latest_seq() is not None


def test_a_queue_that_stays_full_is_a_client_error_naming_the_stopped_daemon(
    world: World, stopped
) -> None:
    daemon = stopped(fill=True)
    with pytest.raises(RpcError) as info:
        Client.connect(start_daemon=False, start_timeout=0.5)
    assert info.value.code == -32000
    assert f"pid {daemon.pid}" in info.value.message and "stopped" in info.value.message
    done = world.run("attach", "--start-timeout", "0.5", input="")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert f"pid {daemon.pid}" in line and "kill -CONT" in line


# --- something that listens and never answers --------------------------------


def test_a_stopped_daemon_is_named_by_its_pid_when_it_does_not_answer(
    world: World, stopped
) -> None:
    daemon = stopped(fill=False)
    done = world.run("attach", "--start-timeout", "1", input="")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert f"the daemon (pid {daemon.pid}) holds the lock" in line, line
    assert "did not answer" in line and "stopped" in line
    assert "started a daemon" not in line
    assert world.daemons() == [daemon.pid]  # no second one was started behind its back
    with pytest.raises(RpcError) as info:
        Client.connect(start_timeout=1)
    assert f"pid {daemon.pid}" in info.value.message


def test_a_stray_listener_on_the_socket_is_replaced_and_never_waited_on(world: World) -> None:
    world.runtime.mkdir(mode=0o700)
    stray = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stray.bind(str(world.socket))
    stray.listen(8)  # and never accepts, never answers
    try:
        # A start timeout far past the session's bound (60 s): attach must not
        # wait on the stray's queue, which fills with its probes and never
        # drains, until the timeout lets connect(2) look the path up again.
        proc = world.attach("--start-timeout", "600")
        out, err = world.lockstep(proc, timeout=60)
        assert proc.returncode == 0, err
        check_session(out)
        (pid,) = world.daemons()
        assert world.daemon_pid() == pid
    finally:
        stray.close()


class Spewing:
    """A stray server on the socket that answers every connection with bytes
    and never a newline: as fast as it can (``flood``), or one byte a tenth of
    a second (``trickle``), until the client goes."""

    def __init__(self, world: World, how: str) -> None:
        world.runtime.mkdir(mode=0o700)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(world.socket))
        self.listener.listen(8)
        self.how = how
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._spew, args=(conn,), daemon=True).start()

    def _spew(self, conn: socket.socket) -> None:
        block = b"x" * (1 << 16) if self.how == "flood" else b"x"
        with conn:
            try:
                while not self.done.is_set():
                    conn.sendall(block)
                    if self.how == "trickle":
                        self.done.wait(0.1)  # the stray's pace, not a wait on the test
            except OSError:
                pass

    def close(self) -> None:
        self.done.set()
        self.listener.close()


@pytest.mark.no_attach
@pytest.mark.parametrize("how", ["flood", "trickle"])
@pytest.mark.parametrize("command", ["status", "stop"])
def test_status_and_stop_give_up_on_a_stray_that_never_ends_its_line(
    world: World, command: str, how: str
) -> None:
    # A bound per read never fires on a trickle, and a line without end
    # grew in memory (and was searched again whole at each read).
    stray = Spewing(world, how)
    try:
        done = world.run(command, timeout=60)
    finally:
        stray.close()
    assert done.returncode == 1, done
    (line,) = done.stderr.strip().splitlines()
    assert str(world.socket) in line, line


# --- the end of a session, from frames ----------------------------------------


def test_the_words_recall_shutdown_in_a_query_do_not_make_a_dying_daemon_a_clean_end(
    world: World,
) -> None:
    world.start_daemon()
    session = Attached(world.attach())
    assert "result" in session.ask(world.initialize(1))
    answer = session.ask(req(2, "recall/search", query="recall/shutdown", filters={},
                             limit=3, deadline="2999-01-01T00:00:00Z"))
    assert "result" in answer, answer
    os.kill(world.daemon_pid(), signal.SIGKILL)
    assert session.at_eof()
    assert session.proc.wait(timeout=30) == 1
    (line,) = session.stderr().strip().splitlines()
    assert line.startswith("streamd attach: the daemon closed the connection"), line


class ScriptedDaemon:
    """This test process as the directory's daemon: its pid is in the lock
    file and it listens on the socket, so attach speaks to it. It answers the
    hello as a daemon of this version, reads one request, then sends
    ``reply`` and closes."""

    def __init__(self, world: World, reply: bytes) -> None:
        world.runtime.mkdir(mode=0o700)
        # Held, as a daemon holds it: only the lock's holder is the daemon.
        self.lock = os.open(world.runtime / "streamd.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        os.write(self.lock, f"{os.getpid()}\n".encode())
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(world.socket))
        self.listener.listen(8)
        self.listener.settimeout(60)
        self.reply = reply
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(60)
            lines = conn.makefile("rb")
            hello = json.loads(lines.readline())
            conn.sendall(json.dumps({"jsonrpc": "2.0", "id": hello["id"], "result": {
                "version": streamd.__version__, "pid": os.getpid(),
                "started_at": "2026-01-01T00:00:00Z"}}).encode() + b"\n")
            self.requests.append(json.loads(lines.readline()))
            conn.sendall(self.reply)

    def close(self) -> None:
        self.listener.close()
        os.close(self.lock)


def test_a_daemon_that_closes_in_the_middle_of_a_frame_gets_nothing_of_it_shown(
    world: World,
) -> None:
    whole = b'{"jsonrpc":"2.0","id":0,"result":{}}\n'
    daemon = ScriptedDaemon(world, whole + b'{"jsonrpc":"2.0","id":1,"result":{"candi')
    try:
        session = Attached(world.attach())
        session.send(req(1, "recall/health", deadline="2999-01-01T00:00:00Z"))
        assert session.line() == whole  # the whole frame before it, and nothing after
        assert session.at_eof()
        assert session.proc.wait(timeout=30) == 1
        assert session.stderr().splitlines() == [
            "streamd attach: the daemon closed the connection in the middle of a frame; "
            "the session is over"]
        daemon.thread.join(30)
        assert daemon.requests[0]["method"] == "recall/health"
    finally:
        daemon.close()


def unread(pipe_fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(pipe_fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def test_a_shutdown_the_daemon_died_before_answering_is_not_a_clean_end(world: World) -> None:
    world.start_daemon()
    session = Attached(world.attach())
    init = req(1, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
               workdir=str(world.work), source_id="signals", location=str(world.stream),
               settings={"debug_stall_ms": 600_000})
    assert "result" in session.ask(init)
    # A search that stalls, so the shutdown behind it waits for it, unanswered.
    session.send(req(2, "recall/search", query="deploy", filters={}, limit=3,
                     deadline="2999-01-01T00:00:00Z") + req(3, "recall/shutdown"))
    wait_for(lambda: unread(session.proc.stdin.fileno()) == 0, 30, "attach to read its input")
    os.kill(world.daemon_pid(), signal.SIGKILL)
    assert session.at_eof()
    assert session.proc.wait(timeout=30) == 1
    assert session.stderr().startswith("streamd attach: ")


def test_the_shutdown_answer_as_the_last_frame_is_a_clean_end_with_stdin_open(
    world: World,
) -> None:
    proc = world.attach()
    out, err = world.lockstep(proc)  # stdin stays open to the end
    assert proc.returncode == 0 and err == "", err
    check_session(out)


# --- a daemon that cannot start -----------------------------------------------


def test_a_file_where_the_socket_goes_is_reported_at_once(world: World) -> None:
    world.runtime.mkdir(mode=0o700)
    world.socket.write_text("not a socket")
    # Far longer than the subprocess may take: the report must not wait for it.
    done = world.run("attach", "--start-timeout", "600", input="", timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "the daemon it started (pid " in line and "exited with status 1" in line
    assert f"{world.socket} exists and is not a socket" in line
    assert world.socket.read_text() == "not a socket"


def test_a_fifo_where_the_lock_file_goes_is_reported_at_once_and_never_read(
    world: World,
) -> None:
    world.runtime.mkdir(mode=0o700)
    lock = world.runtime / "streamd.lock"
    os.mkfifo(lock)
    # Opened as a file, the FIFO would block attach (looking for the lock's
    # holder) and status for good, whatever their timeouts.
    done = world.run("attach", "--start-timeout", "600", input="", timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "the daemon it started (pid " in line and "exited with status 1" in line, line
    assert f"{lock} is not a regular file" in line, line
    status = world.run("status", timeout=60)
    assert status.returncode == 3 and "not running" in status.stdout, status
    assert lock.is_fifo()  # left alone: refused, never repaired


def test_a_fifo_where_the_stop_mark_goes_keeps_no_daemon_from_serving(world: World) -> None:
    world.runtime.mkdir(mode=0o700)
    os.mkfifo(world.runtime / "streamd.stopped")
    proc = world.attach("--start-timeout", "60")
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    assert len(out.splitlines()) == 4


def test_a_runtime_dir_that_cannot_be_made_is_reported_at_once(world: World) -> None:
    # Not even root can make a directory in /proc: the daemon is the one to find out.
    runtime = "/proc/sdr-no-such-directory/run"
    env = {**world.env, "STREAMD_RUNTIME_DIR": runtime}
    done = subprocess.run(world.argv("attach", "--start-timeout", "600"), env=env, input=b"",
                          capture_output=True, timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.decode().strip().splitlines()
    assert "the daemon it started (pid " in line and "exited with status 1" in line, line
    assert "streamd daemon: " in line and "/proc/sdr-no-such-directory" in line


def test_a_runtime_dir_under_a_file_is_one_line_not_a_traceback(world: World) -> None:
    blocker = world.root / "a-file"
    blocker.write_text("")
    env = {**world.env, "STREAMD_RUNTIME_DIR": str(blocker / "run")}
    done = subprocess.run(world.argv("attach"), env=env, input=b"", capture_output=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines() == [
        f"streamd attach: cannot use the runtime directory {blocker / 'run'}: Not a directory"]


def test_a_log_that_cannot_be_opened_is_reported_at_once(world: World) -> None:
    world.state.write_text("")  # XDG_STATE_HOME is a file: no log directory there
    done = world.run("attach", "--start-timeout", "600", "--", "--db",
                     str(world.root / "e.db"), input="", timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "cannot open the log file" in line, line
    assert not pid_alive(int(line.split("(pid ")[1].split(")")[0]))
