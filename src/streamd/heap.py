"""Heap memory a big build freed, handed back to the system.

A build of a million records allocates and frees some hundreds of megabytes
in passing (token lists, the compiled builder's arrays, segments before they
are written and mapped back). glibc keeps freed memory in its arenas for
reuse, so after the build the daemon's resident set stayed about 100 MB
above what it holds: at 1M records, 339 MB where 241 MB are live.
``malloc_trim`` returns it, in about 6 ms, which a build of that size can
spend. Elsewhere (another C library, no ``malloc_trim``) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

# A pass that added at least this many records is worth a trim.
TRIM_RECORDS = 100_000


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release() -> bool:
    """Hand freed heap memory back to the system; False where the C
    library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def after_build(added_records: int) -> None:
    """Called when a build published: trims after a big one."""
    if added_records >= TRIM_RECORDS:
        release()
