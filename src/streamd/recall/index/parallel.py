"""Large catch-ups on every core.

A pass with many megabytes to read (a first build, a rebuild after a
rewrite) splits the unread part of a file into chunks at newline boundaries
and builds a segment per chunk in workers. Chunks come back in file order
and are renumbered into the index, so the result is the one a sequential
pass would have built: same records, same order, same postings.

The workers are threads when the compiled core builds the chunks (it
releases the GIL for all its work), and processes on the plain path, whose
per-record work is Python and holds the GIL. ``POOL`` says which. Threads
were chosen by measuring ``streamd index`` on the 1M-record stream (436 MB)
on the 2-core machine, 11 alternating runs each while other jobs shared it:
wall time median 4.0 s with threads vs 4.5 s with processes (best 3.3 vs
4.1 s; threads were faster in 8 of 11 pairs), CPU median 6.9 vs 7.8 s, peak
PSS 303-321 vs 362-429 MB. Threads start nothing, pickle nothing back and
keep one interpreter in memory, which also keeps a 1M build under 400 MB.

Small catch-ups stay in-process: starting workers costs more than reading a
few thousand lines. So does the first piece of a large one, read while the
workers start.

Worker threads stop at their next step (``BUILD_SLICE`` lines, about 10 ms)
once a pass is abandoned; nothing they built is read. Worker processes never
outlive the process that started them, however it ends:

* killed (kill -9 included): each worker asks the kernel for SIGKILL when
  its parent dies (``PR_SET_PDEATHSIG``, Linux), then checks that its
  parent is still the one that started it, which closes the window between
  its start and that request; elsewhere a thread in the worker polls for
  the same thing. (Linux sends the signal when the *thread* that started
  the worker ends, so the pool is made by the thread that drives the build,
  which outlives it: the thread running ``drive``.)
* a pass abandoned midway (cancelled, failed, or its process shutting
  down): the pool's workers are killed at once, not left to finish chunks
  nobody will read, so an exit is never delayed by a chunk.

Spawned workers need multiprocessing's resource tracker (it is started for
the pool's semaphores, and removes them if we die). It needs no care of its
own: it exits once every process holding its pipe, the workers and us, is gone.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures.process import BrokenProcessPool  # cf.process is imported lazily
from dataclasses import dataclass
from typing import TypeVar

from streamd import heap
from streamd.golang import gotime
from streamd.recall.index import native, streamfile
from streamd.recall.index.build import Consumer
from streamd.recall.index.index import Index
from streamd.recall.index.segment import Segment
from streamd.recall.index.streamfile import Cursor

PARALLEL_MIN_BYTES = 32 << 20
T = TypeVar("T")
CHUNK_BYTES = 24 << 20
FIRST_CHUNK_BYTES = 2 << 20
# "threads" or "processes": the workers of a parallel pass on the compiled
# path. The plain path always uses processes (its work holds the GIL).
POOL = "threads"


@dataclass(slots=True)
class ChunkResult:
    segments: list[Segment]
    kinds: list[str]
    records: int
    failed: int
    latest: int
    end: int


def build_chunk(path: str, identity: streamfile.Identity | None, start: int, end: int,
                file_no: int, built_at: int,
                stop: threading.Event | None = None) -> ChunkResult | None:
    """Runs in a worker: index the complete lines in ``[start, end)`` of the
    file the pass started on (``identity``). A worker thread gives up at its
    next step once ``stop`` is set (None)."""
    index = Index()
    consumer = Consumer(index, built_at, gotime.ZERO_TIME)
    cur = Cursor(path, start, identity=identity)
    for _ in consumer.read_into(cur, file_no, end):
        if stop is not None and stop.is_set():
            return None
    index.seal()
    return ChunkResult(list(index.segments), index.kinds, cur.records, cur.failed,
                       consumer.latest, cur.offset)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when ``parent`` ends."""
    armed = False
    if sys.platform == "linux":
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    # The parent may have died before the request above: then this worker
    # was already handed to another process and no signal will come.
    if os.getppid() != parent:
        os._exit(1)


def init_worker(parent: int) -> None:
    """Worker process initializer: die with ``parent``, and leave saying that
    the compiled core is missing to the parent, which already has."""
    die_with_parent(parent)
    native.quiet()
    heap.tune()  # this process is ours too


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def workers() -> int:
    return min(os.cpu_count() or 1, 8)


def threaded() -> bool:
    """Whether a parallel pass runs its chunks in threads (see ``POOL``)."""
    return POOL == "threads" and native.enabled()


def ranges(path: str, start: int, end: int, parts: int = 1) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces, each ending just after a newline.

    The first pieces are small (``FIRST_CHUNK_BYTES``, doubling each round of
    ``parts``) so that the first records are indexed, saved and searchable
    within a second, which is all a process spawned for one Recall command may
    live; the rest is cut into pieces of at most about ``CHUNK_BYTES``, as
    many as a multiple of ``parts`` so that no worker is left with the last
    piece alone."""
    targets = []
    pos, size = start, FIRST_CHUNK_BYTES
    while size < CHUNK_BYTES and end - pos > 2 * size * parts:
        for _ in range(parts):
            pos += size
            targets.append(pos)
        size *= 2
    count = max(parts, -(-(end - pos) // CHUNK_BYTES))
    count = -(-count // parts) * parts
    step = -(-(end - pos) // count)
    targets.extend(range(pos + step, end, step))
    out = []
    with streamfile.open_regular(path) as f:
        lo = start
        for target in targets:
            if target <= lo:
                continue
            cut = _line_start_after(f, target, end)
            if cut >= end:
                break
            out.append((lo, cut))
            lo = cut
        out.append((lo, end))
    return out


def _line_start_after(f, pos: int, end: int) -> int:
    """The offset just after the first newline at or after ``pos`` (``end`` if none)."""
    f.seek(pos)
    while True:
        block = f.read(1 << 16)
        if not block:
            return end
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)


Step = cf.Future | None


def read_into(consumer: Consumer, cur: Cursor, file_no: int) -> Generator[Step, None, None]:
    """Consume a file's unread complete lines, in parallel when there are many.
    Yields futures to wait on (or None between slices of in-process work).
    Every read is of the file the path named as the pass started: raises
    :class:`~streamd.recall.index.streamfile.Replaced` if it names another."""
    streamfile.start_pass(cur)
    size = streamfile.file_size(cur.path)
    end = 0
    if size is not None and size - cur.offset >= PARALLEL_MIN_BYTES and workers() >= 2:
        try:
            end = streamfile.last_newline_before(cur.path, size)
        except OSError:
            end = 0  # the sequential path reports what is wrong with the file
    if end - cur.offset < PARALLEL_MIN_BYTES:
        yield from consumer.read_into(cur, file_no)
        return
    before = set(multiprocessing.active_children())
    stop: threading.Event | None = None
    pool: cf.Executor
    if threaded():
        stop = threading.Event()
        pool = cf.ThreadPoolExecutor(workers(), thread_name_prefix="streamd-chunk")
    else:
        pool = cf.ProcessPoolExecutor(workers(), mp_context=multiprocessing.get_context("spawn"),
                                      initializer=init_worker, initargs=(os.getpid(),))
    finished = False
    try:
        todo = deque(ranges(cur.path, cur.offset, end, workers()))
        pending: deque[cf.Future] = deque()

        def submit() -> None:
            if todo:
                lo, hi = todo.popleft()
                args = (cur.path, cur.identity, lo, hi, file_no, consumer.built_at)
                pending.append(pool.submit(build_chunk, *args, *([stop] if stop else [])))

        # The first piece is read here while the workers start: a spawned
        # worker takes a second or more (several on a loaded machine) before
        # its first record, and the first records must be searchable sooner.
        _, first_end = todo.popleft()
        for _ in range(workers() + 1):
            submit()
        yield from consumer.read_into(cur, file_no, first_end)
        # A file gone or shortened meanwhile is read on in-process (below),
        # which says what became of it.
        if not cur.missing and cur.offset == first_end:
            while pending:
                fut = pending[0]
                while not fut.done():
                    yield fut
                result = fut.result()
                assert result is not None  # only a stopped thread gives up, and none is
                pending.popleft()
                submit()
                consumer.index.absorb(result.segments, result.kinds)
                cur.records += result.records
                cur.failed += result.failed
                consumer.bytes_done += result.end - cur.offset
                consumer.records_done += result.records
                cur.offset = result.end
                consumer.latest = max(consumer.latest, result.latest)
                yield None
            finished = True
    except (BrokenProcessPool, OSError):
        pass  # finish in-process from wherever the workers got to
    finally:
        if not finished:
            if stop is not None:
                stop.set()  # each thread ends at its next block
            else:
                # The pool's workers are the children started since it was made.
                for proc in set(multiprocessing.active_children()) - before:
                    proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
    yield from consumer.read_into(cur, file_no)


class Abandoned(Exception):
    """A build was told to stop before it finished; it published nothing."""


def drive(
    steps: Generator[Step, None, T],
    tick: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
) -> T:
    """Run a build to completion, blocking: the one loop that steps a build.

    The CLI calls it directly and the refresh scanner in a thread. ``tick``
    runs between steps (a progress line, say). Once ``stop`` is set the build
    is closed at its next step (within a tenth of a second while waiting on a
    worker), which kills its workers, and :class:`Abandoned` is raised."""
    with contextlib.closing(steps):
        while True:
            if stop is not None and stop.is_set():
                raise Abandoned
            try:
                step = next(steps)
            except StopIteration as done:
                return done.value
            if step is not None:
                cf.wait([step], timeout=0.1)
            if tick is not None:
                tick()
