"""Faults around the real process: stream paths and workdir files that are not
regular files, a full disk, and a kill -9 during a parallel build.

Each test spawns ``python -m streamd`` (or the ``streamd index`` command) and
is bounded by ``trio.fail_after`` or a polled deadline: a daemon that freezes
on an open or a read fails the bound instead of hanging the suite, because
the freeze is in the child, not in the test's event loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest
import trio
from support.recall_faults import poll, record
from support.recall_proc import Proc, req, spawn

from streamd.recall.index import parallel

pytestmark = pytest.mark.subprocess

FAR = "2999-01-01T00:00:00Z"
# Generous for a process start plus a few answers on a loaded 2-core machine;
# a frozen daemon never answers at all.
PROMPT = 20


def init(world, location: str, files: list[str]) -> dict[str, Any]:
    return req(1, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
               workdir=str(world.work), source_id="signals", location=location,
               settings={"files": files} if files else {})


def search(id: Any, query: str = "") -> dict[str, Any]:
    return req(id, "recall/search", query=query, filters={}, limit=10, deadline=FAR)


def health(id: Any) -> dict[str, Any]:
    return req(id, "recall/health", deadline=FAR)


async def call(proc: Proc, frame: dict[str, Any]) -> dict[str, Any]:
    await proc.send(frame)
    answer = await proc.recv()
    assert answer is not None and answer["id"] == frame["id"], (answer, proc.log())
    return answer


# --- stream paths that are not regular files ------------------------------------------------


def _fifo(w) -> tuple[str, list[str], str]:
    path = w.data / "s.jsonl"
    os.mkfifo(path)
    return str(path), [], "s.jsonl"


def _dev_zero(w) -> tuple[str, list[str], str]:
    return "/dev/zero", [], "zero"


def _dev_urandom(w) -> tuple[str, list[str], str]:
    return "/dev/urandom", [], "urandom"


def _symlink_to_fifo(w) -> tuple[str, list[str], str]:
    os.mkfifo(w.root / "pipe")
    (w.data / "a.jsonl").symlink_to(w.root / "pipe")
    return str(w.data), ["a.jsonl"], "a.jsonl"


def _directory(w) -> tuple[str, list[str], str]:
    return str(w.data), [], "data"


@pytest.mark.parametrize(
    "make", [_fifo, _dev_zero, _dev_urandom, _symlink_to_fifo, _directory],
    ids=["fifo", "dev-zero", "dev-urandom", "symlink-to-fifo", "directory"],
)
async def test_a_stream_path_that_is_not_a_regular_file_is_unreadable_and_answered_promptly(
    recall_world, tmp_path, make
):
    w = recall_world
    location, files, name = make(w)
    with trio.fail_after(PROMPT):
        async with spawn(tmp_path) as proc:
            assert "result" in await call(proc, init(w, location, files))
            found = await call(proc, search(2, "x"))
            probe = await call(proc, health(3))
            # It still takes signals: a frozen daemon ignored SIGTERM too.
            proc.process.send_signal(signal.SIGTERM)
            assert await proc.process.wait() == 0, proc.log()
    # A directory in the reference's words (it opens one, and its read fails);
    # the rest it would wait on for ever, or read without end.
    said = "became unreadable" if make is _directory else "is not readable"
    assert found["error"] == {"code": -32000, "message": f"{name} {said}"}
    result = probe["result"]
    assert (result["status"], result["coverage"], result["diagnostics"]) == (
        "unavailable", "unknown", {"reason": "unreachable"},
    )
    assert str(w.root) not in json.dumps([found, probe])


async def test_a_stream_file_replaced_by_a_fifo_after_indexing_is_unreadable_not_a_freeze(
    recall_world, tmp_path
):
    w = recall_world
    w.write("a.jsonl", w.rec("sig-1", title="Deploy td-1", ref="td-1"))
    with trio.fail_after(PROMPT):
        async with spawn(tmp_path) as proc:
            assert "result" in await call(proc, init(w, str(w.data), ["a.jsonl"]))
            first = await call(proc, search(2, "td-1"))
            os.unlink(w.path("a.jsonl"))
            os.mkfifo(w.path("a.jsonl"))
            found = await call(proc, search(3, "td-1"))
            expanded = await call(proc, req(4, "recall/expand", locator="signals:v2/sig-1",
                                            detail="full", budget_bytes=0, deadline=FAR))
            probe = await call(proc, health(5))
            await call(proc, req(6, "recall/shutdown"))
            assert await proc.process.wait() == 0, proc.log()
    assert [c["source_record_id"] for c in first["result"]["candidates"]] == ["sig-1"]
    assert found["error"] == {"code": -32000, "message": "a.jsonl is not readable"}
    assert expanded["error"] == {"code": -32000, "message": "a.jsonl is not readable"}
    result = probe["result"]
    # The generation built from the regular file is still the one named.
    assert (result["status"], result["index_generation"], result["diagnostics"]) == (
        "unavailable", "gen-1", {"reason": "unreachable"},
    )


@pytest.mark.parametrize("name", ["cursor.json", "index/manifest.json", "cursor.json.tmp",
                                  "index/manifest.json.tmp"])
async def test_a_fifo_among_the_workdir_files_is_never_waited_on(recall_world, tmp_path, name):
    # A plain open of any of these blocks for good (the checkpoint's in the
    # initialize itself, on the event loop: the resident daemon froze for
    # every client, stop and SIGTERM included).
    w = recall_world
    w.write("a.jsonl", w.rec("sig-1", title="Deploy td-1", ref="td-1"))
    (w.work / "index").mkdir(exist_ok=True)
    os.mkfifo(w.work / name)
    with trio.fail_after(PROMPT):
        async with spawn(tmp_path) as proc:
            assert "result" in await call(proc, init(w, str(w.data), ["a.jsonl"]))
            found = await call(proc, search(2, "td-1"))
            refreshed = await call(proc, req(3, "recall/refresh", deadline=FAR))
            await call(proc, req(4, "recall/shutdown"))
            assert await proc.process.wait() == 0, proc.log()
    assert [c["source_record_id"] for c in found["result"]["candidates"]] == ["sig-1"]
    result = refreshed["result"]
    if name.endswith(".tmp"):
        # Nothing can be saved past it: said so, and the FIFO left alone.
        assert result["status"] == "degraded", result
        assert result["diagnostics"]["checkpoint_unwritable"] is True, result
        assert (w.work / name).is_fifo()
    else:
        # Read as no checkpoint (no index) at all; the save replaces it.
        assert result["status"] == "healthy", result
        assert not (w.work / name).is_fifo()


@pytest.mark.parametrize("name", ["cursor.json", "index/manifest.json"])
@pytest.mark.parametrize("command", ["index", "search"])
def test_the_cli_never_waits_on_a_fifo_among_the_workdir_files(recall_world, name, command):
    # `index` and `search --workdir` first read which files the workdir's
    # index covers, with a plain open: a FIFO at either name blocked them for good.
    w = recall_world
    stream = w.write("a.jsonl", w.rec("sig-1", title="Deploy td-1", ref="td-1"))
    (w.work / "index").mkdir(exist_ok=True)
    os.mkfifo(w.work / name)
    query = ["td-1"] if command == "search" else []
    done = subprocess.run(
        [sys.executable, "-m", "streamd", command, *query, str(stream), "--workdir", str(w.work)],
        capture_output=True, text=True, timeout=PROMPT,
    )
    assert done.returncode == 0, done.stderr
    assert ("sig-1" in done.stdout) if command == "search" else ("1 record indexed" in done.stdout)


# --- a full disk ---------------------------------------------------------------------------


def lines(w, start: int, stop: int) -> list[bytes]:
    return [w.rec(f"r{i}", title=f"event {i}", text="amber birch") for i in range(start, stop)]


def leftovers(w) -> list[str]:
    return sorted(p.name for p in w.work.rglob("*.tmp"))


def saved(w) -> dict[str, Any]:
    return json.loads((w.work / "index" / "manifest.json").read_text())


def cursor_generation(w) -> int:
    return json.loads((w.work / "cursor.json").read_text())["generation"]


def segment_files(w) -> set[str]:
    return {p.name for p in (w.work / "index").glob("seg-*")}


def file_size_limit(pid: int, soft: int) -> None:
    """Make every write of ``pid`` past ``soft`` bytes of a file fail with
    EFBIG, as a full disk fails it with ENOSPC: a real kernel error on the
    daemon's own writes, and nobody else's. (CPython ignores SIGXFSZ, so the
    daemon gets the error instead of being killed by the signal.)"""
    proc = psutil.Process(pid)
    _, hard = proc.rlimit(psutil.RLIMIT_FSIZE)
    proc.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))


async def test_a_full_disk_loses_nothing_and_the_index_is_durable_again_once_there_is_room(
    recall_world, tmp_path
):
    w = recall_world
    w.write("a.jsonl", *lines(w, 0, 100))
    refresh = req(0, "recall/refresh", deadline=FAR, full=False)
    with trio.fail_after(PROMPT):
        async with spawn(tmp_path) as proc:
            assert "result" in await call(proc, init(w, str(w.data), ["a.jsonl"]))
            assert (await call(proc, search(2)))["result"]["diagnostics"]["generation"] == "gen-1"
            manifest = (w.work / "index" / "manifest.json").read_bytes()
            segments = segment_files(w)

            file_size_limit(proc.process.pid, 0)
            w.append("a.jsonl", *lines(w, 100, 150))
            found = (await call(proc, search(3)))["result"]["diagnostics"]
            failing = (await call(proc, health(4)))["result"]
            # An explicit refresh retries at once, and fails again the same clean way.
            retried = (await call(proc, {**refresh, "id": 5}))["result"]
            # Nothing was lost: the last good save is untouched, and no
            # half-written temporary is left to fill the disk.
            assert leftovers(w) == []
            assert (w.work / "index" / "manifest.json").read_bytes() == manifest
            assert segment_files(w) == segments
            assert cursor_generation(w) == 1

            file_size_limit(proc.process.pid, psutil.RLIM_INFINITY)
            recovered = (await call(proc, {**refresh, "id": 6}))["result"]
            assert (saved(w)["records"], cursor_generation(w), leftovers(w)) == (150, 2, [])

            # The same again, recovered this time by the next build (an append).
            file_size_limit(proc.process.pid, 0)
            w.append("a.jsonl", *lines(w, 150, 160))
            again = (await call(proc, search(7)))["result"]["diagnostics"]["generation"]
            assert (await call(proc, health(8)))["result"]["status"] == "degraded"
            file_size_limit(proc.process.pid, psutil.RLIM_INFINITY)
            w.append("a.jsonl", *lines(w, 160, 170))
            later = (await call(proc, search(9)))["result"]["diagnostics"]["generation"]
            last = (await call(proc, health(10)))["result"]
            await call(proc, req(11, "recall/shutdown"))
            assert await proc.process.wait() == 0, proc.log()

    assert (found["generation"], found["indexed"]) == ("gen-2", 150)
    assert (failing["status"], failing["diagnostics"]) == (
        "degraded", {"checkpoint_unwritable": True, "files": 1})
    assert (retried["status"], retried["diagnostics"]) == (
        "degraded", {"checkpoint_unwritable": True, "files": 1})
    assert (recovered["status"], recovered["index_generation"], recovered["diagnostics"]) == (
        "healthy", "gen-2", {"files": 1})
    assert (again, later) == ("gen-3", "gen-4")
    assert (last["status"], last["indexed_count"], last["diagnostics"]) == (
        "healthy", 170, {"files": 1})
    body = saved(w)
    assert (body["records"], body["files"][0]["offset"]) == (170, w.path("a.jsonl").stat().st_size)
    assert (cursor_generation(w), leftovers(w)) == (4, [])
    assert segment_files(w) == set(body["segments"])

    # A restart adopts what was saved: it reads nothing and writes no segment.
    before = segment_files(w)
    with trio.fail_after(PROMPT):
        async with spawn(tmp_path) as proc:
            assert "result" in await call(proc, init(w, str(w.data), ["a.jsonl"]))
            restarted = (await call(proc, health(2)))["result"]
            await call(proc, req(3, "recall/shutdown"))
            assert await proc.process.wait() == 0, proc.log()
    assert (restarted["status"], restarted["index_generation"], restarted["indexed_count"]) == (
        "healthy", "gen-5", 170)
    assert segment_files(w) == before


# --- kill -9 during a parallel build ----------------------------------------------------------


PARALLEL_BUILD = """
import sys
from streamd.recall.index import parallel
from streamd.cli import main
# Small enough that a stream of a few MB takes the parallel path, in chunks.
parallel.PARALLEL_MIN_BYTES = 1 << 20
parallel.CHUNK_BYTES = 1 << 20
parallel.workers = lambda: 2
parallel.POOL = "processes"  # the compiled path's threads end with the process anyway
sys.exit(main(["index", "--workdir", sys.argv[1], sys.argv[2]]))
"""




def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def cmdline(p: psutil.Process) -> list[str]:
    """``p``'s command line, or nothing for a process that ended meanwhile
    (or a zombie some other test left unreaped)."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []




def test_kill_9_during_a_parallel_build_leaves_no_worker_process_alive(recall_world):
    w = recall_world
    stream = w.write("a.jsonl", *(record(i) for i in range(60_000)))
    assert stream.stat().st_size > 8 << 20  # eight chunks or more, four per worker
    build = subprocess.Popen([sys.executable, "-c", PARALLEL_BUILD, str(w.work), str(stream)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        parent = psutil.Process(build.pid)

        def mid_build() -> list[psutil.Process] | None:
            assert build.poll() is None, "the build finished before it could be interrupted"
            # A segment on disk means a first chunk came back; the workers are on the next.
            if not list((w.work / "index").glob("seg-*.seg")):
                return None
            family = parent.children(recursive=True)
            workers = [p for p in family if "--multiprocessing-fork" in p.cmdline()]
            return family if len(workers) == 2 else None

        family = poll(mid_build, 60, "two workers building chunks")
        os.kill(build.pid, signal.SIGKILL)
    finally:
        if build.poll() is None:
            build.kill()
        build.wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive(family) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = alive(family)
    named = [" ".join(p.cmdline()) for p in left]
    for p in left:
        p.kill()
    assert named == []


def test_a_pass_abandoned_midway_kills_its_workers_instead_of_letting_them_finish(
    recall_world, monkeypatch
):
    w = recall_world
    # Two chunks of about 15 MB: each takes a worker several seconds.
    stream = w.write("a.jsonl", *(record(i) for i in range(150_000)))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", stream.stat().st_size // 2 + 1)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    monkeypatch.setattr(parallel, "POOL", "processes")  # threads: tests/native/test_parallel.py
    steps = w.adapter().build(False)
    while next(steps) is None:
        pass  # until the pass waits on a worker's chunk
    me = psutil.Process()
    workers = [p for p in alive(me.children()) if "--multiprocessing-fork" in cmdline(p)]
    assert len(alive(workers)) == 2
    steps.close()  # as a cancelled scanner or a shutdown abandons it
    # Gone at once, not when their chunks are done.
    deadline = time.monotonic() + 2
    while alive(workers) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert alive(workers) == []
