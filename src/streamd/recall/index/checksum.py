"""The checksums of a segment file's arrays: taken when it is written, checked
when a new process adopts it.

A durable index is ours alone (the reference adapter rebuilds at every
spawn), so is its integrity: a flipped byte in a posting list would give
wrong answers (records missing, or the wrong ones) for as long as the
workdir lives, and the tables' plausibility checks (``segment.check``)
cannot see it. Each array's CRC-32 goes into the segment's header.

Rules:

* CRC-32 as zlib computes it: the standard library has it, so the plain
  path needs no package, and the compiled core (``native/src/checksum.rs``,
  the ``crc32fast`` crate) computes the same values about four times
  faster (13 against 3.5 GB/s on the bench's VM), with the GIL released.
  Either checks what either wrote. It catches every burst of damage up to
  32 bits long and misses other damage once in 2^32; it guards against a
  disk or a hand that changed bytes, not against someone forging a file.
* Taken over the arrays' bytes in memory, as they are written
  (``segment.encode``): no file is read back for it.
* Checked by reading the file with ``pread`` in chunks of at most ``CHUNK``
  into one buffer, never through the mapping: the pages read stay in the
  page cache, out of this process's resident set, which a restart works to
  keep low (``segfile``).
* ``STREAMD_NATIVE=0`` takes the plain path here too (``plain``), read at
  each call.
"""

from __future__ import annotations

import errno
import os
import zlib
from collections.abc import Sequence

from streamd import plain

__all__ = ["CHUNK", "crc32", "file_crc32"]

# The most a check reads at once: each chunk is summed while it is still in
# the CPU's cache. Checking a 1M index took 44 ms of CPU in 256 KiB chunks,
# 52 in 1 MiB ones (the compiled core's, which has its own CHUNK).
CHUNK = 1 << 18

# The compiled checksums' interface (its CHECKSUM_INTERFACE).
CHECKSUM_INTERFACE = 1

try:
    from streamd import _native as _core
except ImportError:  # built without a Rust toolchain: zlib it is
    _core = None  # type: ignore[assignment]
_compiled = _core if getattr(_core, "CHECKSUM_INTERFACE", None) == CHECKSUM_INTERFACE else None


def crc32(data: memoryview | bytes, value: int = 0) -> int:
    """CRC-32 of ``data`` (contiguous), continuing from ``value``."""
    if _compiled is not None and not plain.asked():
        return _compiled.crc32(memoryview(data).cast("B"), value)
    return zlib.crc32(data, value)


def file_crc32(fd: int, spans: Sequence[tuple[int, int]]) -> list[int]:
    """CRC-32 of each ``(offset, length)`` span of the open file ``fd``, read
    in chunks. A span past the end of the file is an OSError."""
    if _compiled is not None and not plain.asked():
        return _compiled.file_crc32(fd, list(spans))
    return _plain_file_crc32(fd, spans)


def _plain_file_crc32(fd: int, spans: Sequence[tuple[int, int]]) -> list[int]:
    largest = max((length for _, length in spans), default=0)
    view = memoryview(bytearray(min(largest, CHUNK)))
    sums = []
    for at, length in spans:
        value = done = 0
        while done < length:
            got = os.preadv(fd, [view[:min(length - done, len(view))]], at + done)
            if not got:
                raise OSError(errno.EIO, "the file is shorter than its header says")
            # zlib releases the GIL over a chunk this size, as preadv does.
            value = zlib.crc32(view[:got], value)
            done += got
        sums.append(value)
    return sums
