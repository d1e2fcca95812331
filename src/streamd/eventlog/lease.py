"""Session leases: one holder drives a session, and learns when it no longer does.

A :class:`Lease` is a row in the store (``Backend.acquire_lease`` judges and
takes it) plus a heartbeat task that keeps the row fresh. Its rules:

* The heartbeat beats every ``heartbeat_ms``, each beat bounded by that
  interval, so a wedged database delays the next beat and never stacks them.
* A beat that updates no row means the lease was stolen (another holder found
  it stale): ``lost`` is set, ``on_lost`` runs, and the heartbeat ends. Whoever
  works under the lease must stop then, or two processes drive one session.
* A beat that fails (a database error, or too slow) is retried at the next tick:
  the lease may well still be ours, so it is not a loss.
* :meth:`Lease.release` stops the heartbeat and deletes the row only if it is
  still ours, so it never deletes a successor's lease; a clean release never
  sets ``lost``.

A lease reaches its log only through :class:`LeaseHost`, which the log builds
once: how to run a store operation on the writer, the clock, whether the log
is closed, and how to tell it a lease is done (released or lost).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import trio

from streamd.errors import RpcError, is_closed
from streamd.eventlog.store import Backend

__all__ = ["Lease", "LeaseHost", "Write", "new_holder_id"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def new_holder_id() -> str:
    """``host/pid/8-hex``: which machine and process holds a lease, plus enough
    randomness that two acquisitions by one process are told apart."""
    host = socket.gethostname() or "unknown"
    return f"{host}/{os.getpid()}/{secrets.token_hex(4)}"


class Write(Protocol):
    """Run one store operation on the log's writer; raises ``closed`` once the
    log is closed (or closing)."""

    async def __call__(self, op: Callable[[Backend], _T], /) -> _T: ...


@dataclass(frozen=True)
class LeaseHost:
    """What a lease needs from the log that granted it."""

    write: Write
    now_us: Callable[[], int]
    """The log's wall clock in microseconds (a test's mock clock, in tests)."""
    closed: Callable[[], bool]
    forget: Callable[[Lease], None]
    """Called once when the lease is released or lost: the log stops holding it."""


class Lease:
    """An exclusive lease on one session, kept fresh by a heartbeat task.

    ``lost`` is set if another process stole the lease (our heartbeat found the row
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
        self.lost = trio.Event()
        self.beats = 0
        """Successful heartbeats so far (diagnostics; tests watch it advance)."""
        self._host = host
        self._on_lost = on_lost
        self._scope = trio.CancelScope()  # the heartbeat's; cancelled by release
        self._released = False

    async def keep_alive(self) -> None:
        """The heartbeat: run it as a task; it returns when the lease is lost,
        released or stopped, or the log closes."""
        interval = self.heartbeat_ms / 1000
        with self._scope:
            while True:
                await trio.sleep(interval)
                try:
                    # Bounded so a wedged database delays the next beat, not all.
                    with trio.fail_after(interval):
                        held = await self._host.write(self._beat(self._host.now_us()))
                except (RpcError, trio.TooSlowError) as exc:
                    if isinstance(exc, RpcError) and is_closed(exc):
                        return
                    # The lease may well still be ours: retry at the next tick.
                    logger.warning("lease %s heartbeat failed (will retry): %r", self.lock, exc)
                    continue
                if held:
                    self.beats += 1
                    continue
                self._host.forget(self)
                self.lost.set()
                if self._on_lost is not None:
                    await self._on_lost(self)
                return

    def stop_heartbeat(self) -> None:
        """Stop beating and leave the row as it is: the lease goes stale after
        its window unless someone deletes it (the log's close does, for every
        lease it holds)."""
        self._scope.cancel()

    async def release(self) -> None:
        """Stop the heartbeat and delete the lease row if it is still ours.

        Idempotent. After the log is closed this does nothing: close already
        released every lease.
        """
        if self._released:
            return
        self._released = True
        self._scope.cancel()
        self._host.forget(self)
        if self.lost.is_set() or self._host.closed():
            return
        await self._host.write(self.release_op())

    def release_op(self) -> Callable[[Backend], bool]:
        """The store operation that deletes this lease's row if it is still ours
        (true if it was)."""
        return lambda store: store.release_lease(self.app, self.user, self.session, self.holder)

    def _beat(self, now_us: int) -> Callable[[Backend], bool]:
        return lambda store: store.heartbeat_lease(
            self.app, self.user, self.session, self.holder, now_us
        )
