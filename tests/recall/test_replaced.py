"""A stream file replaced (renamed over) while a build reads it.

A build reads a file in pieces: slices in this process, chunks in workers
that each open the path again, and at the end it takes the file's
fingerprint, again by path. A file renamed over the path meanwhile used to be
read half old, half new, and published under the new file's fingerprint: the
new file's first records were never found, health said complete, and a
restart adopted the index as it was. Now every read of a pass must be of the
file the pass started on; the build starts over from nothing when one is not,
and says ``stream_rewritten`` as for any rewrite.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from streamd.errors import RpcError
from streamd.recall.index import parallel, streamfile
from streamd.recall.oneshot import current

N = 12_000  # several steps of a build on either path


def lines(prefix: str, n: int = N) -> list[bytes]:
    # The same length for both prefixes: the size alone says nothing.
    return [json.dumps({"schema": 2, "id": f"{prefix}{i:06d}",
                        "event_time": "2026-05-02T10:00:00Z", "title": f"{prefix} {i}",
                        "text": f"{prefix}word number {i}"}).encode() + b"\n" for i in range(n)]


def ids(w, adapter, query: str) -> list[str]:
    return [c["source_record_id"] for c in w.search(adapter, query, limit=3)["candidates"]]


def replace(w) -> None:
    """Rename a file of other records (as long) over ``a.jsonl``."""
    new = w.write("new.jsonl", *lines("y"))
    os.rename(new, w.path("a.jsonl"))


def assert_reads_the_new_file(w, adapter, generation) -> None:
    assert generation.rewritten and generation.indexed == N
    assert ids(w, adapter, "y000000") == ["y000000"]
    assert ids(w, adapter, "x000000") == []
    assert w.search(adapter, "yword")["diagnostics"]["matched"] == N
    assert w.health(adapter)["diagnostics"].get("stream_rewritten") is True
    # What was saved is the new file's: a restart adopts it and finds the same.
    again = w.adapter()
    assert ids(w, again, "y000000") == ["y000000"]
    assert again.generation is not None and again.generation.indexed == N


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_file_renamed_over_during_an_in_process_pass_is_read_anew(
        recall_world, monkeypatch, native: str) -> None:
    monkeypatch.setenv("STREAMD_NATIVE", native)
    w = recall_world
    w.write("a.jsonl", *lines("x"))
    adapter = w.adapter()
    steps = adapter.build(False)
    assert next(steps) is None  # a first slice of the old file is read
    replace(w)
    assert_reads_the_new_file(w, adapter, parallel.drive(steps))


def test_a_file_renamed_over_while_workers_wait_to_read_it_is_read_anew(
        recall_world, monkeypatch) -> None:
    w = recall_world
    stream = w.write("a.jsonl", *lines("x"))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", stream.stat().st_size // 4)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    monkeypatch.setattr(parallel, "threaded", lambda: True)
    go = threading.Event()
    real = parallel.build_chunk

    def after_the_rename(*args):
        go.wait(60)
        return real(*args)

    monkeypatch.setattr(parallel, "build_chunk", after_the_rename)
    adapter = w.adapter()
    steps = adapter.build(False)
    try:
        assert next(steps) is None  # the first piece, read here, is of the old file
        replace(w)
    finally:
        go.set()  # the workers open the path now: the new file
    assert_reads_the_new_file(w, adapter, parallel.drive(steps))


def test_a_file_replaced_at_every_pass_fails_the_build_by_name(recall_world, monkeypatch):
    w = recall_world
    w.write("a.jsonl", *lines("x", 10))
    adapter = w.adapter()

    def another_file(cur: streamfile.Cursor) -> None:
        cur.identity = (0, 0)  # never the file's: every open finds it replaced

    monkeypatch.setattr(streamfile, "start_pass", another_file)
    with pytest.raises(RpcError) as caught:
        current(adapter)
    assert caught.value.message == "a.jsonl was replaced while it was read, 3 times in a row"


def rec(prefix: str, i: int) -> bytes:
    return json.dumps({"schema": 2, "id": f"{prefix}{i}", "event_time": "2026-05-02T10:00:00Z",
                       "title": f"{prefix} {i}", "text": f"{prefix}word {i}"}).encode() + b"\n"


def test_a_file_replaced_between_builds_by_a_longer_copy_is_caught_up_not_rebuilt(
        recall_world) -> None:
    # rsync's temp-and-rename, a writer's atomic append: the same bytes and
    # more, in another file. The next pass reads it on; the identity of the
    # file the last pass read must not be held against it (a prefix the next
    # pass publishes while it reads the first file included).
    w = recall_world
    w.write("a.jsonl", *(rec("a", i) for i in range(100)))
    w.write("b.jsonl", *(rec("b", i) for i in range(100)))
    adapter = w.adapter(["a.jsonl", "b.jsonl"])
    assert parallel.drive(adapter.build(False)).indexed == 200
    copy = w.write(".b.tmp", *(rec("b", i) for i in range(110)))
    os.rename(copy, w.path("b.jsonl"))
    w.append("a.jsonl", *(rec("a", i) for i in range(100, 5_000)))
    adapter.publish_requested.set()  # a search asks for a prefix meanwhile
    generation = parallel.drive(adapter.build(False))
    assert (generation.indexed, generation.rewritten) == (5_110, False)


def test_a_failed_save_is_saved_again_though_an_empty_file_was_replaced(
        recall_world, monkeypatch) -> None:
    # save_again runs outside any pass: no file is held to a pass's identity.
    w = recall_world
    w.write("a.jsonl", *(rec("a", i) for i in range(10)))
    w.write("c.jsonl")
    adapter = w.adapter(["a.jsonl", "c.jsonl"])
    assert adapter.durable is not None

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(adapter.durable, "save", full)
        parallel.drive(adapter.build(False))
    assert adapter.checkpoint_failed and adapter.save_error == "No space left on device"
    empty = w.write(".c.tmp")
    os.rename(empty, w.path("c.jsonl"))
    assert adapter.save_due(True)
    adapter.save_again()
    assert not adapter.checkpoint_failed and adapter.save_error == ""
