"""What the resident-daemon tests share: a private world and the processes in it.

Imported as a plain module (pytest puts ``tests/`` on ``sys.path``). Every
test gets its own socket directory (``STREAMD_RUNTIME_DIR``, under ``/tmp``
so the socket path stays inside the 107 bytes a Unix address holds) and
state directory (``XDG_STATE_HOME``), so no test ever reaches a real user's
daemon, and the fixture kills at teardown every process that carries this
world's ``STREAMD_RUNTIME_DIR`` in its environment: daemons that ``attach``
started in sessions of their own are found that way too.

Waiting is on conditions, never on sleeps: :func:`wait_for` polls a predicate
until a deadline and fails the test with what it was waiting for.

A world runs one of the two attach implementations (:data:`ATTACHES`): the
Python ``streamd attach`` or the compiled ``streamd-attach`` installed beside
the interpreter; ``world.argv("attach", ...)`` names the world's, so one test
of attach runs over both (``tests/resident/conftest.py`` parametrizes them).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

FAR_DEADLINE = "2999-01-01T00:00:00Z"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def req(id: Any, method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).encode() \
        + b"\n"


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


ATTACHES = ("python", "native")
"""The attach implementations: ``streamd attach`` and ``streamd-attach``."""


def native_attach() -> Path | None:
    """The compiled ``streamd-attach`` pip installed beside this interpreter
    (beside the ``streamd`` script), or None where it was not built."""
    path = Path(sys.executable).parent / "streamd-attach"
    return path if path.is_file() and os.access(path, os.X_OK) else None


class World:
    """A socket directory, a state directory, a stream and a workdir; and
    which attach (:data:`ATTACHES`) its ``attach`` commands run."""

    def __init__(self, root: Path, attach: str = "python") -> None:
        self.root = root
        native = native_attach() if attach == "native" else None
        if attach == "native" and native is None:
            raise AssertionError("streamd-attach is not installed beside this Python")
        self.attach_kind = attach
        self.attach_argv = [str(native)] if native else [sys.executable, "-m", "streamd",
                                                         "attach"]
        self.runtime = root / "run"
        self.state = root / "state"
        self.data = root / "data"
        self.work = root / "work"
        for d in (self.data, self.work):
            d.mkdir()
        self.socket = self.runtime / "streamd.sock"
        self.log = self.state / "streamd" / "daemon.log"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("STREAMD_DB", "XDG_RUNTIME_DIR", "STREAMD_LOG")}
        self.env["STREAMD_RUNTIME_DIR"] = str(self.runtime)
        self.env["XDG_STATE_HOME"] = str(self.state)
        self.marker = f"STREAMD_RUNTIME_DIR={self.runtime}".encode()
        self.stream = self.data / "a.jsonl"
        self.stream.write_bytes(b"".join(
            json.dumps({"schema": 2, "id": f"evt-{i}", "event_time": f"2026-05-02T10:0{i}:00Z",
                        "title": f"deploy number {i}", "text": "the pipeline shipped"}).encode()
            + b"\n" for i in range(5)
        ))

    # commands

    def argv(self, *args: str) -> list[str]:
        if args[:1] == ("attach",):
            return [*self.attach_argv, *args[1:]]
        return [sys.executable, "-m", "streamd", *args]

    def run(self, *args: str, timeout: float = 30, env: dict[str, str] | None = None,
            **kw: Any) -> subprocess.CompletedProcess:
        """A ``streamd`` command in this world (``env``: variables added to it)."""
        return subprocess.run(self.argv(*args), env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, **kw)

    def start_daemon(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``streamd daemon`` in the foreground, as a child of the test; returns
        once its socket answers."""
        proc = subprocess.Popen(self.argv("daemon", *args), env={**self.env, **(env or {})},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        self.wait_answering(proc)
        return proc

    def wait_answering(self, proc: subprocess.Popen | None = None, timeout: float = 20) -> dict:
        def answer() -> dict | None:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"daemon exited {proc.returncode}: "
                                     f"{proc.stderr.read() if proc.stderr else ''}")
            try:
                return self.hello()
            except OSError:
                return None

        return wait_for(answer, timeout, f"a daemon answering on {self.socket}")

    def attach(self, *args: str, **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(self.argv("attach", *args), env=self.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, **kw)

    # the socket, spoken to directly

    def connect(self, timeout: float = 10) -> Conn:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(self.socket))
        except OSError:
            sock.close()
            raise
        return Conn(sock)

    def hello(self) -> dict:
        with self.connect() as conn:
            return conn.result("streamd/hello", client_version="0")

    def daemon_pid(self) -> int:
        return self.hello()["pid"]

    # the Recall session a core runs

    def initialize(self, id: Any = 1) -> bytes:
        return req(id, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
                   workdir=str(self.work), source_id="signals", location=str(self.stream),
                   settings={})

    def session(self) -> bytes:
        """initialize, health (5 s deadline, as the core probes), search, shutdown;
        one frame a line."""
        return b"".join((
            self.initialize(1),
            req(2, "recall/health", deadline=_deadline_in(5)),
            req(3, "recall/search", query="deploy", filters={}, limit=3,
                deadline=_deadline_in(5)),
            req(4, "recall/shutdown"),
        ))

    def lockstep(self, proc: subprocess.Popen, timeout: float = 60) -> tuple[bytes, str]:
        """Drive :meth:`session` through a running attach as the core does: each
        request after the previous answer (requests run concurrently, so a
        health pipelined behind initialize could be answered before the
        handshake), then wait for stdout's EOF and the exit. Returns the
        answers as stdout lines and attach's stderr."""
        attached = Attached(proc)
        lines = []
        try:
            for request in self.session().splitlines(keepends=True):
                lines.append(json.dumps(attached.ask(request, timeout)).encode())
            assert attached.at_eof(timeout), "attach did not end after the shutdown answer"
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout)
            proc.stdin.close()
        return b"\n".join(lines) + b"\n", attached.stderr()

    # processes of this world

    def processes(self) -> list[int]:
        """Live processes whose environment names this world's socket directory."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if self.marker in environ.split(b"\0") and pid_alive(int(entry)):
                found.append(int(entry))
        return found

    def daemons(self) -> list[int]:
        out = []
        for pid in self.processes():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"daemon" in cmdline and b"streamd" in cmdline:
                out.append(pid)
        return out

    def kill_all(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.processes()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 3
            while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.01)


class Conn:
    """One raw connection to the daemon socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.ids = iter(range(1000, 10**9))

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> dict | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                assert not self.buf, self.buf
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, method: str, **params: Any) -> dict:
        request_id = next(self.ids)
        self.send(req(request_id, method, **params))
        while True:
            frame = self.frame()
            assert frame is not None, f"connection closed before answering {method}"
            if frame.get("id") == request_id:
                return frame

    def result(self, method: str, **params: Any) -> Any:
        reply = self.call(method, **params)
        assert "result" in reply, reply
        return reply["result"]

    def closed(self) -> bool:
        """Wait (bounded by the socket's timeout) for the daemon to close."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except ConnectionResetError:
            return True


class Attached:
    """A running ``streamd attach`` driven in lockstep, as a Recall core does:
    write a request, wait for its line. A thread reads stdout into a queue so
    every wait has a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def line(self, timeout: float = 30) -> bytes | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from attach within {timeout} s") from None

    def ask(self, data: bytes, timeout: float = 30) -> dict:
        self.send(data)
        line = self.line(timeout)
        assert line is not None, f"attach ended: {self.stderr()}"
        return json.loads(line)

    def at_eof(self, timeout: float = 30) -> bool:
        return self.line(timeout) is None

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")


def frames(out: bytes) -> dict[Any, dict]:
    """Answers by id from a transcript of stdout."""
    got = {}
    for line in out.splitlines():
        frame = json.loads(line)
        got[frame.get("id")] = frame
    return got


def _deadline_in(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds + 1))


def point_clients_at(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process's clients (and the daemons they start, which inherit
    its environment) use ``world``'s runtime and state directories and nothing
    the caller's environment names."""
    for name in ("STREAMD_DB", "XDG_RUNTIME_DIR", "STREAMD_LOG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STREAMD_RUNTIME_DIR", str(world.runtime))
    monkeypatch.setenv("XDG_STATE_HOME", str(world.state))


def make_world(attach: str = "python") -> Iterator[World]:
    """The body of each test module's ``world`` fixture (``yield from``)."""
    root = Path(tempfile.mkdtemp(prefix="sdr-", dir="/tmp"))
    w = World(root, attach)
    try:
        yield w
    finally:
        w.kill_all()
        shutil.rmtree(root, ignore_errors=True)
