"""Parallel passes on the compiled path run their chunks in threads.

The compiled core releases the GIL, so threads share the chunks without
processes: no child is started, the result equals a sequential pass, and
an abandoned pass stops its threads at their next block instead of letting
them finish chunks nobody will read.
"""

from __future__ import annotations

import json
import threading
import time

import psutil
import pytest

from streamd.recall import oneshot
from streamd.recall.index import build, native, parallel

pytestmark = pytest.mark.skipif(native._native is None, reason="streamd._native is not built")


def record(i: int) -> bytes:
    words = " ".join(("amber", "birch", "cedar", "delta", "ember")[(i * k) % 5] for k in range(7))
    return json.dumps({"schema": 2, "id": f"r{i:07d}", "event_time": "2026-05-02T10:00:00Z",
                       "title": f"event {i % 97}", "text": words, "ref": f"t-{i}"}).encode() + b"\n"


def chunk_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streamd-chunk")]


def test_a_threaded_pass_starts_no_process_and_equals_a_sequential_one(recall_world, monkeypatch):
    w = recall_world
    stream = w.write("a.jsonl", *(record(i) for i in range(30_000)))
    size = stream.stat().st_size
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", size // 4)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", size // 5)
    monkeypatch.setattr(parallel, "FIRST_CHUNK_BYTES", size // 20)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    assert parallel.threaded()
    children = []
    real = parallel.build_chunk
    # Only children of this pass count: another test may have left one behind.
    before = {p.pid for p in psutil.Process().children()}

    def spy(*args):
        children.extend(p for p in psutil.Process().children() if p.pid not in before)
        return real(*args)

    monkeypatch.setattr(parallel, "build_chunk", spy)
    threaded = w.adapter()
    generation = oneshot.current(threaded)
    assert generation.indexed == 30_000 and children == []
    assert len(generation.view.segments) > 2  # it really was cut into chunks

    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 62)
    sequential = w.adapter(workdir=str(w.root / "seq"))
    (w.root / "seq").mkdir()
    ref = oneshot.current(sequential)
    for q in ("amber", "event 5", "t-77", "r0000042", ""):
        a, b = w.search(threaded, q, limit=20), w.search(sequential, q, limit=20)
        for r in (a, b):
            r["diagnostics"].pop("elapsed_ms", None)
        assert a == b
    assert threaded.generation.view.index.ids == ref.view.index.ids


def test_an_abandoned_threaded_pass_stops_its_threads_at_their_next_block(
    recall_world, monkeypatch
):
    w = recall_world
    stream = w.write("a.jsonl", *(record(i) for i in range(150_000)))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 20)
    # Four pieces: the first read in-process, two in the threads, one queued.
    monkeypatch.setattr(parallel, "CHUNK_BYTES", stream.stat().st_size // 3 + 1)
    monkeypatch.setattr(parallel, "FIRST_CHUNK_BYTES", stream.stat().st_size // 3 + 1)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    monkeypatch.setattr(build, "BLOCK_BYTES", 1 << 16)
    stopped = []
    real = parallel.build_chunk

    def spy(*args):
        out = real(*args)
        stopped.append(out is None)
        return out

    monkeypatch.setattr(parallel, "build_chunk", spy)
    steps = w.adapter().build(False)
    assert next(steps) is None  # a slice of the first piece, while the threads build theirs
    assert len(chunk_threads()) == 2
    steps.close()  # as a cancelled scanner or a shutdown abandons it
    deadline = time.monotonic() + 2
    while any(t.is_alive() for t in chunk_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in chunk_threads())
    assert stopped and all(stopped)  # neither chunk ran to its end
