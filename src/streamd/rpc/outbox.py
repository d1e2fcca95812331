"""A connection's outgoing frames, waiting in order for its one writer task."""

from __future__ import annotations

import trio

__all__ = ["Outbox"]


class Outbox:
    """Frames waiting for the connection's writer task, in order.

    Not a memory channel, because it has two kinds of producers. Awaited sends
    (a watch's notifications, an error, a task's answer) wait while ``limit``
    frames are queued, so a peer that does not read pushes back on them.
    Replies of queued requests come from a callback that cannot wait; they go
    in at once, which costs no more memory than the bound on requests in
    flight already allows. The writer takes everything queued in one go.
    """

    def __init__(self, limit: int) -> None:
        self._frames: list[bytes] = []
        self._limit = limit
        self._closed = False
        self._writer = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    async def put(self, frame: bytes) -> None:
        """Queue ``frame`` once there is room; ClosedResourceError once closed."""
        # A checkpoint either way, as a memory channel's send is.
        await trio.lowlevel.checkpoint_if_cancelled()
        parked = False
        while len(self._frames) >= self._limit and not self._closed:
            await self._room.park()
            parked = True
        if not self.put_nowait(frame):
            raise trio.ClosedResourceError
        if not parked:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def put_nowait(self, frame: bytes) -> bool:
        """Queue ``frame`` whatever the bound; False (dropped) once closed."""
        if self._closed:
            return False
        self._frames.append(frame)
        if self._writer:
            self._writer.unpark()
        return True

    async def take(self) -> list[bytes]:
        """Every queued frame, once there is one; [] when closed and empty."""
        while not self._frames:
            if self._closed:
                return []
            await self._writer.park()
        # One turn of the event loop first, so the other producers woken in
        # this step add theirs: tasks answering one frame each would otherwise
        # each get a write of their own (small writes fill a Unix socket's
        # buffer with overhead long before it holds its size in bytes).
        await trio.lowlevel.cancel_shielded_checkpoint()
        frames, self._frames = self._frames, []
        if self._room:
            self._room.unpark_all()
        return frames

    def close(self) -> None:
        """No more frames; the writer still gets those already queued."""
        self._closed = True
        self._writer.unpark_all()
        self._room.unpark_all()
