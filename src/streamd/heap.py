"""Heap memory a big build freed, handed back to the system.

A build of a million records allocates and frees some hundreds of megabytes
in passing (token lists, the compiled builder's arrays, segments before they
are written and mapped back). glibc keeps freed memory in its arenas for
reuse, so after the build the daemon's resident set stayed about 100 MB
above what it holds: at 1M records, 339 MB where 241 MB are live.
``malloc_trim`` returns it, in about 6 ms, which a build of that size can
spend. Elsewhere (another C library, no ``malloc_trim``) this does nothing.

``malloc_trim`` cannot return what the build's worker threads freed: each
thread allocates from an arena of its own, and glibc only shrinks such an
arena from its top, once more than the trim threshold is free there. That
threshold follows the largest block freed so far (up to 64 MB, the whole
arena), so after a build the threads' arenas stayed resident: 85-107 MB of
a 1M-record build's 240 MB of heap, all of it free. A process that builds
(the daemon, ``streamd index``) fixes both thresholds at start (``tune``):
blocks of 32 MiB or more are mapped on their own (where glibc's own
threshold ends up after a big build anyway, so the build allocates as it
did), and an arena's free top beyond 8 MiB is returned. In process, a 1M
build's heap after it fell from 170-177 to 101-108 MB and its peak from
272-275 to 261-266 MB (with the compact ids of ``idlist``), for 20-50 %
more page faults. A 1 MiB mapping threshold kept the peak at 213-224 MB
but took 4.5 times the page faults (+0.45 s of system CPU). Only the
process's owner may set this: library code (``oneshot``) leaves the
allocator as it finds it.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

# A pass that added at least this many records is worth a trim.
TRIM_RECORDS = 100_000
# glibc's mallopt parameters (<malloc.h>) and the values ``tune`` sets.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 8 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library this process runs on (its own symbols: no search, which
    would start ``ldconfig``)."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


@functools.cache
def tune() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (see above);
    False where the C library has no ``mallopt``. Once per process."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Either one alone also stops glibc from raising both after a big free.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


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
