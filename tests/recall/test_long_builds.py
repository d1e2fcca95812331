"""Builds belong to the scanner, never to a request.

A request waits for a build only as long as its deadline allows; then it is
answered from a prefix the build publishes on demand, honestly partial, and
the build goes on. A build that is stopped keeps what it sealed for the next
process, and builds of one workdir never overlap, whichever processes run
them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import trio
from support.build_gate import STEP_LINES
from support.recall import init, req, session
from support.recall_clock import in_seconds

from streamd.recall import oneshot
from streamd.recall.index import build, native, parallel
from streamd.recall.persist.lock import WorkdirLock

pytestmark = pytest.mark.slow


async def test_a_probe_during_a_long_build_reports_its_progress_without_waiting_or_publishing(
    gated_world,
):
    w, gate = gated_world
    records = len(w.path("a.jsonl").read_bytes().splitlines())
    with trio.fail_after(60):
        async with session() as (peer, _):
            await peer.send(init(w))
            assert "result" in await peer.recv()
            # The first probe starts the build; the second finds it at the
            # gate, one step read.
            await peer.send(req(2, "recall/health", deadline=in_seconds(5)))
            assert (await peer.recv())["result"]["coverage"] == "partial"
            await gate.held()
            await peer.send(req(5, "recall/health", deadline=in_seconds(5)))
            health = (await peer.recv())["result"]
            assert health["status"] == "degraded" and health["coverage"] == "partial"
            indexing = health["diagnostics"]["indexing"]
            assert 0 < indexing["consumed_bytes"] < indexing["total_bytes"]
            # Nothing was published for the probe: no generation to name yet.
            assert "index_generation" not in health and "indexed_count" not in health
            # A search whose deadline comes mid-build is answered from a prefix:
            # the step read before the gate.
            await peer.send(req(3, "recall/search", query="record", filters={}, limit=5,
                                deadline=in_seconds(2)))
            result = (await peer.recv())["result"]
            assert result["outcome"] == "partial"
            assert result["diagnostics"]["generation"] == "gen-1"
            assert result["diagnostics"]["indexed"] == STEP_LINES < records
            # The build went on without either request: a patient one gets all of it.
            gate.open()
            await peer.send(req(4, "recall/refresh", deadline=in_seconds(60)))
            done = (await peer.recv())["result"]
            assert done["status"] == "healthy" and done["coverage"] == "complete"
            assert done["indexed_count"] == records
            assert done["index_generation"] == "gen-2"
            assert "indexing" not in done["diagnostics"]


async def test_a_search_mid_build_says_partial_and_how_far_indexing_has_come(gated_world):
    w, gate = gated_world
    with trio.fail_after(60):
        async with session() as (peer, _):
            await peer.send(init(w))
            await peer.recv()
            await peer.send(req(2, "recall/search", query="record", filters={}, limit=5,
                                deadline=in_seconds(2)))
            result = (await peer.recv())["result"]
            assert result["outcome"] == "partial"
            assert result["diagnostics"]["coverage"] == "partial"
            assert result["diagnostics"]["indexed"] == STEP_LINES
            assert result["diagnostics"]["indexing"]["consumed_bytes"] > 0
            assert len(result["candidates"]) == 5
            gate.open()


def test_a_build_stopped_midway_keeps_what_it_read_for_the_next_process(recall_world):
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r-{i}", title=f"record {i}") for i in range(5_000)))
    first = w.adapter()
    stop = threading.Event()
    steps = first.build(False)
    for _ in range(2):  # two slices read when stopped
        assert next(steps) is None
    stop.set()
    with pytest.raises(parallel.Abandoned):
        parallel.drive(steps, None, stop)
    # A fresh process adopts the prefix and reads only the rest.
    second = w.adapter()
    generation = oneshot.current(second)
    assert generation.indexed == 5_000
    lines = build.BUILD_SLICE if native.enabled() else build.PLAIN_SLICE
    assert second.building.records_done == 5_000 - 2 * lines


def test_a_build_waits_for_the_workdir_lock_another_writer_holds(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a", title="one"))
    other = WorkdirLock(str(w.work))
    assert other.try_acquire()  # another process is building here
    adapter = w.adapter()
    steps = adapter.build(False)
    for _ in range(3):
        assert next(steps) is None  # waiting: nothing read, nothing written
    assert adapter.generation is None and not (w.work / "index").exists()
    other.release()
    generation = parallel.drive(steps)
    assert generation.indexed == 1 and generation.name == "gen-1"
    # The lock is released once the build is done.
    assert other.try_acquire()
    other.release()


def test_a_writer_that_finds_another_processes_index_adopts_it_and_continues_its_numbers(
    recall_world,
):
    w = recall_world
    w.write("a.jsonl", w.rec("a", title="one"))
    a = w.adapter()
    assert oneshot.current(a).name == "gen-1"
    b = w.adapter()  # a second process on the same workdir
    w.append("a.jsonl", w.rec("b", title="two"))
    assert oneshot.current(b).name == "gen-2"
    w.append("a.jsonl", w.rec("c", title="three"))
    generation = oneshot.current(a)
    # a saw b's manifest: it adopted b's index instead of overwriting it, and
    # numbered after b's generation.
    assert generation.name == "gen-3" and generation.indexed == 3
    assert a.building.records_done == 1
    # Every segment the manifest names exists: nobody deleted another's work.
    fresh = w.adapter()
    assert oneshot.current(fresh).indexed == 3
    assert fresh.building.records_done == 0
    assert sorted(c["source_record_id"] for c in w.search(fresh, "")["candidates"]) == [
        "a", "b", "c",
    ]


def test_a_process_killed_mid_build_leaves_progress_the_next_process_continues_from(
    recall_world,
):
    from support.recall_faults import poll, record

    w = recall_world
    w.write("a.jsonl", *(record(i) for i in range(150_000)))
    manifest = w.work / "index" / "manifest.json"
    env = {**os.environ, "STREAMD_NATIVE": "0"}  # the plain path: slow enough to interrupt
    first = subprocess.Popen([sys.executable, "-m", "streamd"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        # In lockstep, as the core drives it: requests run concurrently, so a
        # refresh pipelined behind the handshake could run before it.
        first.stdin.write(json.dumps(init(w)).encode() + b"\n")
        first.stdin.flush()
        assert b'"id":1' in first.stdout.readline()
        first.stdin.write(json.dumps(req(2, "recall/refresh", deadline=in_seconds(600)))
                          .encode() + b"\n")
        first.stdin.flush()  # the build runs; its answer is never read

        def saved_some() -> int:
            assert first.poll() is None, "the build finished before it could be interrupted"
            try:
                body = json.loads(manifest.read_text())
            except (OSError, ValueError):
                return 0
            return body["records"]

        saved = poll(saved_some, 120, "a progress save")
        os.kill(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(30)
    kept = json.loads(manifest.read_text())["records"]  # the last save before the kill
    assert 0 < saved <= kept < 150_000
    second = w.adapter()
    generation = oneshot.current(second)
    assert generation.indexed == 150_000
    # It read only what the killed process had not saved.
    assert second.building.bytes_start > 0
    assert second.building.records_done == 150_000 - kept


async def test_a_build_that_cannot_publish_in_time_leaves_the_search_its_earlier_prefix(
    gated_world,
):
    # A build stuck between steps (a slow save, a loaded disk) cannot publish
    # the prefix a search asks for; the search must still answer before its
    # deadline, from the prefix published before.
    w, gate = gated_world
    with trio.fail_after(60):
        async with session() as (peer, _):
            await peer.send(init(w))
            await peer.recv()
            await peer.send(req(2, "recall/search", query="record", filters={}, limit=5,
                                deadline=in_seconds(2)))
            first = (await peer.recv())["result"]
            assert first["diagnostics"]["generation"] == "gen-1"
            gate.publishes = False
            await peer.send(req(3, "recall/search", query="record", filters={}, limit=5,
                                deadline=in_seconds(2)))
            second = await peer.recv()
            gate.open()
    assert "result" in second, second
    assert second["result"]["outcome"] == "partial"
    assert second["result"]["diagnostics"]["generation"] == "gen-1"


def test_a_parallel_pass_reads_its_first_piece_while_its_workers_start(recall_world, monkeypatch):
    # Spawned workers take seconds to start on a loaded machine; the first
    # records must not wait for them, or a search asking for a prefix meanwhile
    # gets one with nothing in it.
    from support.recall_faults import record

    w = recall_world
    stream = w.write("a.jsonl", *(record(i) for i in range(10_000)))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", stream.stat().st_size // 4)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    monkeypatch.setattr(parallel, "threaded", lambda: True)  # workers in this process
    started = threading.Event()
    real = parallel.build_chunk

    def not_started_yet(*args):
        started.wait(60)
        return real(*args)

    monkeypatch.setattr(parallel, "build_chunk", not_started_yet)
    adapter = w.adapter()
    steps = adapter.build(False)
    try:
        assert next(steps) is None  # a slice read here, not a worker's future
        adapter.publish_requested.set()
        next(steps)
        assert adapter.generation is not None and adapter.generation.indexing is not None
        assert adapter.generation.indexed > 0  # before any worker has delivered
    finally:
        started.set()
    generation = parallel.drive(steps)
    assert generation.indexed == 10_000 and generation.complete


def test_a_plain_build_steps_at_least_every_250_lines(recall_world, monkeypatch):
    # A build publishes a prefix, or stops, only between its steps: on the
    # plain path, at 75-85 us a line, 2,000 lines were 160 ms (and several
    # times that on a loaded machine) that a request waited on top.
    monkeypatch.setenv("STREAMD_NATIVE", "0")
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r-{i}", title=f"record {i}") for i in range(1_000)))
    adapter = w.adapter()
    steps = adapter.build(False)
    read = []
    with pytest.raises(StopIteration):
        while True:
            next(steps)
            read.append(adapter.building.records_done)
    assert read[:4] == [250, 500, 750, 1_000]
