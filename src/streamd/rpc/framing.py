"""Newline-delimited framing, sans I/O.

Bytes go in, complete lines come out. The size limit is enforced while
reading: once a line outgrows ``max_frame`` its bytes are dropped as they
arrive and only its size is remembered, so a hostile peer sending a
gigabyte without a newline costs us ``max_frame`` of memory, not a gigabyte.

Nesting is the other limit a frame must pass before it is decoded. msgspec
recurses once per array or object level (skipping a ``Raw`` member too) and
raises RecursionError near Python's recursion limit, about 1,000 levels
minus however deep the decoding task already is; a handler walking the
decoded value recurses as well. :func:`nests_deeper_than` refuses such a
frame with a linear scan that never recurses. The scan runs only for a frame
holding more opening brackets than the limit, so ordinary frames pay two
``bytes.count`` calls (counted once by the protocol, which estimates a call's
decoded size from them too: :mod:`~streamd.rpc.footprint`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_FRAME_BYTES = 8 << 20
# Arrays and objects, the request object itself included. Far beyond any
# request the methods take, far below where decoding or handling recurses out.
MAX_DEPTH = 128


# How much of an oversized line is kept: enough for the envelope's first
# keys, which name the request or the watch it belongs to (the daemon writes
# them first), so a client can fail that call instead of waiting for ever.
HEAD_BYTES = 256


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line that exceeded the limit; its content was discarded unread, all
    but its first :data:`HEAD_BYTES`."""

    size: int
    head: bytes = b""


Frame = bytes | Oversized


class LineSplitter:
    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame
        self._buf = bytearray()
        # Bytes of the current line thrown away because it is over the limit.
        self._dropped = 0
        self._head = b""  # the first bytes of the line being dropped

    def feed(self, data: bytes | bytearray) -> list[Frame]:
        # One split in C instead of a find, a copy into the buffer and a copy
        # out of it per line: a read of 50 appends is one call, and only the
        # line it starts in the middle of goes through the buffer.
        if type(data) is not bytes:
            data = bytes(data)  # a bytearray's lines would be bytearrays
        lines = data.split(b"\n")
        rest = lines.pop()  # after the last newline: the start of the next line
        # A copy of the pointers (cheap beside the split): the list will hold
        # Oversized beside bytes, which a list of bytes may not.
        frames: list[Frame] = [*lines]
        if frames:
            if self._buf or self._dropped:
                self._keep(lines[0])
                frames[0] = self._take()
            # Only a read longer than the limit can hold a line over it (the
            # first line, joined to the buffer, was checked by _keep).
            if len(data) > self._max:
                limit = self._max
                frames = [
                    Oversized(len(f), f[:HEAD_BYTES]) if type(f) is bytes and len(f) > limit
                    else f
                    for f in frames
                ]
        self._keep(rest)
        return frames

    def close(self) -> list[Frame]:
        """End of input: a last line without a newline is still a frame."""
        if self._buf or self._dropped:
            return [self._take()]
        return []

    @property
    def pending(self) -> int:
        """The bytes of the unfinished line held (none of one over the limit)."""
        return len(self._buf)

    def _keep(self, chunk: bytes) -> None:
        if self._dropped:
            self._dropped += len(chunk)
        elif len(self._buf) + len(chunk) > self._max:
            self._dropped = len(self._buf) + len(chunk)
            self._head = bytes((self._buf + chunk[:HEAD_BYTES])[:HEAD_BYTES])
            self._buf.clear()
        else:
            self._buf += chunk

    def _take(self) -> Frame:
        if self._dropped:
            size, self._dropped = self._dropped, 0
            head, self._head = self._head, b""
            return Oversized(size, head)
        line = bytes(self._buf)
        self._buf.clear()
        return line


@functools.cache
def _scan_tables():
    """What each byte is to the depth scan: 0 text, 1 a quote, 2 an opening and
    3 a closing bracket; and what each of those does to the depth. numpy is
    imported here, on the first deep frame, not with the module: the thin
    clients use this protocol and must start without it."""
    import numpy as np

    kind = np.zeros(256, dtype=np.uint8)
    kind[ord('"')] = 1
    kind[[ord("["), ord("{")]] = 2
    kind[[ord("]"), ord("}")]] = 3
    return np, kind, np.array([0, 0, 1, -1], dtype=np.int32)


_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
# Work in slices so an adversarial frame costs a few small temporaries, not
# several times its size in 64-bit positions.
_SCAN_SLICE = 1 << 20


def nests_deeper_than(frame: bytes, limit: int = MAX_DEPTH, openings: int | None = None) -> bool:
    """True when arrays and objects in ``frame`` nest more than ``limit`` deep.

    Brackets inside strings are text, not structure. On malformed JSON the
    answer may be either, but it is never lower than the depth a decoder
    reaches before it finds the fault: up to the first fault this reads the
    frame exactly as JSON does. ``openings``: the frame's count of ``[`` and
    ``{``, when the caller has it already.
    """
    if openings is None:
        openings = frame.count(b"[") + frame.count(b"{")
    if openings <= limit:
        return False
    # Hide escapes so every remaining quote delimits a string: pairs of
    # backslashes first (left to right, as a decoder pairs them), then an
    # escaped quote. Then keep only quotes and brackets: prose, numbers and
    # keys vanish at C speed, and what is left is usually tiny.
    np, kind_of, step = _scan_tables()
    text = frame.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    kinds = kind_of.take(np.frombuffer(text.translate(None, _NOT_STRUCTURE), dtype=np.uint8))
    depth = 0
    in_string = 0
    for start in range(0, len(kinds), _SCAN_SLICE):
        part = kinds[start : start + _SCAN_SLICE]
        # 1 from an opening quote up to (not including) its closing quote
        # (a running sum of quotes, whose parity is all that matters).
        inside = (np.cumsum(part == 1, dtype=np.uint8) + in_string) & 1
        in_string = int(inside[-1])
        levels = np.cumsum(np.where(inside == 0, step.take(part), 0), dtype=np.int32)
        if depth + int(levels.max()) > limit:
            return True
        depth += int(levels[-1])
    return False
