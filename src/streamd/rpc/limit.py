"""How many connections a server serves at once.

Each connection costs a descriptor and up to its per-connection bounds in
memory (see :mod:`~streamd.rpc.server`); past :data:`MAX_CONNECTIONS` a new
one is answered one error and closed, so a client that leaks connections
cannot take the descriptors the daemon's own files need (the usual soft limit
is 1,024) or its memory from every other client.

* A connection counts until its input ends. One whose input ended may still
  answer within the end-of-input grace; all connections together are held to
  twice the limit.
* A new connection that finds the limit reached waits up to
  :data:`SLOT_WAIT_S` for a slot (one that just closed counts until its end of
  input is read), at most :data:`SLOT_WAITERS` of them at once; then it is
  refused: one -32000 with id null and ``data.reason`` ``too_many_connections``.
* Refusals are logged at most once in :data:`REFUSAL_LOG_S`, with their count:
  a client that leaks and retries must not rotate the log away.
"""

from __future__ import annotations

import logging
import math
from typing import Generic, TypeVar

import trio

from streamd import errors
from streamd.errors import RpcError
from streamd.rpc.protocol import error_frame

__all__ = ["MAX_CONNECTIONS", "ConnectionLimit"]

log = logging.getLogger("streamd.rpc")

MAX_CONNECTIONS = 512
SLOT_WAIT_S = 0.5
SLOT_WAITERS = 64
# How long a refused connection's one error frame may take to leave.
REFUSAL_SEND_S = 1.0
REFUSAL_LOG_S = 10.0

_C = TypeVar("_C")


class ConnectionLimit(Generic[_C]):
    """The connections of one server (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: set[_C] = set()
        self._counted: set[_C] = set()  # those whose input has not ended
        self._slot_freed = trio.lowlevel.ParkingLot()
        self._waiters = 0
        self._refused = 0  # since the last log line about it
        self._refusal_logged_at = -math.inf

    def _full(self) -> bool:
        return len(self._counted) >= self.limit or len(self._open) >= 2 * self.limit

    async def admit(self, conn: _C) -> bool:
        """Count ``conn`` in, at once below the limit, else once a slot frees
        in time; False: it is not to be served (:meth:`refuse` it)."""
        if self._full():
            if self._waiters >= SLOT_WAITERS:
                return False
            self._waiters += 1
            try:
                with trio.move_on_after(SLOT_WAIT_S):
                    while self._full():
                        await self._slot_freed.park()
            finally:
                self._waiters -= 1
            if self._full():
                return False
        self._open.add(conn)
        self._counted.add(conn)
        return True

    def input_ended(self, conn: _C) -> None:
        """``conn`` reads no more: it no longer counts against the limit."""
        if conn in self._counted:
            self._counted.discard(conn)
            self._slot_freed.unpark_all()

    def left(self, conn: _C) -> None:
        """``conn`` has ended."""
        self.input_ended(conn)
        self._open.discard(conn)

    async def refuse(self, send: trio.abc.SendStream) -> None:
        """Answer a connection not admitted one error (id null, as for a
        frame without an id) and nothing more; the caller closes it."""
        self._refused += 1
        now = trio.current_time()
        if now - self._refusal_logged_at >= REFUSAL_LOG_S:
            log.warning("refused %d connection%s in the last %g s: %d are open, the limit",
                        self._refused, "" if self._refused == 1 else "s",
                        REFUSAL_LOG_S, len(self._counted))
            self._refused, self._refusal_logged_at = 0, now
        refusal = RpcError(
            errors.SOURCE_UNAVAILABLE,
            f"streamd serves at most {self.limit} connections at once and that many"
            " are open; this one is closed (a client may be leaking connections)",
            {"reason": errors.TOO_MANY_CONNECTIONS, "limit": self.limit},
        )
        with trio.move_on_after(REFUSAL_SEND_S):
            try:
                await send.send_all(error_frame(None, refusal))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
