"""The saved index: what a restart costs, and what a crash mid-build leaves.

A restarted adapter must read only the bytes appended since the saved
manifest, and a build killed at any point must leave the last published
generation whole: the next process adopts it, removes the dead build's
leftovers, and answers exactly like a process that built everything fresh.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from streamd.errors import RpcError
from streamd.recall.index import build, parallel
from streamd.recall.index import streamfile as catchup
from streamd.recall.index.parallel import drive
from streamd.recall.persist import atomic
from streamd.recall.persist import manifest as durable
from streamd.recall.persist.lock import WorkdirLock

pytestmark = pytest.mark.subprocess

WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor"]


def body(i: int) -> bytes:
    words = " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 6))
    return json.dumps({
        "schema": 2, "id": f"r{i:07d}", "event_time": f"2026-05-02T10:{(i // 60) % 60:02d}:"
        f"{i % 60:02d}Z", "title": f"event {i % 97}", "text": words, "ref": f"t-{i % 5000}",
    }).encode() + b"\n"


def answers(world, adapter, queries=("amber cedar", "t-42", "event 7", "")):
    generation = drive(adapter.build(False))
    out = []
    for q in queries:
        result = world.search(adapter, q, limit=20)
        out.append([(c["candidate_id"], c["local_score"], c["relevance"])
                    for c in result["candidates"]])
        out.append(result["diagnostics"]["matched"])
    return generation, out


def spy_reads(monkeypatch, reads: list[int]) -> None:
    """Record where the compiled path starts reading a file (``lines_after``
    is the plain path's reader)."""
    real = build.read_blocks

    def spy(consumer, cur, file_no, end=None, stop=None):
        reads.append(cur.offset)
        return real(consumer, cur, file_no, end, stop)

    monkeypatch.setattr(build, "read_blocks", spy)


def test_a_restart_reads_only_the_bytes_appended_since_the_saved_index(recall_world, monkeypatch):
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(3000)))
    first = w.adapter()
    drive(first.build(False))
    saved = os.path.getsize(w.path("a.jsonl"))
    w.append("a.jsonl", *(body(i) for i in range(3000, 3100)))

    reads: list[int] = []
    real = catchup.lines_after

    def spy(path, offset, end=None):
        reads.append(offset)
        return real(path, offset, end)

    monkeypatch.setattr(catchup, "lines_after", spy)
    spy_reads(monkeypatch, reads)  # the compiled path reads blocks, not lines
    restarted = w.adapter()
    generation, got = answers(w, restarted)
    assert reads == [saved]
    assert generation.indexed == 3100
    assert got == answers(w, fresh(w))[1]


def fresh(w):
    """An adapter that built everything itself, in a workdir of its own."""
    other = w.root / "fresh-work"
    other.mkdir(exist_ok=True)
    return w.adapter(workdir=str(other))


def test_generations_continue_and_observed_times_survive_a_restart(recall_world):
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(50)))
    first = w.adapter()
    generation = drive(first.build(False))
    before = w.search(first, "", limit=5)["candidates"]
    restarted = w.adapter()
    restarted.clock = lambda: generation.built_at + 3_600 * 10**9  # an hour later
    again = drive(restarted.build(False))
    assert again.gen == generation.gen + 1
    assert w.search(restarted, "", limit=5)["candidates"][0]["observed_at"] == \
        before[0]["observed_at"]


def test_a_parallel_build_equals_a_sequential_one(recall_world, monkeypatch):
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(6000)))
    size = os.path.getsize(w.path("a.jsonl"))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", size // 4)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", size // 5)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    sequential_dir = w.root / "seq"
    sequential_dir.mkdir()
    par = w.adapter()
    par_snap, par_answers = answers(w, par)
    assert len(par_snap.view.segments) >= 4  # it really was cut into chunks
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 62)
    seq = w.adapter(workdir=str(sequential_dir))
    seq_snap, seq_answers = answers(w, seq)
    assert par_answers == seq_answers
    assert par_snap.indexed == seq_snap.indexed == 6000


KILLED_BUILD = """
import sys
from streamd.cli import main
sys.exit(main(["index", "--workdir", sys.argv[1], sys.argv[2]]))
"""


def test_kill_9_in_the_middle_of_a_build_leaves_the_last_generation_usable(recall_world):
    w = recall_world
    stream = w.write("a.jsonl", *(body(i) for i in range(2000)))
    subprocess.run([sys.executable, "-c", KILLED_BUILD, str(w.work), str(stream)], check=True,
                   capture_output=True, timeout=60)
    index_dir = w.work / "index"
    manifest = (index_dir / "manifest.json").read_bytes()
    before = set(os.listdir(index_dir))

    # Enough appended lines that the builder seals (and writes) a segment
    # well before the pass can publish.
    w.append("a.jsonl", *(body(i) for i in range(2000, 2000 + 150_000)))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(w.work), str(stream)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (set(os.listdir(index_dir)) - before - {"manifest.json"}):
            assert proc.poll() is None, "the build finished before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert (index_dir / "manifest.json").read_bytes() == manifest  # never published

    restarted = w.adapter()
    generation, got = answers(w, restarted)
    assert generation.indexed == 152_000
    assert got == answers(w, fresh(w))[1]
    leftovers = set(os.listdir(index_dir)) - {"manifest.json"}
    named = set(json.loads((index_dir / "manifest.json").read_text())["segments"])
    assert leftovers == named  # the dead build's files are gone


def without_a_writer(fifo, fn):
    """``fn()``'s outcome, failing the test if it waits for a writer to open
    ``fifo`` (10 s is an eternity for a call that must not wait at all; a
    writer is then opened to release it, so a regression fails, never hangs)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join()
        pytest.fail(f"{fn} blocked opening a FIFO")
    return outcome[0]


def test_a_fifo_in_place_of_a_stream_file_is_refused_without_waiting_for_a_writer(recall_world):
    fifo = str(recall_world.root / "pipe")
    os.mkfifo(fifo)
    assert without_a_writer(fifo, lambda: durable.fingerprint(fifo, 10)) == ""
    assert without_a_writer(fifo, lambda: catchup.read_spans([catchup.Span(fifo, 0, 10)])) == [None]
    refused = without_a_writer(fifo, lambda: catchup.last_newline_before(fifo, 10))
    assert isinstance(refused, OSError) and "not a regular file" in str(refused)


def test_a_write_that_fails_midway_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "manifest.json"
    atomic.write_atomic(str(target), [b"first ", b"version"])

    def chunks():
        yield b"second"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic.write_atomic(str(target), chunks())
    assert target.read_bytes() == b"first version"
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_drive_closes_a_build_told_to_stop_at_its_next_step_and_publishes_nothing():
    stop = threading.Event()
    closed = []

    def build():
        try:
            for step in range(1_000):
                if step == 3:
                    stop.set()  # as the scanner does when its connection ends
                yield None
            return "published"
        finally:
            closed.append(step)

    with pytest.raises(parallel.Abandoned):
        drive(build(), None, stop)
    # Closed at the step after the flag, not run to its end.
    assert closed == [3]


def test_a_parallel_pass_starts_with_small_pieces_and_every_piece_ends_a_line(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(parallel, "FIRST_CHUNK_BYTES", 1_000)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 8_000)
    stream = tmp_path / "s.jsonl"
    stream.write_bytes(b"".join(b"x" * (i % 97) + b"\n" for i in range(2_000)))
    data = stream.read_bytes()
    pieces = parallel.ranges(str(stream), 0, len(data), 2)
    assert pieces[0][0] == 0 and pieces[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert all(data[end - 1 : end] == b"\n" for _, end in pieces)
    sizes = [end - start for start, end in pieces]
    # Two of about 1,000 bytes (one per worker), then two of 2,000, 4,000...
    assert all(size < 1_100 for size in sizes[:2]) and all(size < 2_100 for size in sizes[2:4])
    assert max(sizes) < 8_100


def test_a_lock_file_that_cannot_be_used_fails_the_build_by_name(recall_world):
    # A directory where the lock file goes: without a lock, two processes
    # could build (and remove each other's segments) at once.
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    (w.work / "streamd.lock").mkdir(parents=True)
    with pytest.raises(RpcError) as caught:
        w.current(w.adapter())
    assert caught.value.message == (
        f"the workdir's lock file {w.work / 'streamd.lock'} cannot be used: Is a directory")


@pytest.mark.parametrize("generation", [-5, 10**30, (1 << 53) + 1, 1e400])
def test_a_checkpoint_with_an_impossible_generation_is_not_continued(recall_world, generation):
    # A hand-edited or damaged cursor.json: gen--4 and gen-1000...0 were named.
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    w.work.mkdir(parents=True, exist_ok=True)
    (w.work / "cursor.json").write_text(json.dumps({"generation": generation}))
    assert w.current(w.adapter()).name == "gen-1"


@pytest.mark.parametrize(("fields", "continued"), [
    # What the built reference answered, each from a cursor.json of these
    # fields (its Go struct takes a field of another JSON type as no
    # checkpoint at all; null is the field's zero).
    ('"generation":7', "gen-8"),
    ('"generation":null', "gen-1"),
    ('"generation":7.5', "gen-1"),
    ('"generation":"7"', "gen-1"),
    ('"generation":1e3', "gen-1"),
    ('"generation":true', "gen-1"),
    ('"generation":7,"updated_at":5', "gen-1"),
    ('"generation":7,"updated_at":"junk"', "gen-1"),
    ('"generation":7,"source_watermark":5', "gen-1"),
    ('"generation":7,"files":{}', "gen-1"),
    ('"generation":7,"files":[{"path":5}]', "gen-1"),
    ('"generation":7,"files":[{"path":"a.jsonl","offset":"3"}]', "gen-1"),
    ('"generation":7,"files":[{"path":"a.jsonl","missing":1}]', "gen-1"),
    # A number beyond a Go int (64 bits) fails the decode like another type.
    ('"generation":7,"files":[{"path":"a.jsonl","offset":9223372036854775807}]', "gen-8"),
    ('"generation":7,"files":[{"path":"a.jsonl","offset":9223372036854775808}]', "gen-1"),
    ('"generation":7,"files":[{"path":"a.jsonl","records":-9223372036854775809}]', "gen-1"),
    ('"generation":7,"files":[{"path":"a.jsonl","failed":18446744073709551616}]', "gen-1"),
])
def test_a_checkpoint_field_of_another_json_type_is_no_checkpoint_as_in_the_reference(
    recall_world, fields, continued
):
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    w.work.mkdir(parents=True, exist_ok=True)
    (w.work / "cursor.json").write_text("{" + fields + "}")
    assert w.current(w.adapter()).name == continued


# --- two processes on one workdir, one of them retrying a failed save ----------------------


def failed_save(w):
    """An adapter whose generation could not be saved (a directory where the
    manifest's temporary goes, as a full disk would refuse it), the way made
    clear again after."""
    blocker = w.work / "index" / "manifest.json.tmp"
    blocker.mkdir(parents=True)
    adapter = w.adapter()
    w.current(adapter)
    assert w.health(adapter)["diagnostics"].get("checkpoint_unwritable")
    blocker.rmdir()
    return adapter


def saved_state(w) -> tuple[int, list[str], list[str]]:
    """The checkpoint's generation, the segments the manifest names, those on disk."""
    checkpoint = json.loads((w.work / "cursor.json").read_text())
    named = json.loads((w.work / "index" / "manifest.json").read_text())["segments"]
    present = sorted(n for n in os.listdir(w.work / "index") if n.startswith("seg-"))
    return checkpoint["generation"], named, present


def test_a_retried_save_never_undoes_what_another_process_saved_since(recall_world):
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    behind = failed_save(w)
    other = w.adapter()  # another process: it builds and saves gen-2
    assert w.current(other).name == "gen-2"
    saved = saved_state(w)
    assert saved[0] == 2 and saved[1] == saved[2]
    behind.save_again()  # the retry the first one's scanner makes
    # Before: its gen-1 written over gen-2 (ids would be handed out twice) and
    # a manifest naming its own segment, which the other's save had removed.
    assert saved_state(w) == saved
    assert "checkpoint_unwritable" not in w.health(behind)["diagnostics"]
    # A third process adopts the saved index: nothing read again.
    third = w.adapter()
    assert (w.current(third).name, w.current(third).indexed) == ("gen-3", 10)
    assert saved_state(w)[1] == saved[1]


def test_a_retried_save_waits_while_another_process_holds_the_workdir(recall_world):
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    behind = failed_save(w)
    # Another process's build: the lock, and a segment it sealed that no
    # manifest names yet.
    building = WorkdirLock(str(w.work))
    assert building.try_acquire()
    fresh_segment = w.work / "index" / "seg-000000000000-10-0123abcd.seg"
    fresh_segment.write_bytes(b"sealed by the other build")
    try:
        behind.save_again()
        assert fresh_segment.exists()  # before: removed as a leftover
        assert not (w.work / "index" / "manifest.json").exists()
        assert w.health(behind)["diagnostics"].get("checkpoint_unwritable")
    finally:
        building.release()
    behind.save_again()  # its turn now
    assert saved_state(w)[0] == 1
    assert "checkpoint_unwritable" not in w.health(behind)["diagnostics"]


def test_a_retried_save_of_a_full_rebuild_replaces_the_index_it_found_at_its_start(
        recall_world):
    # An index saved before this process started is not another process's
    # save since: a full rebuild whose save failed writes over it once it can.
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    w.current(w.adapter())  # an earlier process: gen-1 saved
    blocker = w.work / "index" / "manifest.json.tmp"
    blocker.mkdir()
    rebuilt = w.adapter()
    assert w.current(rebuilt, full=True).name == "gen-2"
    blocker.rmdir()
    rebuilt.save_again()
    generation, named, present = saved_state(w)
    assert generation == 2 and named == present
    assert named == [os.path.basename(s.path) for s in rebuilt.generation.view.segments]


def test_an_index_directory_removed_under_a_running_process_is_saved_whole_again(
        recall_world):
    # Its segments are gone with it (this process still reads them through
    # its open descriptors): the next build indexes anew, so that the
    # manifest it saves names only files that are there.
    w = recall_world
    w.write("a.jsonl", *(body(i) for i in range(10)))
    adapter = w.adapter()
    w.current(adapter)
    shutil.rmtree(w.work / "index")
    w.append("a.jsonl", body(10))
    assert w.current(adapter).indexed == 11
    _, named, present = saved_state(w)
    assert named == present
