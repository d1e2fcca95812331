"""What a request's params take in memory once decoded, estimated before decoding.

A frame's bytes say little about the memory its params take as Python
values: every JSON container and most scalars become an object of their own,
and a frame can be made of little else. Measured on CPython 3.11 and msgspec
(2 MiB frames of one repeated item, ``tracemalloc`` after decoding):

===============================  ================  ===============
item                             decoded / frame   bytes per item
===============================  ================  ===============
``{}``                           24x               72
``[[]]``                         31x               153
``{"":{"":{}}}``                 34x               441
``{"a":"b"}``                    24x               243
``"ab"``                         12x               60
``1000``                         7x                37
one long string                  1x, 4x with one character past U+FFFF
===============================  ================  ===============

So 8 MiB of ``[{},{},...]`` is some 200 MB once decoded, and bounds that count
frame bytes (64 MiB in flight per connection) let one client make the daemon
hold gigabytes. :func:`decoded_size` is an upper estimate of that memory from
what the frame holds, counted at C speed before anything is decoded: a price
per ``{``, per ``[``, per ``,`` (a member of a list or an object) and per
``"`` (half a string), fitted to lie above every row of the table and above
objects of up to 350,000 members, plus the frame's bytes for its text, four
times them unless the frame is ASCII without a ``\\u`` escape (one character
past U+FFFF makes a whole Python string four bytes a character). Brackets,
commas and quotes inside strings count too, so the estimate errs high (about
twice for ordinary content, up to 8x for a list of small integers, which
CPython shares), never low. It costs two ``bytes.count`` calls more than the
nesting check's two, whose counts it reuses
(:func:`~streamd.rpc.framing.nests_deeper_than`): classifying an 837-byte
ADK append frame went from 3-5 to 5-7 us, an 8 MiB frame from 8-17 to 28-29
ms (a loaded 2-core machine), beside some 300 us of daemon CPU per append
(``bench/daemon_request_cost.py``, where the difference is within the noise).

The server charges this estimate, not the frame's bytes, against the
connection's in-flight bound, and refuses a request whose estimate passes
:data:`MAX_DECODED_BYTES` without decoding it
(:class:`~streamd.rpc.protocol.FrameReader`). An 8 MiB string, the largest
legitimate params, is estimated at 8 MiB, or 32 MiB when it is not ASCII:
within the limit. So is content of the 5 MiB a stored event may take
(``eventlog/append``) made of function calls, table rows, token ids or bytes
as a list of integers (at most 18 times their bytes, estimated). What is
refused is a frame made mostly of small containers: 3.8 MiB of ``{}`` (some
90 MB once decoded).
"""

from __future__ import annotations

__all__ = ["MAX_DECODED_BYTES", "decoded_size"]

# Fitted to the table above and to objects of up to 350,000 members: a dict
# with its first table; a list; a member (a list slot, or a dict's share of
# its table, which grows by doubling, with a number's object); a string's
# object, half per quote (a key too: short keys are shared, long ones not).
OBJECT_BYTES = 160
ARRAY_BYTES = 80
MEMBER_BYTES = 40
QUOTE_BYTES = 32

MAX_DECODED_BYTES = 256 << 20
"""The most one request's params may be estimated to take. Above a
connection's in-flight bound (``MAX_INFLIGHT_BYTES``, 64 MiB), so such a
request is admitted only alone (:class:`~streamd.rpc.inflight.InFlight`):
at 64 MiB, events of 3.6 MiB of small table rows (a tool's result,
estimated at 18 times its bytes) were refused, though the log stores events
of 5 MiB."""


def decoded_size(frame: bytes, objects: int, arrays: int) -> int:
    """An upper estimate of the bytes ``frame`` takes once decoded, given its
    counts of ``{`` (``objects``) and ``[`` (``arrays``)."""
    text = len(frame)
    # A backslash first: its search is a memchr, and most frames hold none.
    if not frame.isascii() or (b"\\" in frame and b"\\u" in frame):
        text *= 4
    return (text + OBJECT_BYTES * objects + ARRAY_BYTES * arrays
            + MEMBER_BYTES * frame.count(b",") + QUOTE_BYTES * frame.count(b'"'))
