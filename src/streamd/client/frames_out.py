"""The blocking client's sending side: whole frames, each within its caller's
deadline, never blocking the reader.

A daemon that does not read (stopped, overloaded past its in-flight limits, or
a peer that never reads) fills the socket's buffer. A plain ``sendall`` then
waits for ever, under the lock every other thread's call waits for too, so a
call's ``timeout`` could not be kept. Here bytes are written without blocking
and the wait for room is a ``poll`` bounded by the caller's deadline. A frame
is never cut on the wire: the part of one that did not go by its deadline
stays queued ahead of anything later, and a frame none of which went is taken
back (its request never reached the daemon). Cancel notifications are queued
behind whatever is in flight and written as far as they go without waiting,
so the reader, which sends them, can never be held up by the daemon's reading.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import IO

from streamd import forks

__all__ = ["FrameWriter", "pipe_outlet", "socket_outlet"]

# How much of the queue one send offers: a copy is taken (the queue cannot be
# resized while a view of it is exported), so not all of a large frame at once.
_CHUNK = 1 << 20

# How often a wait for room in a pipe looks whether the pipe was closed.
_CLOSED_CHECK = 0.5

Outlet = tuple[Callable[[bytes], int], Callable[[float | None], bool]]
"""A non-blocking ``send`` (the bytes written, 0 when none fit) and a
``writable(timeout)`` wait (False when it timed out)."""


def _wait_writable(fd: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    # Readiness with an error or a hang-up is reported as writable: the next
    # send raises the connection's error.
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000) + 1)))


def socket_outlet(sock: socket.socket) -> Outlet:
    """A connected socket's outlet (MSG_DONTWAIT: the socket stays blocking for
    the reader thread's ``recv``)."""

    def send(data: bytes) -> int:
        try:
            return sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0

    return send, lambda timeout: _wait_writable(sock.fileno(), timeout)


def pipe_outlet(pipe: IO[bytes]) -> tuple[Outlet, Callable[[], None]]:
    """A pipe's writing end, made non-blocking (the reading end, the child's,
    is a file description of its own and keeps its mode), and how to close
    it. It is never closed under a write: a writer waiting for room while
    another thread closed it wrote, once room came, to whatever file had
    been given the descriptor's number meanwhile."""
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    lock = forks.Lock()  # free in a forked child, whose close lets go of its copy

    def send(data: bytes) -> int:
        with lock:
            if pipe.closed:
                raise BrokenPipeError(errno.EPIPE, "the pipe to the daemon was closed")
            try:
                return os.write(fd, data)
            except BlockingIOError:
                return 0

    def writable(timeout: float | None) -> bool:
        # In slices: closed between the check and the poll, the number may be
        # another file's, which need never become writable.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with lock:
                if pipe.closed:
                    return True  # the next send says so
            left = _left(deadline)
            if _wait_writable(fd, _CLOSED_CHECK if left is None else min(left, _CLOSED_CHECK)):
                return True
            if left is not None and left <= _CLOSED_CHECK:
                return False

    def close() -> None:
        with lock:
            pipe.close()

    return (send, writable), close


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class FrameWriter:
    """Whole frames onto one outlet, from any number of threads."""

    def __init__(self, outlet: Outlet) -> None:
        self._send, self._writable = outlet
        self._turn = threading.Lock()  # held by the one thread writing
        self._writing: int | None = None  # that thread's ident, while it holds the turn
        self._lock = threading.Lock()  # guards the queue and the count
        self._queue = bytearray()  # bytes owed to the stream, whole frames' worth
        self._written = 0  # bytes written so far; the queue's first is the next

    def write(self, frame: bytes, deadline: float | None, withdrawn: Callable[[], None]) -> None:
        """Write ``frame`` whole, after what is queued. If ``deadline``
        (``time.monotonic()``) passes first, raise TimeoutError: with none of
        the frame written it is taken back and ``withdrawn()`` is called; with
        part of it written the rest stays queued, to go before anything else.
        An interruption (KeyboardInterrupt) leaves the stream the same way.
        OSError when the connection is broken (the request is not withdrawn:
        the connection's end answers it)."""
        if self._writing == threading.get_ident():
            # This thread is inside a write already: a signal handler's call,
            # run between two of its steps. Waiting for the turn would wait
            # for the interrupted write, which cannot go on until the handler
            # returns: for ever.
            withdrawn()
            raise RuntimeError(
                "a call made while this thread's own call writes its request (from a signal"
                " handler?) would wait for itself: refused, nothing was sent")
        left = _left(deadline)
        if not self._turn.acquire(timeout=-1 if left is None else left):
            withdrawn()
            raise TimeoutError("another thread's request was still being written")
        self._writing = threading.get_ident()
        start = end = -1
        written = 0
        broken = False
        try:
            if self._flush(deadline, None):
                with self._lock:
                    start = self._written + len(self._queue)
                    self._queue += frame
                end = start + len(frame)
                self._flush(deadline, end)
        except TimeoutError:
            raise
        except (OSError, ValueError):
            # Broken: the request stays the core's, so the end of input
            # answers it (in the daemon's words when it said why it closed).
            broken = True
            raise
        finally:
            written = self._settle(start, end)
            if written == 0 and not broken:
                withdrawn()
            self._writing = None
            self._turn.release()
        self._flush_left()
        if written == 0:
            raise TimeoutError("the connection's earlier frames were still being written")
        if written < len(frame):
            raise TimeoutError("part of the request was written; the rest goes first")

    def write_soon(self, frame: bytes) -> None:
        """Queue ``frame`` (a notification) behind everything and write as much
        as goes without waiting; the rest goes with a later write. OSError
        when the connection is broken."""
        with self._lock:
            self._queue += frame
        self._flush_left()

    def _settle(self, start: int, end: int) -> int:
        """How much of the frame at [start, end) of the stream was written;
        one none of which was (or that was never queued) is taken back."""
        with self._lock:
            if start < 0:
                return 0
            if self._written > start:
                return min(self._written, end) - start
            at = start - self._written
            del self._queue[at : at + (end - start)]
            return 0

    def _flush(self, deadline: float | None, until: int | None) -> bool:
        """Write the queue up to stream offset ``until`` (all of it: None);
        False when the deadline passed first. Only the turn's holder."""
        while True:
            with self._lock:
                owed = len(self._queue) if until is None else until - self._written
                if owed <= 0:
                    return True
                chunk = bytes(self._queue[: min(owed, _CHUNK)])
            sent = self._send(chunk)
            with self._lock:
                del self._queue[:sent]
                self._written += sent
            if sent == 0 and not self._writable(_left(deadline)):
                return False

    def _flush_left(self) -> None:
        """What was queued while another thread had the turn: a holder flushes
        before letting go, and whoever queued after its flush checks after."""
        while True:
            with self._lock:
                if not self._queue:
                    return
            if not self._turn.acquire(blocking=False):
                return  # the holder's own _flush_left will see it
            self._writing = threading.get_ident()
            try:
                before = self._written
                self._flush(time.monotonic(), None)
                progressed = self._written != before
            finally:
                self._writing = None
                self._turn.release()
            if not progressed:
                return

