"""Session leases: one holder drives a session, and learns when it no longer does.

A :class:`Lease` is a row in the store (``Backend.acquire_lease`` judges and
takes it), kept fresh by its log's heartbeats
(:class:`~streamd.eventlog.heartbeats.Heartbeats`: one store call a tick for
all the leases of one interval), plus a task of its own in the nursery its
caller named, or the log's. Its rules:

* The heartbeat beats every ``heartbeat_ms``, counted from each beat's
  start, each beat bounded by the next tick, so a wedged database delays the
  next beat and never stacks them, and a slow one never stretches the cadence.
* A beat that finds the row no longer ours means the lease was stolen
  (another holder found it stale): ``lost`` is set, ``on_lost`` runs in the
  lease's task, once, and the heartbeat ends. Whoever works under the lease
  must stop then, or two processes drive one session.
* A beat that fails (a database error, or too slow) is retried at the next tick
  (a too slow one has reached it: at once): the lease may well still be ours,
  so it is not a loss.
* :meth:`Lease.release` stops the heartbeat and deletes the row only if it is
  still ours, so it never deletes a successor's lease; a clean release never
  sets ``lost``.
* The lease's task returns when the lease is released, lost or stopped, or
  the log closes; cancelled (its nursery was), it stops the heartbeat and
  leaves the row as it is, as a heartbeat running in that nursery did.

A lease reaches its log only through :class:`LeaseHost`, which the log builds
once: how to run a store operation on the writer, whether the log is closed,
how to stop beating a lease, and how to tell the log a lease is done
(released or lost).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from streamd.errors import INVALID_PARAMS, SESSION_LOCKED, RpcError, is_closed
from streamd.eventlog.heartbeats import LEASES_A_CALL, Heartbeats
from streamd.eventlog.lease_budget import too_many_leases
from streamd.eventlog.model import LeaseAcquireParams
from streamd.eventlog.store import Backend, LeaseKey, Runner, StoreCall

__all__ = ["Lease", "LeaseHost", "LeaseKeeper", "new_holder_id"]

logger = logging.getLogger(__name__)

_NOTHING_TAKEN = frozenset({SESSION_LOCKED, INVALID_PARAMS})
"""Refusals of an acquire that wrote nothing: any other failure may have
come after its commit (a connection lost with the answer)."""


def _release(p: LeaseAcquireParams, holder: str) -> Callable[[Backend], bool]:
    """Delete the lease row of ``p``'s session if ``holder`` has it."""
    return lambda store: store.release_lease(p.app, p.user, p.session, holder)


def _releases(keys: list[LeaseKey]) -> Callable[[Backend], int]:
    """Delete the rows of ``keys`` still ours, in one store call."""
    return lambda store: store.release_leases(keys)


def new_holder_id() -> str:
    """``host/pid/8-hex``: which machine and process holds a lease, plus enough
    randomness that two acquisitions by one process are told apart."""
    host = socket.gethostname() or "unknown"
    return f"{host}/{os.getpid()}/{secrets.token_hex(4)}"


@dataclass(frozen=True)
class LeaseHost:
    """What a lease needs from the log that granted it."""

    write: StoreCall
    """Runs one store operation on the log's writer."""
    closed: Callable[[], bool]
    leave: Callable[[Lease], None]
    """Stops beating the lease (the log's heartbeats drop it)."""
    forget: Callable[[Lease], None]
    """Called once when the lease is released or lost: the log stops holding it."""


class Lease:
    """An exclusive lease on one session, kept fresh by its log's heartbeats.

    ``lost`` is set if another process stole the lease (a heartbeat found the row
    no longer ours); whoever works under the lease should stop then, or two
    processes drive one session. ``lost`` is never set by a clean release.
    """

    def __init__(
        self,
        host: LeaseHost,
        *,
        lock: str,
        holder: str,
        app: str,
        user: str,
        session: str,
        heartbeat_ms: int,
        on_lost: Callable[[Lease], Awaitable[None]] | None,
    ) -> None:
        self.lock = lock
        self.holder = holder
        self.app = app
        self.user = user
        self.session = session
        self.heartbeat_ms = heartbeat_ms
        self.key = LeaseKey(app, user, session, holder)
        """The row a heartbeat refreshes while it is ours."""
        self.lost = trio.Event()
        self.beats = 0
        """Successful heartbeats so far (diagnostics; tests watch it advance)."""
        self._host = host
        self._on_lost = on_lost
        self._ended = trio.Event()  # released, stopped or lost: the task returns
        self._gone = False  # lost: the task sets ``lost`` and runs on_lost
        self._released = False

    async def keep_alive(self) -> None:
        """The lease's task: it returns when the lease is lost (after running
        ``on_lost``), released or stopped, or the log closes. Cancelled, it
        stops the heartbeat."""
        try:
            await self._ended.wait()
        finally:
            if not self._ended.is_set():
                # Its nursery was cancelled: the heartbeat, which ran in that
                # nursery before the log's heartbeats beat for all, ends with it.
                self.stop_heartbeat()
            elif self._gone:
                # Set here, in one step with on_lost's start, as when the beat
                # that found the loss ran in this task: whoever waits on
                # ``lost`` wakes to find on_lost under way. (Even cancelled:
                # the loss was found, only on_lost cannot run.)
                self.lost.set()
        if self._gone and self._on_lost is not None:
            await self._on_lost(self)

    def beaten(self) -> None:
        """A heartbeat refreshed the row (the log's heartbeats say so)."""
        self.beats += 1

    def mark_lost(self) -> None:
        """The row is no longer ours: stolen, or gone with the log's file (the
        log's heartbeats say so, once). Nothing once the lease was released or
        stopped: then nothing was lost."""
        if self._ended.is_set():
            return
        self._host.forget(self)
        self._gone = True
        self._ended.set()

    def stop_heartbeat(self) -> None:
        """Stop beating and leave the row as it is: the lease goes stale after
        its window unless someone deletes it (the log's close does, for every
        lease it holds)."""
        self._host.leave(self)
        self._ended.set()

    async def release(self) -> None:
        """Stop the heartbeat and delete the lease row if it is still ours.

        Idempotent. After the log is closed this does nothing: close already
        released every lease.
        """
        if self.let_go():
            await self._host.write(self.release_op())

    def let_go(self) -> bool:
        """What :meth:`release` does before its write: stop the heartbeat and
        the log's holding it. Whether the row is still to be deleted (not if
        the lease was released already, lost, or the log closed): the caller
        deletes it, with others in one store call (see
        :meth:`LeaseKeeper.release_all`)."""
        if self._released:
            return False
        self._released = True
        self.stop_heartbeat()
        self._host.forget(self)
        return not (self._gone or self._host.closed())

    def release_op(self) -> Callable[[Backend], bool]:
        """The store operation that deletes this lease's row if it is still ours
        (true if it was)."""
        return lambda store: store.release_lease(self.app, self.user, self.session, self.holder)


class LeaseKeeper:
    """The leases one log holds: taken, kept fresh, released at close.

    A lease's task runs in the nursery the caller names, or in the log's own
    (then a failing ``on_lost`` is logged, not raised: the log's nursery
    serves every client); its heartbeats are the log's, in the log's nursery."""

    def __init__(
        self, *, write: StoreCall, now_us: Callable[[], int], closed: Callable[[], bool],
        max_leases: int,
    ):
        self._write = write
        self._max_leases = max_leases
        self._now_us = now_us
        self._held: dict[str, Lease] = {}
        # Acquires in flight, and those whose caller never learned the
        # outcome, by holder: their rows, if they were written, are deleted
        # in the log's nursery, or at close (see acquire).
        self._unanswered: dict[str, LeaseAcquireParams] = {}
        # Acquires between the bound's check and their outcome: with what is
        # held, within max_leases. Not the rows unanswered ones may have left,
        # which no heartbeat rewrites: a delete of them that failed kept them
        # for the close, and each counted for good.
        self._acquiring = 0
        self._beats = Heartbeats(write=write, now_us=now_us)
        # Connections' releases (release_all) in progress: run shielded, as a
        # connection's cleanups are, so only a coming close bounds them.
        self._releasing: set[trio.CancelScope] = set()
        self._releases_end = math.inf
        """When a close is coming: the deadline of every release (Trio's clock)."""
        self._host = LeaseHost(
            write=write, closed=closed, leave=self._beats.leave, forget=self._forget
        )

    async def acquire(
        self,
        p: LeaseAcquireParams,
        *,
        log_nursery: trio.Nursery,
        nursery: trio.Nursery | None,
        on_lost: Callable[[Lease], Awaitable[None]] | None,
    ) -> Lease:
        """Take the lease in the store (``session_locked`` if it is held and
        fresh; ``budget_exceeded`` if the log holds ``max_leases``), then
        start its heartbeat."""
        if len(self._held) + self._acquiring >= self._max_leases:
            raise too_many_leases(self._max_leases, "log")
        self._acquiring += 1
        try:
            return await self._acquire(p, log_nursery=log_nursery, nursery=nursery,
                                       on_lost=on_lost)
        finally:
            self._acquiring -= 1

    async def _acquire(
        self,
        p: LeaseAcquireParams,
        *,
        log_nursery: trio.Nursery,
        nursery: trio.Nursery | None,
        on_lost: Callable[[Lease], Awaitable[None]] | None,
    ) -> Lease:
        holder, now_us = new_holder_id(), self._now_us
        # Counted from before the write, not from its failure: a close that
        # cancels the write goes on while the write waits out its cancel (a
        # server's runner waits for the server's answer), and, finding no
        # unanswered acquire yet, left the row of one that had committed.
        self._unanswered[holder] = p
        try:
            # The clock itself, read inside the transaction once it has the
            # write lock, not as the acquire is asked for: one queued behind
            # the writer's other writes, or waiting for another process's
            # lock, was stamped that much in the past, and could be stale
            # before its first beat.
            await self._write(lambda store: store.acquire_lease(p, holder, now_us))
        except RpcError as exc:
            if exc.code in _NOTHING_TAKEN:
                self._unanswered.pop(holder, None)
            else:
                self._release_soon(p, holder, log_nursery)
            raise
        except BaseException:
            # Cancelled: the transaction may have committed before the answer
            # came back. Its row has a holder nobody knows and no heartbeat,
            # and locked the session, its caller's retry included, until it
            # went stale; release it (only if it is that holder's).
            self._release_soon(p, holder, log_nursery)
            raise
        self._unanswered.pop(holder, None)
        lease = Lease(
            self._host,
            lock=secrets.token_hex(8),
            holder=holder,
            app=p.app,
            user=p.user,
            session=p.session,
            heartbeat_ms=p.interval_ms,
            on_lost=on_lost,
        )
        self._held[lease.lock] = lease
        try:
            self._beats.join(lease, log_nursery)
            if nursery is not None:
                nursery.start_soon(lease.keep_alive)
            else:
                log_nursery.start_soon(self._keep_alive, lease)
        except BaseException:
            await lease.release()
            raise
        return lease

    def _release_soon(self, p: LeaseAcquireParams, holder: str, log_nursery: trio.Nursery) -> None:
        """Release the row an unanswered acquire may have left, in the log's
        nursery (the caller's cancel is not kept waiting for it), or leave it
        to the close once the log is closing: its nursery may have ended by
        then, and a start_soon into it raised RuntimeError over the caller's
        own exception."""
        if self._host.closed():
            return  # the close releases it (see _close in log.py)
        log_nursery.start_soon(self._release_orphan, p, holder)

    async def _release_orphan(self, p: LeaseAcquireParams, holder: str) -> None:
        """Delete the row an acquire whose outcome its caller never learned
        may have written (conditional on its holder: nothing else is touched)."""
        try:
            await self._write(_release(p, holder))
        except RpcError as exc:
            if not is_closed(exc):
                # Kept among the unanswered: the close tries it again.
                logger.warning("releasing an unanswered lease of %r: %s", p.session, exc)
            return  # the close releases it
        self._unanswered.pop(holder, None)

    async def _keep_alive(self, lease: Lease) -> None:
        try:
            await lease.keep_alive()
        except Exception:
            logger.exception("lease %s: on_lost failed", lease.lock)

    def _forget(self, lease: Lease) -> None:
        self._held.pop(lease.lock, None)

    def get(self, lock: str) -> Lease | None:
        return self._held.get(lock)

    async def release(self, lock: str) -> None:
        """Release by lock id; unknown or already released ids are fine."""
        lease = self._held.get(lock)
        if lease is not None:
            await lease.release()

    async def release_all(self, leases: Iterable[Lease]) -> None:
        """Release ``leases`` (a closed connection's), their rows deleted
        :data:`LEASES_A_CALL` a store call, each only if it is still ours.
        One write a lease took a connection holding 3,000 of them seconds
        to let go, and held up the daemon's stop as long (its connections'
        cleanups are shielded). A call that fails leaves its leases to go
        stale, as a release that failed did; the others are still released.
        A close coming bounds it (:meth:`bound_releases`)."""
        keys = [lease.key for lease in leases if lease.let_go()]
        with trio.CancelScope(deadline=self._releases_end) as scope:
            self._releasing.add(scope)
            try:
                await _delete_rows(self._write, keys, "")
            finally:
                self._releasing.discard(scope)
        if scope.cancelled_caught:
            logger.warning("releasing %d lease(s): the log is closing; those not released yet"
                           " are left to go stale", len(keys))

    def bound_releases(self, deadline: float) -> None:
        """A close is coming: connections' releases, running or yet to start,
        end by ``deadline`` (Trio's clock), what is not released by then
        left to go stale, as the close leaves what it has no time for. Else
        a database that does not answer held up a stop for good: a stop
        waits for every connection to end, and a connection's end waits for
        its release (:meth:`release_all`), which nothing could cancel."""
        self._releases_end = min(self._releases_end, deadline)
        for scope in self._releasing:
            scope.deadline = min(scope.deadline, deadline)

    @property
    def unanswered(self) -> bool:
        """Whether an acquire in flight, or one whose caller never learned
        the outcome, may have left a row (the close releases it)."""
        return bool(self._unanswered)

    def stop_heartbeats(self) -> list[Lease]:
        """Close's first step: no beat from now on; the leases still held."""
        leases = list(self._held.values())
        for lease in leases:
            lease.stop_heartbeat()
        self._beats.stop()
        return leases

    async def release_at_close(self, leases: list[Lease], writer: Runner, grace: float) -> None:
        """Delete the rows of what we hold, so another process need not wait
        for staleness; bounded by ``grace``, a wedged database must not hang
        close."""
        keys = [lease.key for lease in leases]
        # An unanswered acquire's row, if it was written, is its holder's.
        keys += [LeaseKey(p.app, p.user, p.session, h) for h, p in self._unanswered.items()]
        with trio.move_on_after(grace):
            # A store call a thousand, as the heartbeats: one write a lease
            # released some 150 in the half-second grace, whatever the number
            # held, and left the rest to lock their sessions until stale.
            await _delete_rows(writer.run, keys, " at close")
        self._held.clear()
        self._unanswered.clear()


async def _delete_rows(write: StoreCall, keys: list[LeaseKey], when: str) -> None:
    """Delete the rows of ``keys`` still ours, :data:`LEASES_A_CALL` a store
    call; a call that fails is logged and the next is tried, until the log
    is closed (then no call can run)."""
    for start in range(0, len(keys), LEASES_A_CALL):
        part = keys[start : start + LEASES_A_CALL]
        try:
            await write(_releases(part))
        except RpcError as exc:
            logger.warning("releasing %d lease(s)%s: %s", len(part), when, exc)
            if is_closed(exc):
                return
