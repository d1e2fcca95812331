"""The ADK service's life: open, then closing, then closed for good.

A service is used from several event loops at once (ADK's ``Runner.run``
runs each turn on a loop of its own, in a thread), and ``close`` may come from
any of them while calls run on the others. The rules:

* **Once close has begun, every call is refused** (``closed``, ``data.reason``
  :data:`SERVICE_CLOSED`), on every loop, and nothing is opened again: the
  call that used to find its client closed connected anew (or opened the file
  again), and held that connection or file past the close. A flush is the
  exception: close does its work, so a flush after it returns once the close
  has (:meth:`Lifetime.run_unless_closing`).
* **A call in flight when close begins is waited for** (for at most
  :data:`CLOSE_GRACE` seconds), so an append in flight is answered and
  stored, as if close had come after it. One that the grace cuts short (a
  daemon that stopped answering) fails saying its outcome is unknown
  (:func:`cut_short`): an append may have been stored without its answer.
* **A second close waits for the first**, from any loop, and returns once
  every client is closed.
* **A cancelled close still closes** (:func:`close_shielded`): cancelling
  its caller (``asyncio.timeout`` around it, Ctrl-C in a teardown) used to
  close the clients under write-behind's send, and drop without a word the
  events ``append_event`` had acknowledged. The close goes on, shielded, for
  at most :data:`CLOSE_GRACE` seconds more; then its sends are stopped, the
  clients closed, and what was not stored is logged at error level with its
  count (and noted on the ``CancelledError``). The cancellation is raised
  once the close has ended.

This module counts the calls in flight and tells closes apart; the service
closes its clients (:mod:`~streamd.adk.clients`) and its queues.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from streamd import errors, forks
from streamd.adk import write_behind
from streamd.errors import RpcError

__all__ = [
    "CLOSE_GRACE", "SERVICE_CLOSED", "Lifetime", "close_shielded", "cut_short", "said_at_exit",
    "service_closed", "unsent",
]

log = logging.getLogger("streamd.adk")

_T = TypeVar("_T")

CLOSE_GRACE = 5.0
"""How long a close waits for the calls in flight (and for the clients of
other loops to close), in seconds: a daemon answers an append in
milliseconds, and one stopped (SIGSTOP) would otherwise hold the close for
ever."""

SERVICE_CLOSED = "service_closed"
"""``data.reason`` of a call refused, or cut short, because the service was closed."""


def service_closed() -> RpcError:
    """The refusal of a call made once the service's close has begun."""
    return RpcError(
        errors.CLOSED,
        "this StreamdSessionService is closed: nothing was sent (make a new service to go"
        " on)",
        {"reason": SERVICE_CLOSED},
    )


def cut_short(exc: RpcError) -> RpcError:
    """A call in flight that the service's close cut short, after the grace:
    its outcome is unknown."""
    return RpcError(
        errors.CLOSED,
        "this StreamdSessionService was closed before the log answered this call"
        f" ({exc.message}): whether it took effect is unknown. An append may have been"
        " stored: a new service's get_session shows it, and the same event appended again"
        " is stored once",
        {"reason": SERVICE_CLOSED, "outcome": "unknown"},
    )


def unsent(count: int, exc: Exception) -> RpcError:
    """A close whose write-behind queue could not be sent: those events are
    not stored, and no later call of the service sends them."""
    return RpcError(
        errors.CLOSED,
        f"this StreamdSessionService closed with {count} queued"
        f" event{'' if count == 1 else 's'} it could not send ({exc}): not stored",
        {"reason": SERVICE_CLOSED, "unsent": count},
    )


async def close_shielded(
    close: Coroutine[Any, Any, None], pipes: Callable[[], Iterable[write_behind.Pipeline]],
) -> None:
    """``close``, the first close's work, run to its end even when the
    caller is cancelled (see the module docstring); ``pipes``, write-behind's
    queues. Only a second cancellation stops the waiting; the close still
    ends on its own, as bounded as before."""
    here = asyncio.get_running_loop()
    closing = asyncio.ensure_future(close)
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError as cancelled:
        done, _ = await asyncio.wait([closing], timeout=CLOSE_GRACE)
        if not done:
            write_behind.stop_sending(pipes(), here)  # their runs go back in line
            await asyncio.wait([closing])
        failed = None if closing.cancelled() else closing.exception()
        left = write_behind.unsent(pipes())
        if left:
            said = (f"a cancelled close of a StreamdSessionService gave up on {left} queued"
                    f" event{'' if left == 1 else 's'} after {CLOSE_GRACE} seconds: not stored")
            log.error("%s", said)
            cancelled.add_note(said)
        elif failed is not None:  # raised by the close, which no one awaits now
            log.error("a cancelled close of a StreamdSessionService failed: %s", failed)
            cancelled.add_note(f"the close failed: {failed}")
        raise


class Lifetime:
    """Whether the service is open, and its calls in flight on every loop
    (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = False
        self._calls = 0  # calls in flight, on every loop
        # Closes waiting for the calls in flight to end, each on its loop.
        self._idle: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # Done once the first close has closed everything.
        self._closed: concurrent.futures.Future[None] = concurrent.futures.Future()
        forks.in_child(self, Lifetime._forked)

    @property
    def closing(self) -> bool:
        """Whether close has begun (calls are refused from then on)."""
        return self._closing

    async def run(self, call: Coroutine[Any, Any, _T]) -> _T:
        """``call``, one call of the service: refused once close has begun
        (never started), waited for by a close that begins while it runs,
        and, cut short by that close, saying its outcome is unknown."""
        if not self._admitted():
            call.close()
            raise service_closed()
        return await self._counted(call)

    async def run_unless_closing(self, call: Coroutine[Any, Any, None]) -> None:
        """``call`` as :meth:`run`; once close has begun, not run, and this
        returns when that close has: for a call whose work the close does
        itself (a flush: close sends what is queued, and says what it could
        not), so that the order of the two does not matter (ADK's
        ``Runner.close`` flushes its service, which may be closed already)."""
        if not self._admitted():
            call.close()
            await self.first_close_done()
            return
        await self._counted(call)

    def _admitted(self) -> bool:
        """Counted in flight, unless close has begun."""
        with self._lock:
            if self._closing:
                return False
            self._calls += 1
            return True

    async def _counted(self, call: Coroutine[Any, Any, _T]) -> _T:
        """``call``, admitted: counted until it ends (see :meth:`run`)."""
        try:
            return await call
        except RpcError as exc:
            reason = exc.data.get("reason") if isinstance(exc.data, dict) else None
            if exc.code == errors.CLOSED and self._closing and reason != SERVICE_CLOSED:
                raise cut_short(exc) from None
            raise
        finally:
            with self._lock:
                self._calls -= 1
                waiting, self._idle = (self._idle, []) if self._calls == 0 else ([], self._idle)
            for loop, idle in waiting:
                try:
                    loop.call_soon_threadsafe(_done, idle)
                except RuntimeError:
                    pass  # that close's loop has ended: no one waits

    def begin_close(self) -> bool:
        """Refuse calls from now on; whether this is the first close (which
        closes everything, then :meth:`closed`)."""
        with self._lock:
            first, self._closing = not self._closing, True
        return first

    async def calls_ended(self, grace: float) -> bool:
        """Once no call is in flight on any loop; False if some still were
        after ``grace`` seconds."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._calls == 0:
                return True
            idle = loop.create_future()
            self._idle.append((loop, idle))
        try:
            await asyncio.wait_for(asyncio.shield(idle), grace)
        except TimeoutError:
            return False
        return True

    def closed(self) -> None:
        """The first close has closed everything (or given up trying)."""
        if not self._closed.done():
            self._closed.set_result(None)

    async def first_close_done(self) -> None:
        """Once the first close has returned, whichever loop it ran on."""
        await asyncio.wrap_future(self._closed)

    def _forked(self) -> None:
        """In a forked child: the parent's calls in flight are not the
        child's, nor is a close of the parent's under way (what it closes
        is the parent's: a child of a closing service finds it closed). A
        new future either way: asking the parent's would take its lock."""
        self._lock = threading.Lock()
        self._calls, self._idle = 0, []
        self._closed = concurrent.futures.Future()
        if self._closing:
            self._closed.set_result(None)


def _done(idle: asyncio.Future[None]) -> None:
    if not idle.done():
        idle.set_result(None)


# Write-behind's services, each with how to count its queued events it has
# not seen stored (weakly: registering keeps no service alive).
_queues: weakref.WeakKeyDictionary[Lifetime, tuple[weakref.ref[Any], Callable[[Any], int]]] = (
    weakref.WeakKeyDictionary())


def said_at_exit(life: Lifetime, service: weakref.ref[_T], queued: Callable[[_T], int]) -> None:
    """At the process's exit, log at error level what a write-behind service
    still holds (``queued(service)``, its events not known stored) unless it
    was closed. A script that ends its loop without ``close`` or ``flush`` (no
    ``Runner.close``) lost what the loop's end cut short (a run bigger than
    one batch, or one whose send had not gone out) without a word."""
    _queues[life] = (service, queued)


@atexit.register
def _say_unsent() -> None:
    for life, (ref, queued) in list(_queues.items()):
        service = ref()
        if life.closing or service is None or not (count := queued(service)):
            continue  # closed: its close sent the queue, or said what it could not
        log.error(
            "a StreamdSessionService(write_behind=True) was not closed, and the process exits"
            " with %d queued event%s not known to be stored (append_event returned; no flush"
            " saw them stored): await service.flush() or close() (runner.close()) before"
            " the event loop ends", count, "" if count == 1 else "s")
