"""One kept connection to a database server, for the server backends.

A :class:`Reconnecting` holds the connection a store runs on and the rules of
keeping it, written once for PostgreSQL and MySQL:

* checked with a round trip (the backend's ``alive``) before a call that
  comes after ``idle_check_s`` without one: a server that restarted, or closed
  the connection after its idle timeout (``wait_timeout``,
  ``idle_session_timeout``), leaves a connection the driver still takes for
  open, and the first call of a quiet morning failed on it, its error speaking
  of a write in flight that never was;
* made on first use and made again after it broke; while the server stays
  unreachable, attempts back off (``min_s`` doubling to ``max_s``) and calls in
  between fail at once with ``source_unavailable`` saying when the next attempt
  is, instead of each waiting out a connect timeout. How long the attempt under
  way has run, and since when the connection has been tried again, are kept
  (:class:`Backoff`) for ``streamd status``: a reconnect that the server never
  answers fails no attempt, and showed nothing at all;
* :meth:`sever` cuts the connection under a call that a server no longer
  answers (callable from any thread, never blocking): its socket is shut down
  on a duplicate of its descriptor, so the driver's own stays valid, and the
  call waiting on it fails at once; :meth:`cut` says that this is what happened.
  A call still connecting cannot be cut (the driver's connect has no handle
  until it returns): the connection it makes is closed as soon as it is made,
  and the call fails before any statement, so nothing it was to write is
  written after its caller was told it was cancelled;
* :meth:`close`, and :meth:`abort` for a close that interrupts, end it for good:
  every later :meth:`get` raises ``closed``, and its attempts no longer count
  as a connect under way nor as an outage (:meth:`Backoff.stop`).

What a driver's error means stays with the backend: it gives how to connect,
whether a connection still works, its descriptor, and its words for a failed
connect. No driver import here.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.store.backend import closed_error

__all__ = ["Backoff", "Reconnecting", "boundary", "newest_outage", "reconnecting_s"]

logger = logging.getLogger(__name__)

C = TypeVar("C")
_S = TypeVar("_S")
_P = ParamSpec("_P")
_T = TypeVar("_T")

# Every attempt's outcome in the process, numbered in the order they came:
# which of two connections' last attempts is the newer (their clocks may differ).
_outcomes = itertools.count(1)


class Backoff:
    """Attempts that fail back off: after a failure none is made for
    ``min_s``, doubling with each failure in a row up to ``max_s``; a success
    starts over. Times are ``clock``'s (its owner's: Trio's for the opener,
    the monotonic clock for a connection's worker thread), and only this
    object compares them: they are read, as durations, by any thread."""

    def __init__(
        self, min_s: float, max_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._min_s, self._max_s = min_s, max_s
        self._clock = clock
        self.failures = 0
        """Failed attempts in a row."""
        self._retry_at = 0.0
        self._error = ""
        self._trying_since: float | None = None
        """When the first attempt since the last success began (None: none since)."""
        self._attempt_since: float | None = None
        """When the attempt under way began (None: none is)."""
        self._stopped = False
        """Its connection closed for good: no clock runs from then on."""
        self.failed_at = 0
        """The order number of the last failed attempt (0: none yet)."""
        self.succeeded_at = 0
        """The order number of the last attempt that succeeded (0: none yet)."""
        self.tried_at = 0
        """The order number of the newest attempt's beginning or failure (0: none yet)."""

    @property
    def error(self) -> str | None:
        """The last attempt's error while attempts fail, else None."""
        return self._error if self.failures else None

    def wait(self) -> float:
        """How long until the next attempt is due (0 or less: now)."""
        return self._retry_at - self._clock() if self.failures else 0.0

    def began(self) -> None:
        """An attempt begins (its end is :meth:`failed`, :meth:`succeeded`
        or, for one that came to neither, :meth:`ended`)."""
        now = self._clock()
        self._attempt_since = now
        if self._trying_since is None:
            self._trying_since = now
        self.tried_at = next(_outcomes)

    def failed(self, error: str) -> None:
        now = self._clock()
        self.failures += 1
        self._retry_at = now + min(self._max_s, self._min_s * 2 ** (self.failures - 1))
        self._error = error
        self._attempt_since = None
        if self._trying_since is None:
            self._trying_since = now
        self.failed_at = self.tried_at = next(_outcomes)

    def succeeded(self) -> None:
        self.failures = 0
        self._trying_since = self._attempt_since = None
        self.succeeded_at = next(_outcomes)

    def ended(self) -> None:
        """The attempt under way came to nothing either way (interrupted): it
        no longer runs, and says nothing of the server."""
        self._attempt_since = None

    def stop(self) -> None:
        """Its connection is closed for good (the store closed, even under an
        attempt): nothing tries any more, so no attempt and no outage is under
        way, whatever an attempt still running later does. A store closed
        between two failed attempts otherwise showed an outage growing for
        ever, of a connection nobody would make again. What failed stays
        known (:attr:`error`): it was the server's answer."""
        self._stopped = True
        self._attempt_since = self._trying_since = None

    def attempt_s(self) -> float | None:
        """How long the attempt under way has run, None while none runs."""
        since = self._attempt_since
        return None if since is None or self._stopped else self._clock() - since

    def trying_s(self) -> float | None:
        """How long since the first attempt after the last success began,
        None when there has been none: through failed attempts, the waits
        between them, and one under way."""
        since = self._trying_since
        return None if since is None or self._stopped else self._clock() - since


def newest_outage(attempts: Iterable[Backoff]) -> str | None:
    """The error of the newest failed attempt among the connections to one
    server, unless one of them has connected since: the server is then back.
    A connection that failed while the server was down and has had no call
    since (the writer of a log that only reads, a retention step's) would
    otherwise say the server is gone until something uses it again."""
    every = list(attempts)
    back_at = max((a.succeeded_at for a in every), default=0)
    failing = [a for a in every if a.error is not None and a.failed_at > back_at]
    return max(failing, key=lambda a: a.failed_at).error if failing else None


def reconnecting_s(lost: Iterable[Backoff], others: Iterable[Backoff] = ()) -> float | None:
    """How long the connections ``lost`` (connections that were made, and
    are being made again) have been trying to reach their server: since the
    first attempt of the oldest run of attempts still unanswered, through its
    failures and the waits between them. None while none tries, or once any
    connection to the server (``others`` too) has reached it since that
    run's newest attempt: the server is then back, as for
    :func:`newest_outage`. A connect that never answers is no failure, so
    an outage seen only through errors began to show when the connect timed
    out, never with ``connect_timeout=0``."""
    links = list(lost)
    back_at = max((a.succeeded_at for a in [*links, *others]), default=0)
    trying = [s for a in links if a.tried_at > back_at and (s := a.trying_s()) is not None]
    return max(trying, default=None)


def boundary(
    errors: type[Exception] | tuple[type[Exception], ...],
    link: Callable[[_S], Reconnecting[Any]],
    translate: Callable[[_S, Exception], RpcError],
) -> Callable[[Callable[Concatenate[_S, _P], _T]], Callable[Concatenate[_S, _P], _T]]:
    """A server store's storage boundary, as a decorator of its methods: the
    store's connection made (or ``closed``, or ``source_unavailable`` while it
    backs off) before the method runs, and no driver error (``errors``) out of
    it but as ``translate`` words it (which drops a broken connection, so the
    next call reconnects)."""

    def decorate(fn: Callable[Concatenate[_S, _P], _T]) -> Callable[Concatenate[_S, _P], _T]:
        @functools.wraps(fn)
        def wrapper(store: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            try:
                # Inside: the idle check's round trip can fail like the call.
                link(store).get()
                return fn(store, *args, **kwargs)
            except errors as exc:
                raise translate(store, exc) from None

        return wrapper

    return decorate


class Reconnecting(Generic[C]):
    """See the module docstring."""

    def __init__(
        self,
        *,
        connect: Callable[[], C],
        usable: Callable[[C], bool],
        alive: Callable[[C], object],
        gone: Callable[[C, Exception], bool],
        fileno: Callable[[C], int],
        close: Callable[[C], None],
        refused: Callable[[Exception], RpcError],
        errors: tuple[type[Exception], ...],
        where: str,
        data_key: str,
        min_s: float,
        max_s: float,
        idle_check_s: float = 1.0,
    ) -> None:
        self._connect, self._usable, self._fileno, self._close = connect, usable, fileno, close
        self._alive = alive  # a round trip; raises one of ``errors`` when it fails
        self._gone = gone  # whether such an error means the connection is gone
        self._idle_check_s = idle_check_s
        self._used_at = time.monotonic()
        self._refused = refused  # a failed connect, in the backend's words
        self._errors = errors
        self._where, self._data_key = where, data_key
        self._conn: C | None = None
        self._lock = threading.Lock()  # the slot, between the worker and sever/close
        self._severed: C | None = None
        self._connecting = False  # a get() is in the driver's connect
        self._connect_cut = False  # and sever() was called meanwhile
        self._backoff = Backoff(min_s, max_s)
        self.closed = False
        """Closed, or aborted for a close: every later get() raises ``closed``."""

    @property
    def attempts(self) -> Backoff:
        """Its connection attempts: the last one's error while the server stays
        unreachable, when attempts last failed and succeeded (for
        :func:`newest_outage`), and how long the one under way and the run
        since the last success have taken (for :func:`reconnecting_s`). Read,
        never changed, by others."""
        return self._backoff

    def cut_if_connecting(self) -> bool:
        """If a call is in the driver's connect now, cut it there (what the
        connect makes is closed unused, and the call fails before any
        statement) and say so; else do nothing (False). One step under the
        slot's lock: a connect that ends meanwhile is either cut here or
        adopted, never adopted and then taken for still connecting."""
        with self._lock:
            if self._connecting:
                self._connect_cut = True
            return self._connecting

    @property
    def current(self) -> C | None:
        """The connection now, if any (for a cancel from another thread)."""
        return self._conn

    def adopt(self, conn: C) -> None:
        """Hold ``conn``, opened by the caller (the store's first connection)."""
        with self._lock:
            self._conn = conn

    def get(self) -> C:
        """The connection, made (again) if need be; raises RpcError."""
        if self.closed:
            raise closed_error()
        conn = self._conn
        now = time.monotonic()
        if (conn is not None and conn is not self._severed and self._usable(conn)
                and (now - self._used_at < self._idle_check_s or self._still_alive(conn))):
            self._used_at = now
            return conn
        if conn is not None:
            self.drop()
        wait = self._backoff.wait()
        if wait > 0:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"the event log's {self._where} is unreachable: {self._backoff.error} (next"
                f" reconnect attempt in {int(wait * 1000)} ms)",
                {self._data_key: "reconnecting"},
            )
        caught: tuple[type[Exception], ...] = (*self._errors, RpcError)
        with self._lock:
            self._connecting, self._connect_cut = True, False
        self._backoff.began()
        try:
            conn = self._connect()
        except BaseException as exc:
            with self._lock:
                self._connecting = False
            if not isinstance(exc, caught):
                self._backoff.ended()
                raise
            error = exc if isinstance(exc, RpcError) else self._refused(exc)
            self._backoff.failed(error.message)
            raise error from None
        # One hold of the lock from the connect's end to the connection's
        # adoption: a sever() lands either before (the cut is seen here) or
        # after (it cuts the adopted connection), never between.
        with self._lock:
            self._connecting = False
            if self.closed:
                self._close_quietly(conn)
                raise closed_error()
            if self._connect_cut:
                # The server answered: the outage is over, though this
                # call's connection is closed unused.
                self._backoff.succeeded()
                self._close_quietly(conn)
                raise RpcError(
                    SOURCE_UNAVAILABLE,
                    f"the call was cut while connecting to the event log's {self._where};"
                    " it wrote nothing",
                    {self._data_key: "cut"},
                )
            self._conn = conn
        self._used_at = time.monotonic()
        if self._backoff.failures:
            logger.info("event log reconnected to the %s", self._where)
        self._backoff.succeeded()
        return conn

    def _still_alive(self, conn: C) -> bool:
        """Whether the idle ``conn`` answers; one that is gone is replaced.
        A check that failed otherwise is the call's failure, raised for the
        store to word as it words the call's own, with no reconnect: cut short
        by :meth:`sever` (a cancelled call on a server that stopped
        answering), by a close, or cancelled itself (the cancel of the call
        reached the check's statement)."""
        try:
            self._alive(conn)
        except self._errors as exc:
            if self.closed or conn is self._severed or not self._gone(conn, exc):
                raise
            logger.info("event log: the %s closed an idle connection; connecting again",
                        self._where)
            return False
        return True

    def cut(self) -> bool:
        """Whether the connection now is one :meth:`sever` cut."""
        return self._conn is not None and self._conn is self._severed

    def drop(self) -> None:
        """Close the connection (it broke, or was cut); the next get() makes one."""
        with self._lock:
            conn, self._conn = self._conn, None
            self._severed = None
        if conn is not None:
            self._close_quietly(conn)

    def sever(self) -> None:
        """Cut the connection under the call using it (see the module docstring)."""
        with self._lock:  # the slot cannot be closed (its descriptor reused) meanwhile
            conn = self._conn
            if conn is None or not self._usable(conn):
                self._connect_cut = self._connecting
                return
            self._severed = conn
            caught: tuple[type[Exception], ...] = (*self._errors, OSError)
            try:
                fd = os.dup(self._fileno(conn))
            except caught:
                return
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            return
        with sock:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already disconnected
        logger.warning("event log: the %s did not answer; its connection was cut", self._where)

    def abort(self) -> None:
        """End it for a close while a call may still run on the connection
        (which is left to that call, or to :meth:`sever`)."""
        self.closed = True
        self._backoff.stop()

    def close(self) -> None:
        self.closed = True
        self._backoff.stop()
        with self._lock:
            conn, self._conn = self._conn, None
            self._severed = None
        if conn is not None:
            self._close_quietly(conn)

    def _close_quietly(self, conn: C) -> None:
        try:
            self._close(conn)
        except self._errors:
            pass
