"""stdin and stdout as Trio streams, without making them non-blocking.

Trio's FdStream would set O_NONBLOCK on the file description, which a
terminal shares with stderr: log writes could then fail with
BlockingIOError. Blocking reads and writes in Trio's worker threads cost a
thread hop per chunk instead, and the writer coalesces frames so a hop
carries many of them.

A thread blocked in write(2), on a peer that does not read, cannot be
interrupted. Cancelling :meth:`StdoutStream.send_all` abandons it instead
(Trio's worker threads are daemon threads, so it cannot hold the process
open), and the stream is broken from then on: the abandoned thread may still
write the rest of its chunk, so nothing else may follow it.
"""

from __future__ import annotations

import os

import trio


class StdinStream(trio.abc.ReceiveStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await trio.to_thread.run_sync(
            os.read, self._fd, max_bytes or 65536, abandon_on_cancel=True
        )

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class StdoutStream(trio.abc.SendStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._closed = False
        # Set when a cancelled send_all left its thread blocked in write(2).
        self._abandoned = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError
        if self._abandoned:
            raise trio.BrokenResourceError("an abandoned write may still be in progress")
        try:
            await trio.to_thread.run_sync(
                _write_all, self._fd, bytes(data), abandon_on_cancel=True
            )
        except trio.Cancelled:
            self._abandoned = True
            raise

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                if self._abandoned:
                    # The abandoned thread writes to this fd by number. Closing
                    # it would let the number be reused for another file (the
                    # database) that the thread would then write into; /dev/null
                    # takes its place instead.
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, self._fd)
                    os.close(null)
                else:
                    os.close(self._fd)
            except OSError:
                pass
        await trio.lowlevel.checkpoint()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def claim_stdout() -> int:
    """Take fd 1 for frames and point fd 1 at stderr, so a stray print can
    never corrupt the protocol stream."""
    frames = os.dup(1)
    os.dup2(2, 1)
    return frames
