"""A connection's outgoing frames, waiting in order for its one writer task.

A step that produces answers for many connections at once (the event log's
writer, after a commit: its callers' replies and its watchers' notifications)
may run inside :func:`gathered`. A connection whose writer task is parked with
nothing queued then keeps that step's frames, and when the step ends they go
out as one non-blocking write on the spot, without waking the writer task:
with eight watchers and four writers that wake (and its checkpoints) was a
fifth of the event loop's work per commit. One write per connection and step,
as the writer task would make, so small answers keep their batching: each
write is a buffer of its own in the kernel, and a peer that stops reading must
still be sent about as many bytes as the socket holds before anything waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import trio

__all__ = ["Gathered", "Outbox", "WriteNow", "gathered"]

WriteNow = Callable[[bytes], int]
"""Writes what it can of the bytes without blocking and says how many it wrote
(0 when there is no room); an ``OSError`` (a broken peer) leaves the bytes to
the writer task, which meets the error itself and reports it."""

# The outboxes holding a step's frames; None outside Gathered.collecting().
_gathering: ContextVar[list[Outbox] | None] = ContextVar("streamd_outbox_gathering", default=None)


class Gathered:
    """The outboxes whose frames one step holds (see the module's text):
    frames for an idle connection queued inside :meth:`collecting` stay there
    until :meth:`write`, which writes each such connection's frames in one
    non-blocking write and gives what does not fit to its writer task.

    Between the two, nothing may await: a connection's held frames must be
    written before anything else can write to it, or its writer task (parked,
    not woken for them) would be overtaken. The event log's writer collects a
    commit's answers and writes them after handing the next batch to its
    worker thread, so the writes overlap that commit instead of delaying it.
    """

    __slots__ = ("_outboxes",)

    def __init__(self) -> None:
        self._outboxes: list[Outbox] = []

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Hold the frames queued inside for idle connections (synchronous
        code only). Inside another's collecting, frames for a connection the
        outer one already holds stay with it."""
        token = _gathering.set(self._outboxes)
        try:
            yield
        finally:
            _gathering.reset(token)

    def write(self) -> None:
        """Write what is held, each connection's in one write, in the order of
        their first frames; a no-op when nothing is."""
        outboxes, self._outboxes = self._outboxes, []
        for outbox in outboxes:
            outbox.write_held()


@contextmanager
def gathered() -> Iterator[None]:
    """Collect a step's frames and write them at its end (:class:`Gathered`),
    also when the block raises: a held frame whose writer task stays parked
    would never leave."""
    held = Gathered()
    try:
        with held.collecting():
            yield
    finally:
        held.write()


class Outbox:
    """Frames waiting for the connection's writer task, in order.

    Not a memory channel, because it has two kinds of producers. Awaited sends
    (a watch's notifications, an error, a task's answer) wait while ``limit``
    frames are queued, so a peer that does not read pushes back on them.
    Replies of queued requests come from a callback that cannot wait; they go
    in at once, which costs no more memory than the bound on requests in
    flight already allows. The writer takes everything queued in one go.

    ``write_now``, when given, is the connection's non-blocking write, used
    for the frames a step holds (:class:`Gathered`); only while the writer task
    is parked on an empty outbox, so no write is in progress and nothing
    queued is overtaken.
    """

    def __init__(self, limit: int, write_now: WriteNow | None = None) -> None:
        self._frames: list[bytes] = []
        self._limit = limit
        self._closed = False
        self._writer = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        self._write_now = write_now
        self._held = False  # frames wait for the end of a gathered() step

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
        if self._writer and not self._held:
            held = _gathering.get() if self._write_now is not None else None
            if held is None:
                self._writer.unpark()
            else:
                # The writer task is parked, so these are the only frames:
                # the step's end writes them, with whatever else it adds.
                self._held = True
                held.append(self)
        return True

    def write_held(self) -> None:
        """Write the frames a step held (:meth:`Gathered.write`) in one
        non-blocking write, and wake the writer task for any rest."""
        self._held = False
        frames = self._frames
        if not frames or not self._writer or self._closed or self._write_now is None:
            # The writer task was woken meanwhile (the outbox closed): it
            # takes them, in order, as it would have.
            return
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        try:
            written = self._write_now(data)
        except OSError:
            written = 0  # the writer task meets the error and reports it
        if written >= len(data):
            frames.clear()
            return
        self._frames = [data[written:] if written else data]
        self._writer.unpark()

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
