"""The heartbeats of one log's leases: one store call a tick refreshes every
lease that beats at one interval (up to a thousand of them).

A held lease is kept fresh by its log's heartbeats, not by a task and a write
of its own. One write a lease queued thousands of beats on the log's single
writer: every other client's appends waited behind them, and the beats
themselves fell late until healthy leases went stale (300 leases at 50 ms
took a SQLite log from some 300 appends/s to 5, and their heartbeats were
seconds old; see ``bench/lease_heartbeats.py``).

Leases beat by **cadence**: all the leases of one interval (their
``heartbeat_ms`` to two digits, see below), beaten together by one task in
the log's nursery. A cadence keeps the rules a single
lease's heartbeat had:

* It beats every interval, counted from each beat's start, each beat bounded
  by the next tick, so a wedged database delays the next beat and never
  stacks them, and a slow one never stretches the cadence.
* A beat is one store call
  (:meth:`~streamd.eventlog.store.Backend.heartbeat_leases`, one transaction)
  for the leases of the cadence, :data:`LEASES_A_CALL` at most (more make
  several calls, one after the other, the stalest first), which says for
  each whether its row is still ours. A lease whose row is not is lost: it
  leaves the cadence and is told, once
  (:meth:`~streamd.eventlog.lease.Lease.mark_lost`); the others beat on.
* A call that fails (a database error, too slow, or an error no store call
  should raise, logged with its traceback) is retried at the next tick (a too
  slow one has reached it: at once): the leases may well still be ours, so
  none is lost, and the log serves on. A fault of the log's file (it was replaced or
  deleted, and the rows with it) loses every lease of the tick, once.
* A lease joins its cadence at the cadence's next tick, which is at most an
  interval after the acquire that stamped its row: its first beat may come
  early, never late. It leaves when it is released, stopped or lost; a
  cadence left empty ends, and close ends them all.

A cadence's interval is its leases' heartbeat **to two significant digits,
rounded down** (:func:`cadence_ms`): 1,000 to 1,099 ms beat every 1,000 ms,
never later than asked, at most 9 % sooner (1 % for 9,900 to 9,999 ms), and
any interval of two digits or fewer (50, 150, 1,000, 2,500, 30,000 ms) is
its own. Leases of nearly equal intervals each made a cadence of their own:
1,000 leases at 200 to 399 ms (200 intervals) took 690 store calls a second,
appends beside them fell from 739 to 4 a second, and 17 % of heartbeat ages
were past their window (``bench/lease_heartbeats.py --distinct 200``); such
intervals now share one of 20 cadences.

Why cadences, and not one queue of every lease's own due time: leases
acquired one after the other each had a phase of their own, so nearly every
due time would still be a call of its own; joining the cadence's next tick
puts every lease of one interval in the same call. And a call is bounded by
the next tick of what it beats: leases of two intervals in one call would
either be cut at the shorter one's tick (failing, under a database slow but
within their own interval, beats that would have landed) or let the shorter
ones run past theirs. So leases with different heartbeats each keep their
own cadence; a log whose leases use k cadences makes k calls a round (for
up to a thousand leases each), never more calls than it has leases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from streamd.errors import RpcError, is_closed
from streamd.eventlog.sqlite.file_identity import is_file_fault
from streamd.eventlog.store import Backend, StoreCall

if TYPE_CHECKING:
    from streamd.eventlog.lease import Lease

__all__ = ["LEASES_A_CALL", "Heartbeats", "cadence_ms"]

logger = logging.getLogger(__name__)

LEASES_A_CALL = 1000
"""Leases one store call refreshes at most; a cadence of more makes a call a
thousand, one after the other, the stalest first. One transaction for 3,000
leases took longer than their 50 ms interval on a loaded machine: cut at the
next tick and rolled back, it was tried again and cut again, and only half
the beats landed (1 in 10 heartbeat ages past the window). A call of a
thousand fits the shortest interval (50 ms) under that load, so every tick
lands some, and the next begins with those it missed; appends wait for one
call, not for every lease."""


def cadence_ms(heartbeat_ms: int) -> int:
    """The interval of the cadence a lease of ``heartbeat_ms`` beats in: its
    two leading digits, the rest zeros (see the module docstring)."""
    cut = 10 ** max(len(str(heartbeat_ms)) - 2, 0)
    return heartbeat_ms // cut * cut


class _Cadence:
    """The leases of one heartbeat interval, and the scope of the task that
    beats them (cancelled when the last one leaves, or at close)."""

    def __init__(self, heartbeat_ms: int) -> None:
        self.heartbeat_ms = heartbeat_ms
        self.interval = heartbeat_ms / 1000
        self.tick = trio.current_time() + self.interval
        """The next beat's start (Trio's clock): never more than an interval
        from now, so a lease that joins is beaten within an interval of the
        acquire that stamped its row. Counted from the first join, not from
        the task's start, which a busy event loop may delay."""
        self.leases: dict[str, Lease] = {}
        """By lock id. Only the leases in here when a call returns are told
        its outcome: one released or stopped meanwhile is neither counted nor
        lost."""
        self.scope = trio.CancelScope()


class Heartbeats:
    """Every heartbeat of one log (see the module docstring)."""

    def __init__(self, *, write: StoreCall, now_us: Callable[[], int]) -> None:
        self._write = write
        self._now_us = now_us
        self._cadences: dict[int, _Cadence] = {}

    def join(self, lease: Lease, nursery: trio.Nursery) -> None:
        """Beat ``lease`` from its cadence's next tick on; a new cadence's task
        starts in ``nursery`` (the log's) and ticks an interval from now."""
        ms = cadence_ms(lease.heartbeat_ms)
        cadence = self._cadences.get(ms)
        if cadence is None:
            cadence = _Cadence(ms)
            nursery.start_soon(self._beat, cadence)  # may raise: then nothing was kept
            self._cadences[ms] = cadence
        cadence.leases[lease.lock] = lease

    def leave(self, lease: Lease) -> None:
        """Beat ``lease`` no more; nothing if it already left."""
        cadence = self._cadences.get(cadence_ms(lease.heartbeat_ms))
        if cadence is None or cadence.leases.pop(lease.lock, None) is None:
            return
        if not cadence.leases:
            self._end(cadence)

    def stop(self) -> None:
        """Close's first step: no beat from now on."""
        for cadence in list(self._cadences.values()):
            self._end(cadence)

    def _end(self, cadence: _Cadence) -> None:
        cadence.scope.cancel()
        if self._cadences.get(cadence.heartbeat_ms) is cadence:
            del self._cadences[cadence.heartbeat_ms]

    async def _beat(self, cadence: _Cadence) -> None:
        with cadence.scope:
            while True:
                await trio.sleep_until(cadence.tick)
                # Ticks are counted from each beat's start, not its end: a beat
                # the database slowed, or one that timed out, must not push the
                # next back by its delay. Counted from the end, beats the
                # database took 4 s of a 5 s interval to answer landed 13 s
                # apart, and a 10 s window went stale under a healthy holder;
                # a timed-out beat waited a whole interval more before its retry.
                cadence.tick = max(cadence.tick, trio.current_time()) + cadence.interval
                due = list(cadence.leases.values())  # the stalest first
                done = 0
                try:
                    # Bounded by the next tick, so a wedged database delays the
                    # next beat, never stacks them, and a beat that timed out is
                    # retried at once.
                    with trio.fail_at(cadence.tick):
                        for done in range(0, len(due), LEASES_A_CALL):
                            part = due[done : done + LEASES_A_CALL]
                            self._answer(cadence, part, await self._write(self._refresh(part)))
                except (RpcError, trio.TooSlowError) as exc:
                    if isinstance(exc, RpcError) and is_closed(exc):
                        # Their tasks return, nothing lost: the close releases them.
                        for lease in list(cadence.leases.values()):
                            lease.stop_heartbeat()
                        return
                    if is_file_fault(exc):
                        # The log stopped for good: its file was replaced or
                        # deleted, and the leases' rows with it. Beaten on, they
                        # warned every interval for as long as the process ran
                        # while their holders worked on, though a daemon started
                        # on the restored file may grant the sessions to others.
                        logger.warning("%d lease(s) lost with the log's file", len(due))
                        for lease in due:
                            self._lose(cadence, lease)
                        continue
                    # The leases may well still be ours: retry at the next tick.
                    logger.warning(
                        "heartbeat failed for %d lease(s) (will retry): %r", len(due) - done, exc
                    )
                except Exception:
                    # What no store call should raise (a bug, a driver's error
                    # left untranslated). This task runs in the log's nursery:
                    # let out, it took the log, and every client of it, down.
                    # The leases may well still be ours: retry at the next tick.
                    logger.exception(
                        "heartbeat failed for %d lease(s) (will retry)", len(due) - done
                    )

    def _answer(self, cadence: _Cadence, part: list[Lease], held: list[bool]) -> None:
        for lease, ours in zip(part, held, strict=True):
            if cadence.leases.get(lease.lock) is not lease:
                continue  # released or stopped while the call ran
            if ours:
                lease.beaten()
                # Last in line: a tick that cannot beat every lease (a call
                # cut at the next tick) begins the next with those it missed.
                del cadence.leases[lease.lock]
                cadence.leases[lease.lock] = lease
            else:
                self._lose(cadence, lease)  # the row is someone else's: stolen

    def _lose(self, cadence: _Cadence, lease: Lease) -> None:
        if cadence.leases.get(lease.lock) is lease:
            self.leave(lease)
            lease.mark_lost()

    def _refresh(self, beating: list[Lease]) -> Callable[[Backend], list[bool]]:
        keys, now_us = [lease.key for lease in beating], self._now_us
        # The clock itself, read inside the call's transaction once it has the
        # write lock (see LeaseTime): a beat queued behind the writer's other
        # writes, or waiting for another process's lock, would be stamped that
        # much in the past.
        return lambda store: store.heartbeat_leases(keys, now_us)
