"""Newline-delimited framing, sans I/O.

Bytes go in, complete lines come out. The size limit is enforced while
reading: once a line outgrows ``max_frame`` its bytes are dropped as they
arrive and only its size is remembered, so a hostile peer sending a
gigabyte without a newline costs us ``max_frame`` of memory, not a gigabyte.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_FRAME_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line that exceeded the limit; its content was discarded unread."""

    size: int


Frame = bytes | Oversized


class LineSplitter:
    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame
        self._buf = bytearray()
        # Bytes of the current line thrown away because it is over the limit.
        self._dropped = 0

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._keep(data[start:])
                return frames
            self._keep(data[start:nl])
            frames.append(self._take())
            start = nl + 1

    def close(self) -> list[Frame]:
        """End of input: a last line without a newline is still a frame."""
        if self._buf or self._dropped:
            return [self._take()]
        return []

    def _keep(self, chunk: bytes) -> None:
        if self._dropped:
            self._dropped += len(chunk)
        elif len(self._buf) + len(chunk) > self._max:
            self._dropped = len(self._buf) + len(chunk)
            self._buf.clear()
        else:
            self._buf += chunk

    def _take(self) -> Frame:
        if self._dropped:
            size, self._dropped = self._dropped, 0
            return Oversized(size)
        line = bytes(self._buf)
        self._buf.clear()
        return line
