"""The blocking client: plain threads, no event loop.

Any number of threads may share one :class:`Client`. A reader thread owns the
receiving side and feeds the protocol core; each call waits on its own slot for
the answer the reader routes to it, so a slow call (a watch, a long read) never
holds up another thread's. Writes are whole frames, one thread at a time,
each bounded by its call's deadline even when the daemon stops reading
(:mod:`~streamd.client.frames_out`). A call given a ``timeout`` (or
interrupted, KeyboardInterrupt included) sends ``$/cancelRequest`` before it
raises, so the daemon stops working on it.

A client is its process's: a child forked after it was opened inherits the
connection but not the reader thread, so the child's call went to the parent's
connection, its answer was read (and dropped, or handed to a parent's call of
the same id) by the parent, and the child waited for ever; the child's close
shut the parent's connection down. In a child, calls and inherited watches
are refused (``closed``, reason ``forked``) with nothing sent, and close only
lets go of the child's copies of the descriptors. The client's locks are free
in a child whatever the parent's threads held at the fork
(:mod:`streamd.forks`): a child forked while the reader took an answer waited
for ever in its close.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from streamd import errors, forks
from streamd.client import calls
from streamd.client.frames_out import FrameWriter, Outlet, pipe_outlet, socket_outlet
from streamd.client.protocol import (
    DEFAULT_WATCH_BUDGET,
    Call,
    ClientProtocol,
    Garbled,
    LockLost,
    Reply,
    WatchUpdated,
)
from streamd.client.transport import (
    EXIT_GRACE,
    START_TIMEOUT,
    forked_error,
    open_daemon_socket,
    open_socket,
    stdio_command,
)
from streamd.errors import RpcError
from streamd.eventlog.model import (
    DEFAULT_STALE_AFTER_MS,
    BootRecentResult,
    Entry,
    Filter,
    SessionWithEvents,
    WatchParams,
    WatchResult,
)

__all__ = ["Client", "Lease", "Watch"]

log = logging.getLogger("streamd.client")

T = TypeVar("T")

# Large: a 2,000-event session is a 1.5 MB answer, and every read is a wakeup.
_READ_CHUNK = 1 << 20
# How long a call whose request could not be sent waits for the daemon's
# last words (a refusal) before it reports the broken connection itself.
REFUSAL_WAIT_S = 1.0


class _Slot:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Reply | None = None


class Client(calls.EventLogMethods):
    """A blocking client of the streamd daemon; see the module docstring.

    Open one with :meth:`connect` (the resident daemon, started when none
    runs), :meth:`connect_socket` (``streamd serve --socket``) or :meth:`spawn`
    (a ``streamd`` of its own on stdio), and close it (or use it as a context
    manager). Every method raises :class:`~streamd.errors.RpcError` with the
    daemon's code; once the connection is gone, ``closed``.
    """

    def __init__(
        self,
        send: Outlet,
        receive: Callable[[], bytes],
        close: Callable[[], None],
        leftover: bytes = b"",
        release: Callable[[], None] = lambda: None,
    ) -> None:
        """``send`` writes without blocking (see
        :mod:`~streamd.client.frames_out`), so that a daemon that stops
        reading cannot hold a call past its timeout; ``close`` ends the
        connection so that ``receive`` returns end of input; ``release``
        frees what is left once the reader has stopped (a descriptor closed
        under a thread still reading it could be reused by another file, and
        the reader would read that)."""
        self._writer = FrameWriter(send)
        self._receive = receive
        self._close = close
        self._release_transport = release
        self._core = ClientProtocol()
        self._lock = threading.Lock()  # guards the core and the tables below
        self._slots: dict[int, _Slot] = {}
        self._watches: dict[int, threading.Condition] = {}
        self._leases: dict[str, Lease] = {}
        self._closed = False
        self._pid = os.getpid()  # the process whose connection this is
        forks.in_child(self, Client._forked_child)
        self.process: subprocess.Popen[bytes] | None = None
        """The ``streamd`` process of a :meth:`spawn` client (None otherwise)."""
        if leftover:
            self._feed(leftover)
        self._reader = threading.Thread(target=self._read, name="streamd-client", daemon=True)
        self._reader.start()

    # -- opening --

    @classmethod
    def connect(
        cls,
        runtime_dir: str | None = None,
        *,
        start_daemon: bool = True,
        daemon_args: Sequence[str] = (),
        start_timeout: float = START_TIMEOUT,
    ) -> Client:
        """The resident daemon of this user (``$STREAMD_RUNTIME_DIR``, ...),
        started with ``streamd daemon DAEMON_ARGS`` when none answers."""
        sock, leftover = open_daemon_socket(
            runtime_dir,
            start_daemon=start_daemon,
            daemon_args=daemon_args,
            start_timeout=start_timeout,
        )
        return cls._over_socket(sock, leftover)

    @classmethod
    def connect_socket(cls, path: str) -> Client:
        return cls._over_socket(open_socket(path), b"")

    @classmethod
    def _over_socket(cls, sock: Any, leftover: bytes) -> Client:
        def close() -> None:
            try:
                sock.shutdown(2)  # wakes the reader with end of input
            except OSError:
                pass

        return cls(
            socket_outlet(sock), lambda: sock.recv(_READ_CHUNK), close, leftover, sock.close
        )

    @classmethod
    def spawn(
        cls, args: Sequence[str] = (), *, stderr: Any = None, exit_grace: float = EXIT_GRACE
    ) -> Client:
        """A ``streamd`` process of this client's own, on stdio (``args``: serve
        options, ``--db PATH`` first of all). Closing the client ends its input,
        and it exits once it has closed the log; one not gone after
        ``exit_grace`` seconds is killed (see
        :data:`~streamd.client.transport.EXIT_GRACE`)."""
        proc = subprocess.Popen(
            stdio_command(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        outlet, close_stdin = pipe_outlet(stdin)

        def close() -> None:
            try:
                close_stdin()  # end of input: the daemon closes the log and exits
            except OSError:
                pass
            try:
                proc.wait(exit_grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

        def release() -> None:
            # Closed already, unless a forked child lets go of its copies:
            # its copy of stdin kept open would hold the daemon's input open.
            try:
                close_stdin()
            except OSError:
                pass
            stdout.close()

        client = cls(
            outlet,
            lambda: os.read(stdout.fileno(), _READ_CHUNK),
            close,
            release=release,
        )
        client.process = proc
        return client

    def close(self) -> None:
        """End the connection: calls in flight fail with ``closed``, the daemon
        releases this connection's leases. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._forked():
            self._release_transport()  # the connection itself is the parent's
            return
        self._close()
        if threading.current_thread() is not self._reader:
            self._reader.join()
            self._release_transport()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls --

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (cancelled ones until their answer);
        in a forked child, none (those are the parent's)."""
        if self._forked():
            return 0
        with self._lock:
            return self._core.in_flight

    def call(self, call: Call[T], timeout: float | None = None) -> T:
        """Send one call and wait for its answer; on ``timeout`` (seconds) or an
        interruption, cancel it on the daemon and raise (TimeoutError)."""
        self._refuse_if_forked()
        deadline = None if timeout is None else time.monotonic() + timeout
        slot = _Slot()
        with self._lock:
            request_id, frame = self._core.start(call)
            self._slots[request_id] = slot
        try:
            try:
                self._send(frame, deadline, request_id)
            except TimeoutError:
                raise TimeoutError(
                    f"{call.method}: the daemon did not take the request within {timeout:g} s;"
                    " cancelled"
                ) from None
            except RpcError:
                # A daemon that refused the connection closes it after saying
                # why, maybe before this request went out: the reader's end of
                # input answers the call with what it said.
                if not slot.done.wait(REFUSAL_WAIT_S):
                    raise
            if not slot.done.wait(None if deadline is None else deadline - time.monotonic()):
                raise TimeoutError(f"{call.method}: no answer within {timeout:g} s; cancelled")
        except BaseException:
            self._abandon(request_id)
            raise
        assert slot.reply is not None
        if slot.reply.error is not None:
            raise slot.reply.error
        return slot.reply.value

    def _forked(self) -> bool:
        return os.getpid() != self._pid

    def _forked_child(self) -> None:
        """In a forked child: a lock the reader held at the fork stays held,
        and the watches' waits are the parent's (the child's are refused)."""
        self._lock = threading.Lock()
        self._watches = {}

    def _refuse_if_forked(self) -> None:
        if self._forked():
            raise forked_error(self._pid)

    def _abandon(self, request_id: int) -> None:
        with self._lock:
            self._slots.pop(request_id, None)
            frame = self._core.cancel(request_id)
        if frame is not None:
            self._send_soon(frame)

    def _send(self, frame: bytes, deadline: float | None, request_id: int) -> None:
        """Write a request's frame by ``deadline`` (TimeoutError); one none of
        which went is taken back from the core, as never sent."""

        def withdrawn() -> None:
            with self._lock:
                self._core.withdraw(request_id)

        try:
            self._writer.write(frame, deadline, withdrawn)
        except TimeoutError:
            raise  # an OSError too, but not a broken connection
        except (OSError, ValueError) as exc:
            raise RpcError(
                errors.CLOSED, f"connection to the streamd daemon closed: {exc}"
            ) from None

    def _send_soon(self, frame: bytes) -> None:
        """A notification (a cancel), written as far as it goes without
        waiting: the reader sends these, and must never wait on the daemon."""
        if self._forked():
            return  # it would cancel the parent's request of that id
        try:
            self._writer.write_soon(frame)
        except (OSError, ValueError):
            pass  # gone: nothing left to cancel

    # -- the reader --

    def _read(self) -> None:
        while True:
            try:
                data = self._receive()
            except (OSError, ValueError):
                data = b""
            self._feed(data)
            if not data:
                return

    def _feed(self, data: bytes) -> None:
        with self._lock:
            events, outgoing = self._core.receive(data)
            wake: list[Any] = []
            for event in events:
                match event:
                    case Reply(id=request_id):
                        slot = self._slots.pop(request_id, None)
                        if slot is not None:
                            slot.reply = event
                            wake.append(slot.done)
                    case WatchUpdated(id=watch_id):
                        cond = self._watches.get(watch_id)
                        if cond is not None:
                            cond.notify_all()
                    case LockLost(lock=lock):
                        lease = self._leases.pop(lock, None)
                        if lease is not None:
                            wake.append(lease.lost)
                    case Garbled(why=why):
                        log.warning("streamd client: %s", why)
        for done in wake:
            done.set()
        for frame in outgoing:
            self._send_soon(frame)

    # -- the event log --

    def get_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        after_seq: int = 0,
        recent: int | None = None,
        after_time: _dt.datetime | None = None,
        scoped_state: bool = False,
        event_time: bool = False,
    ) -> SessionWithEvents:
        """The session with its events, whole: an answer cut by the reply budget
        is continued (see :class:`~streamd.client.calls.SessionAssembler`)."""
        first = calls.get_session(
            app, user, session, after_seq=after_seq, recent=recent, after_time=after_time,
            scoped_state=scoped_state, event_time=event_time,
        )
        whole = calls.SessionAssembler(first)
        call: Call[SessionWithEvents] | None = first
        while call is not None:
            call = whole.feed(self.call(call))
        assert whole.result is not None
        return whole.result

    def recent_boots(self, since: _dt.datetime) -> BootRecentResult:
        """Every boot at or after ``since``, oldest first (the pages the
        reply budget cuts them into, read one after another)."""
        whole = calls.BootsAssembler(since)
        call: Call[BootRecentResult] | None = calls.recent_boots(since)
        while call is not None:
            call = whole.feed(self.call(call))
        assert whole.result is not None
        return whole.result

    def watch(
        self, from_seq: int = 0, filter: Filter | None = None, *, budget: int = DEFAULT_WATCH_BUDGET
    ) -> Watch:
        """Follow the log from ``from_seq`` (see :class:`Watch`)."""
        self._refuse_if_forked()
        cond = threading.Condition(self._lock)
        with self._lock:
            watch_id, frame = self._core.start_watch(
                WatchParams(from_seq=from_seq, filter=filter), budget
            )
            self._watches[watch_id] = cond
        try:
            self._send(frame, None, watch_id)
        except BaseException:
            self.watch_close(watch_id)
            raise
        return Watch(self, watch_id)

    def watch_next(
        self, watch_id: int, timeout: float | None = None
    ) -> tuple[Entry | RpcError | WatchResult | None, int]:
        """The watch's next step and the seq to resume from, waiting at most
        ``timeout`` seconds (TimeoutError); None once the watch is closed.
        (For :class:`Watch`.)"""
        self._refuse_if_forked()  # its entries go to the parent's reader
        with self._lock:
            while True:
                cond = self._watches.get(watch_id)
                if cond is None:
                    return None, 0
                item = self._core.take(watch_id)
                if item is not None:
                    return item, self._core.last_seq(watch_id)
                if not cond.wait(timeout):
                    raise TimeoutError(f"no entry within {timeout:g} s")

    def watch_close(self, watch_id: int) -> None:
        """Let go of a watch: cancel it on the daemon, wake a thread waiting
        on it. Idempotent. (For :class:`Watch`.)"""
        with self._lock:
            cond = self._watches.pop(watch_id, None)
            if cond is not None:
                cond.notify_all()
            frame = self._core.cancel(watch_id)
            self._core.forget_watch(watch_id)
        if frame is not None:
            self._send_soon(frame)

    @property
    def held_leases(self) -> frozenset[str]:
        """The locks of the leases held through this connection, not yet lost
        or released."""
        with self._lock:
            return frozenset(self._leases)

    def acquire_lock(
        self,
        app: str,
        user: str,
        session: str,
        *,
        stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
        heartbeat_ms: int | None = None,
    ) -> Lease:
        """Take the session's lease; the daemon keeps it fresh while this
        connection lives. ``session_locked`` while another holder's is fresh."""
        got = self.call(
            calls.lock_acquire(
                app, user, session, stale_after_ms=stale_after_ms, heartbeat_ms=heartbeat_ms
            )
        )
        lease = Lease(self, got.lock, got.holder)
        with self._lock:
            if self._core.closed:
                lease.lost.set()
            else:
                self._leases[got.lock] = lease
                self._core.lease_acquired(got.lock)
        return lease

    def release_lease(self, lease: Lease) -> None:
        """Release ``lease`` (what :meth:`Lease.release` does)."""
        with self._lock:
            self._leases.pop(lease.lock, None)
            self._core.lease_released(lease.lock)
        self.call(calls.lock_release(lease.lock))


class Watch:
    """A blocking iterator over the entries of ``eventlog/watch``: history from
    ``from_seq``, then live, each once and in seq order. It ends with
    StopIteration when the daemon shuts down, raises the watch's error
    otherwise (``closed``, ``budget_exceeded`` for a consumer that fell behind:
    its data names the seq to resume from). Close it (or leave its ``with``
    block) to cancel it on the daemon; :attr:`last_seq` is where to resume."""

    def __init__(self, client: Client, watch_id: int) -> None:
        self._client = client
        self._id = watch_id
        self.last_seq = 0
        self.result: WatchResult | None = None
        self._closed = False

    def __iter__(self) -> Iterator[Entry]:
        return self

    def __next__(self) -> Entry:
        return self.next()

    def next(self, timeout: float | None = None) -> Entry:
        """The next entry, waiting at most ``timeout`` seconds (TimeoutError)."""
        if self._closed:
            raise StopIteration
        item, last_seq = self._client.watch_next(self._id, timeout)
        if item is None or self._closed:
            raise StopIteration
        self.last_seq = last_seq
        if isinstance(item, Entry):
            return item
        if isinstance(item, WatchResult):
            self.result = item
            raise StopIteration
        raise item

    def close(self) -> None:
        """Cancel the watch on the daemon (idempotent)."""
        if not self._closed:
            self._closed = True
            self._client.watch_close(self._id)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Lease:
    """A session lease held through this client's connection. :attr:`lost` is
    set when the daemon reports it stolen (``eventlog/lock_lost``) or the
    connection ends (the daemon releases a connection's leases): whoever works
    under the lease must stop then. A clean :meth:`release` never sets it."""

    def __init__(self, client: Client, lock: str, holder: str) -> None:
        self.lock = lock
        self.holder = holder
        self.lost = threading.Event()
        self._client = client

    def release(self) -> None:
        self._client.release_lease(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.lost.is_set():
            self.release()
