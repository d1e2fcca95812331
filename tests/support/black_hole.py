"""Database servers that accept a connection and never answer it, for the
tests of every place that opens one.

* :class:`BlackHole`: a listening TCP socket whose accepted connections are
  never read or written (a hung host: the kernel completes the handshake, the
  driver sends its first packet and waits for an answer that never comes).
* :class:`Proxy`: a Unix socket forwarding to the test's real server (so the
  server sees a local peer, as its fixtures expect) that, from the moment the
  test says, accepts new connections and forwards nothing on them, while the
  connections already made go on working: a server that answered the log's
  first connections and stops answering later ones. It can also break the
  connections it forwards, so that their clients connect again.

Both count the connections they hold unanswered, and a test waits for that
count with :meth:`Holder.wait_held` (a thread handshake, never a sleep).
:meth:`Holder.let_go` closes those held so far, and leaving either closes
every socket: a connect still waiting on one then fails at once.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

__all__ = [
    "BOUND_S", "TIMEOUTS", "BlackHole", "Holder", "Proxy", "bounded", "hole_url", "ping_into",
]


class Holder:
    """The connections a listener holds unanswered, and a wait for them."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: list[socket.socket] = []

    @property
    def held(self) -> int:
        with self._changed:
            return len(self._held)

    def _hold(self, conn: socket.socket) -> None:
        with self._changed:
            self._held.append(conn)
            self._changed.notify_all()

    def _wait(self, count: int, timeout: float | None = None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: len(self._held) >= count, timeout)

    def wait_held_blocking(self, count: int = 1, timeout: float = 30) -> bool:
        """Until ``count`` connections are held, for a test without Trio:
        whether they were, within ``timeout``."""
        return self._wait(count, timeout)

    async def wait_held(self, count: int = 1) -> None:
        """Until ``count`` connections are held (bound it with ``trio.fail_after``)."""
        await trio.to_thread.run_sync(self._wait, count, abandon_on_cancel=True)

    def let_go(self) -> None:
        """Close the connections held now (any thread): a connect waiting on
        one fails at once."""
        with self._changed:
            held, self._held = self._held, []
        for conn in held:
            _close(conn)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # never connected, or already gone
    sock.close()


class _Listener(Holder):
    def __init__(self, listener: socket.socket) -> None:
        super().__init__()
        self._listener = listener
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="test-listener", daemon=True)

    def __enter__(self) -> _Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        _close(self._listener)
        self._thread.join(10)
        self.let_go()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._closed:
                _close(conn)
                return
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        self._hold(conn)


class BlackHole(_Listener):
    """``with BlackHole() as hole:``: 127.0.0.1:``hole.port`` accepts and never answers."""

    def __init__(self) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        super().__init__(listener)
        self.port: int = listener.getsockname()[1]

    def __enter__(self) -> BlackHole:
        super().__enter__()
        return self


class Proxy(_Listener):
    """``with Proxy(upstream, path) as proxy:`` forwards each connection made
    to the Unix socket ``path`` to the Unix socket ``upstream``, until
    :meth:`hold_new` (or its first ``forward`` connections, when given): the
    connections accepted after that are held, never forwarded nor answered."""

    def __init__(self, upstream: Path, path: Path, forward: int | None = None) -> None:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listener.listen(64)
        super().__init__(listener)
        self.path = path
        self._upstream = upstream
        self._forward_left = forward
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []

    def __enter__(self) -> Proxy:
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        with self._lock:
            forwarded, self._open = self._open, []
        for sock in forwarded:
            _close(sock)

    def hold_new(self) -> None:
        """From now on, connections are held, not forwarded."""
        with self._lock:
            self._forward_left = 0

    def cut_forwarded(self) -> None:
        """Break the connections forwarded so far (a server restarted): their
        clients find them closed and connect again."""
        with self._lock:
            forwarded, self._open = self._open, []
        for sock in forwarded:
            _close(sock)

    def _accepted(self, conn: socket.socket) -> None:
        with self._lock:
            forward = self._forward_left is None or self._forward_left > 0
            if forward and self._forward_left is not None:
                self._forward_left -= 1
        if not forward:
            self._hold(conn)
            return
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(str(self._upstream))
        except OSError:
            _close(conn)
            return
        with self._lock:
            self._open += [conn, upstream]
        for source, sink in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pump, args=(source, sink), name="test-proxy",
                             daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    while True:
        try:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
        except OSError:
            break
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


BOUND_S = 30.0

TIMEOUTS = {"finite": "300", "none": "0"}
"""``connect_timeout`` in the URL: one no test waits out, and no limit."""


@contextmanager
def bounded(*holders: Holder, seconds: float = BOUND_S) -> Iterator[None]:
    """``trio.fail_after``; past it the held connections are let go too: a
    connect nothing can leave (the fault these tests pin) would otherwise
    outlast the bound, for ever with no connect timeout."""
    timer = threading.Timer(seconds, lambda: [h.let_go() for h in holders])
    timer.start()
    try:
        with trio.fail_after(seconds):
            yield
    finally:
        timer.cancel()


def hole_url(backend: str, port: int, timeout: str) -> str:
    if backend == "postgres":
        pytest.importorskip("psycopg")
        return (f"postgresql://agent@127.0.0.1:{port}/events?connect_timeout={timeout}"
                "&sslmode=disable&gssencmode=disable")
    pytest.importorskip("MySQLdb")
    return f"mysql://agent@127.0.0.1:{port}/events?connect_timeout={timeout}"


async def ping_into(log: Any, answers: list[Any]) -> None:
    """``log.ping()``, its refusal (an RpcError) kept in ``answers``: for a
    ping left waiting on a connect while the test closes the log."""
    from streamd.errors import RpcError

    try:
        await log.ping()
    except RpcError as exc:
        answers.append(exc)
