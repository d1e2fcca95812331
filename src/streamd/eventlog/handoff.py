"""A connection made on a worker thread for a caller that may stop waiting.

A driver's connect cannot be interrupted, and a server that accepts a
connection and never answers it holds the connect for the whole connect
timeout (psycopg's 130 s, or for ever with MySQL's client, when the address
says ``connect_timeout=0``). A caller that waited for it (a close, a Ctrl-C,
a client's cancel) waited as long. :func:`made_on_thread` lets the caller
leave at once: the connect goes on on its thread, and what it makes is closed
there when it is made, since nobody is left to take it. Whichever of the two
comes second, the connect's end or the caller's leaving, closes it: a
connection is never left open, and never closed while its thread still uses
it.

A connect left running keeps its thread, and the thread kept a token of
Trio's default thread limiter (40 for the whole process) until the driver
gave up: a process that opened and closed logs against such a server 40
times had every later ``trio.to_thread.run_sync`` of it (any log's reads,
anything) wait for ever. So connects take tokens of a limiter of their own
(:data:`CONNECTS` per run), and the connects left running are counted
process-wide (:class:`LeftRunning`): past :data:`MAX_LEFT` of them, a connect
is refused at once, naming the server, rather than stacking another thread
(nor, past the limiter's tokens, waiting for one that may never come back).

That refusal alone did not bound the threads: it looks at connects already
left, and every connect under way may be left next (a daemon's stop leaves
them all at once). With 40 tokens per run, 40 connects abandoned together to
a frozen server kept 40 threads, and a later Trio run of the process (or one
beside it on another thread), finding fewer than 16 left, started 40 more. So
the bound is on the threads themselves: a thread connects only while fewer
than :data:`MAX_LEFT` threads of the process are connecting
(:meth:`LeftRunning.begin`), and a run lends no more tokens than that, so its
own connects wait for one another rather than be refused. Threads left on a
frozen server are therefore :data:`MAX_LEFT` at most, whatever the runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

from streamd.errors import SOURCE_UNAVAILABLE, RpcError

__all__ = [
    "CONNECTS",
    "MAX_LEFT",
    "Abandonable",
    "LeftRunning",
    "left_running",
    "made_on_thread",
    "run_limiter",
]

_C = TypeVar("_C")

MAX_LEFT = 16
"""Threads connecting at once in the process, whether their callers still
wait for them or not, and so the most a server that never answers can hold
(one thread each, until it answers or the connect times out). From this many
left running (their callers gone) on, a connect is refused at once."""

CONNECTS = MAX_LEFT
"""Connects running at once in one Trio run: more could only be refused on
their threads, where a run's own connects are better queued."""

_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("streamd_connects")


def run_limiter(
    var: trio.lowlevel.RunVar[trio.CapacityLimiter], tokens: int
) -> trio.CapacityLimiter:
    """``var``'s limiter of ``tokens`` in this run, made at its first use.
    Per run, as Trio's default one is: a token held by a thread that
    outlives its run would otherwise be lost to every later run."""
    try:
        return var.get()
    except LookupError:
        limiter = trio.CapacityLimiter(tokens)
        var.set(limiter)
        return limiter


class LeftRunning:
    """The threads of one kind of work on servers (connects, cancel
    requests), process-wide; any thread. :attr:`limit` bounds those in the
    work at once (:meth:`begin`), and of them, those whose callers left are
    counted by server (its description: never a password)."""

    def __init__(self, limit: int = MAX_LEFT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._by_server: dict[str, int] = {}
        self._busy = 0  # threads in the work, left or not

    @property
    def count(self) -> int:
        """Threads whose callers left, still in the work."""
        with self._lock:
            return sum(self._by_server.values())

    @property
    def busy(self) -> int:
        """Threads in the work, whether their callers wait or not."""
        with self._lock:
            return self._busy

    def begin(self) -> bool:
        """On a thread, as its work begins: whether it may (fewer than
        :attr:`limit` are in such work); if so it is in it until
        :meth:`finish`. Checked and taken in one step, so threads of runs
        that share no limiter cannot overshoot it together."""
        with self._lock:
            if self._busy >= self.limit:
                return False
            self._busy += 1
            return True

    def finish(self, where: str, counted: bool) -> None:
        """The work :meth:`begin` let in is over; ``counted``: it had been
        counted left running (:meth:`add`), and is counted out."""
        with self._lock:
            self._busy -= 1
            if counted:
                self._drop(where)

    def check(self, where: str) -> None:
        """Refuse a connect to ``where`` while :attr:`limit` are left running."""
        with self._lock:
            total = sum(self._by_server.values())
            here = self._by_server.get(where, 0)
        if total >= self.limit:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"not connecting to {where}: {total} connects whose callers left still wait"
                f" for a server that does not answer ({here} of them for this one); each"
                " ends when its connect times out, if it ever does",
                {"reason": "connects_left_running", "left_running": total},
            )

    def add(self, where: str) -> None:
        with self._lock:
            self._by_server[where] = self._by_server.get(where, 0) + 1

    def _drop(self, where: str) -> None:
        left = self._by_server[where] - 1
        if left:
            self._by_server[where] = left
        else:
            del self._by_server[where]

    def busy_error(self, where: str) -> RpcError:
        """A connect to ``where`` refused on its thread: :attr:`limit`
        threads of the process are connecting."""
        with self._lock:
            busy, total = self._busy, sum(self._by_server.values())
        return RpcError(
            SOURCE_UNAVAILABLE,
            f"not connecting to {where}: {busy} connects of the process are under way"
            f" ({total} of them left by their callers, waiting for a server that does not"
            " answer); each ends when its server answers or its connect times out",
            {"reason": "connects_left_running", "left_running": total},
        )


left_running = LeftRunning()
"""The process's: its threads are the process's, whichever run left them."""


async def made_on_thread(make: Callable[[], _C], close: Callable[[_C], None], where: str) -> _C:
    """``make()`` (a connect to ``where``, a description without secrets) on a
    worker thread; cancelled (or interrupted), the caller returns at once and
    ``close`` is called on what ``make`` returns, when it does. ``make``'s
    error is the caller's, if it still waits. Refused (RpcError) while
    :data:`MAX_LEFT` connects are left running, and on its thread while
    :data:`MAX_LEFT` of the process's threads are connecting (other runs')."""
    running = left_running  # the one counted in, whatever replaces it meanwhile
    running.check(where)
    handoff = _Handoff(make, close, running, where)
    try:
        return await trio.to_thread.run_sync(
            handoff.make, abandon_on_cancel=True, limiter=run_limiter(_limiter, CONNECTS))
    except BaseException:
        handoff.leave()
        raise


class Abandonable:
    """One worker thread's work, and whether its caller still waits for it:
    work a caller left while it ran is counted in ``running`` until it ends,
    and work that never began is never counted (a caller cancelled while it
    waited for a token has no thread to come and count it out), nor done: a
    thread that begins after its caller left returns at once. Subclasses
    hold what else the caller and the thread hand over, under the same lock."""

    def __init__(self, running: LeftRunning, where: str) -> None:
        self._running, self._where = running, where
        self._lock = threading.Lock()
        self._left = False  # the caller stopped waiting
        self._started = False  # the work has begun on its thread
        self._ended = False  # the work has returned or raised
        self._counted = False  # in self._running: left while the work ran

    def _begin(self) -> bool:
        """On the thread, holding the lock: whether the work begins (its
        caller still waits, and the process has room for one more thread in
        such work); if so it has."""
        if self._left or not self._running.begin():
            return False
        self._started = True
        return True

    def _end(self) -> None:
        """On the thread, the work over: counted out if it was counted in."""
        with self._lock:
            self._ended = True
            counted, self._counted = self._counted, False
        self._running.finish(self._where, counted)

    def _count_left(self) -> None:
        """Holding the lock, as the caller leaves: work under way is counted."""
        self._left = True
        if self._started and not self._ended and not self._counted:
            self._counted = True
            self._running.add(self._where)


class _Handoff(Abandonable, Generic[_C]):
    def __init__(self, make: Callable[[], _C], close: Callable[[_C], None],
                 running: LeftRunning, where: str) -> None:
        super().__init__(running, where)
        self._make, self._close = make, close
        self._made: list[_C] = []  # made, and not yet taken by the caller

    def make(self) -> _C:
        """On the thread: the value, closed here if the caller has left. A
        caller that left before the thread began (a thread started late, on
        a loaded machine) has nothing made: a connect for nobody would hold
        its thread as long as the server leaves it unanswered, then close
        what it made."""
        with self._lock:
            left, began = self._left, self._begin()
        if not began:
            if left:
                raise RpcError(SOURCE_UNAVAILABLE, f"not connecting to {self._where}: the"
                               " caller left before the connect began")  # seen by nobody
            raise self._running.busy_error(self._where)
        try:
            made = self._make()
        except BaseException:
            self._end()
            raise
        with self._lock:
            kept = not self._left
            if kept:
                # Ended as far as a leave is concerned: it closes what it takes.
                self._made.append(made)
                self._ended = True
        if kept:
            self._running.finish(self._where, counted=False)
            return made
        try:
            self._close(made)
        finally:
            # Counted out even when the close fails: else counted for good.
            self._end()
        return made

    def leave(self) -> None:
        """The caller stops waiting: a value already made is closed here."""
        with self._lock:
            made, self._made = self._made, []
            self._count_left()
        for value in made:
            self._close(value)
