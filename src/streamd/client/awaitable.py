"""The event-loop clients' methods, written once.

The asyncio and Trio clients differ in how they move bytes and wait; what a
method sends, how an answer cut by the reply budget is continued and how a
lease is held are the same for both, so both inherit them from
:class:`AwaitableCalls`, which needs their ``call``, their protocol core and
the kind of event their loop waits on (``_new_event``).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Generic, Protocol, Self, TypeVar

from streamd.client import calls
from streamd.client.protocol import Call, ClientProtocol
from streamd.eventlog.model import DEFAULT_STALE_AFTER_MS, SessionWithEvents

T = TypeVar("T")



class LostEvent(Protocol):
    """``asyncio.Event`` or ``trio.Event``: what a lease's ``lost`` is."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...


class AwaitableLease:
    """A session lease held through this connection; :attr:`lost` (an event of
    the client's loop) is set when it is stolen or the connection ends."""

    def __init__(self, client: AwaitableCalls, lock: str, holder: str, lost: Any) -> None:
        self.lock = lock
        self.holder = holder
        self.lost = lost
        self._client = client

    async def release(self) -> None:
        await self._client.release_lease(self)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.lost.is_set():
            await self.release()


L = TypeVar("L", bound=AwaitableLease)


class AwaitableCalls(calls.EventLogMethods, Generic[L]):
    _core: ClientProtocol
    _leases: dict[str, L]
    _lease_type: type[L]

    async def call(self, call: Call[T]) -> T:
        raise NotImplementedError

    def _new_event(self) -> Any:
        """A fresh event of this client's loop."""
        raise NotImplementedError

    async def acquire_lock(
        self,
        app: str,
        user: str,
        session: str,
        *,
        stale_after_ms: int = DEFAULT_STALE_AFTER_MS,
        heartbeat_ms: int | None = None,
    ) -> L:
        got = await self.call(
            calls.lock_acquire(
                app, user, session, stale_after_ms=stale_after_ms, heartbeat_ms=heartbeat_ms
            )
        )
        lease = self._lease_type(self, got.lock, got.holder, self._new_event())
        if self._core.closed:
            lease.lost.set()
        else:
            self._leases[got.lock] = lease
            self._core.lease_acquired(got.lock)
        return lease

    async def release_lease(self, lease: AwaitableLease) -> None:
        self._leases.pop(lease.lock, None)
        self._core.lease_released(lease.lock)
        await self.call(calls.lock_release(lease.lock))

    async def get_session(
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
        """The session with its events, whole (an answer cut by the reply
        budget is continued)."""
        first = calls.get_session(
            app, user, session, after_seq=after_seq, recent=recent, after_time=after_time,
            scoped_state=scoped_state, event_time=event_time,
        )
        whole = calls.SessionAssembler(first)
        call: Call[SessionWithEvents] | None = first
        while call is not None:
            call = whole.feed(await self.call(call))
        assert whole.result is not None
        return whole.result
