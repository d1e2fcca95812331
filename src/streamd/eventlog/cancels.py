"""Requests to cancel a statement on a database server, on threads of their own.

A cancelled call's statement is cancelled on the server by a request that goes
out on a connection of its own (PostgreSQL's cancel request, MySQL's ``KILL
QUERY``), from a worker thread. A server that accepts that connection and
never answers it (stopped, a hung host) holds the thread for the request's
whole timeout: 2 s, or the grace the call is given (``unresponsive_s``). They
ran on Trio's default thread limiter, whose 40 tokens every
``trio.to_thread.run_sync`` of the process shares (Recall's builds, the stdio
transport's reads, a connection's close, every other log's work): 40 calls
cancelled at once on such a server (a stop of a daemon hosting several logs,
clients' deadlines passing together) took all 40 for those 2 s, and unrelated
work waited as long (measured: a ``trio.to_thread.run_sync(lambda: None)``
waited 2.0 s behind 40 cancels to a PostgreSQL server that did not answer
them, none behind 39); a 41st cancel did not get a thread before its grace
ran out, and was never sent.

So cancels take tokens of a limiter of their own (:data:`CANCELS` per run,
as :mod:`~streamd.eventlog.handoff` does for connects). A cancel whose caller
stops waiting (its grace ran out: the call's connection is cut then anyway)
leaves its thread to end on its own, and so does a close's, which nobody
waits for; such threads are counted process-wide (:data:`left_running`), and
while :data:`MAX_LEFT` of them still wait for a server, a cancel is not sent
at all: the call is left to the cut at the end of its grace, which needs no
thread, rather than another thread stacked on a server that answers none.
As for connects, the bound is on the threads sending (left or not, of every
run): 40 calls cancelled together on a frozen server kept 40 threads on it,
with 40 tokens a run. A cancel past the bound waits for a token, or is not
sent when the bound is held by threads outside this run's limiter: other
runs' cancels, or a close's (:func:`send_unwaited`, this run's too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import trio

from streamd.eventlog.handoff import Abandonable, LeftRunning, run_limiter

__all__ = ["CANCELS", "MAX_LEFT", "left_running", "send", "send_unwaited"]

logger = logging.getLogger(__name__)

MAX_LEFT = 16
"""Cancel requests on their way at once in the process, whether their
callers still wait for them or not, and so the most threads a server that
never answers can hold (one each, until it answers or the request times
out). From this many left running (their callers gone, or a close's) on,
none is sent."""

CANCELS = MAX_LEFT
"""Cancel requests running at once in one Trio run: a run's own waited
cancels past the bound wait for a token rather than go unsent (a close's
take none, and count against the process's bound all the same)."""

_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("streamd_cancels")

left_running = LeftRunning(MAX_LEFT)
"""The process's: its threads are the process's, whichever run left them."""


def _refused(running: LeftRunning, where: str) -> bool:
    """Whether a cancel to ``where`` is not to be sent (logged when so)."""
    if running.count < running.limit:
        return False
    logger.warning(
        "not sending a cancel to the %s: %d cancels sent earlier still wait for a server"
        " that does not answer; the call is cut at the end of its grace instead",
        where, running.count)
    return True


async def send(cancel: Callable[[], None], where: str) -> bool:
    """``cancel()`` (a request to the server ``where``, a description without
    secrets) on a thread of the cancels' limiter; True once it returned.
    Cancelled, the caller leaves at once and the thread, left to end on its
    own, is counted in :data:`left_running` until it does. False, with nothing
    sent, while :data:`MAX_LEFT` are left, or on their way outside this
    run's limiter (other runs', closes')."""
    running = left_running  # the one counted in, whatever replaces it meanwhile
    if _refused(running, where):
        return False
    request = _Request(cancel, running, where)
    try:
        return await trio.to_thread.run_sync(
            request.run, abandon_on_cancel=True, limiter=run_limiter(_limiter, CANCELS))
    except BaseException:
        request.leave()
        raise


def send_unwaited(cancel: Callable[[], None], where: str) -> bool:
    """``cancel()`` on a thread that nobody waits for (a close's, from the
    Trio thread, which must never wait on the network), counted in
    :data:`left_running` from the start; False, with nothing sent, while
    :data:`MAX_LEFT` are left, or on their way."""
    running = left_running
    if _refused(running, where):
        return False
    if not running.begin():
        _unsent(running, where)
        return False
    running.add(where)

    def run() -> None:
        try:
            cancel()
        finally:
            running.finish(where, counted=True)

    try:
        threading.Thread(target=run, name="streamd-cancel", daemon=True).start()
    except BaseException:
        running.finish(where, counted=True)
        raise
    return True


def _unsent(running: LeftRunning, where: str) -> None:
    logger.warning(
        "not sending a cancel to the %s: %d cancels of the process are on their way already;"
        " the call is cut at the end of its grace instead", where, running.busy)


class _Request(Abandonable):
    """One cancel's thread, and whether its caller still waits for it."""

    def __init__(self, cancel: Callable[[], None], running: LeftRunning, where: str) -> None:
        super().__init__(running, where)
        self._cancel = cancel

    def run(self) -> bool:
        """On the thread: whether it was sent. A request whose caller left
        before it began is not: the call it was for has been cut, or is
        being; nor is one past the process's bound (held by other runs'
        requests, or by closes' unwaited ones)."""
        with self._lock:
            left, began = self._left, self._begin()
        if not began:
            if not left:
                _unsent(self._running, self._where)
            return False
        try:
            self._cancel()
        finally:
            self._end()
        return True

    def leave(self) -> None:
        """The caller stops waiting: a request under way is counted until it ends."""
        with self._lock:
            self._count_left()
