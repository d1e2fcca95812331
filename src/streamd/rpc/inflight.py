"""The requests one connection has in flight, and the bound its reader waits on.

A request is admitted when its frame has been read and released when it has
been answered. While the requests in flight number ``max_requests``, or their
frames hold ``max_bytes``, the reader stops reading (:meth:`InFlight.wait_room`):
the bytes a peer can make the daemon hold for it stay bounded, and TCP-style
back-pressure reaches the peer through the socket's buffers. One request
always fits when nothing is in flight, so a frame of the largest size is
never refused for its size alone. ``idle`` is set while nothing is in flight:
what end of input and a shutdown wait for. ``account``, when given, is
charged the same bytes (:mod:`~streamd.rpc.held`: the daemon-wide bound).
"""

from __future__ import annotations

import trio

from streamd.rpc.held import Account

__all__ = ["InFlight"]


class InFlight:
    def __init__(self, max_requests: int, max_bytes: int, account: Account | None = None) -> None:
        self._account = account
        self._max_requests = max_requests
        self._max_bytes = max_bytes
        self.requests = 0
        """Admitted and not yet released."""
        self.bytes = 0
        """Their frames' bytes."""
        self.idle = trio.Event()
        self.idle.set()
        self._room = trio.Event()

    def fits(self, size: int) -> bool:
        return self.requests < self._max_requests and self.bytes + size <= self._max_bytes

    async def wait_room(self, size: int) -> None:
        """Until a request of ``size`` bytes fits (at once with nothing in flight)."""
        while self.requests and not self.fits(size):
            self._room = trio.Event()
            await self._room.wait()

    def admit(self, size: int) -> None:
        self.requests += 1
        self.bytes += size
        if self._account is not None:
            self._account.charge(size)
        if self.idle.is_set():
            self.idle = trio.Event()

    def release(self, size: int) -> None:
        self.requests -= 1
        self.bytes -= size
        if self._account is not None:
            self._account.discharge(size)
        self._room.set()
        if not self.requests:
            self.idle.set()
