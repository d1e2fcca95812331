"""The compiled indexing path builds what the plain path builds.

A generated stream (bench/gen_stream.py, bad lines included) indexed through
the adapter with and without the compiled core leaves byte-identical
segment files and gives identical answers; the line rules at their edges
(1 MiB records, lines too long to hold, partial tails, missing and
unreadable files) hold on both paths; the module reports its limits, its
Unicode edition and its failures the way the Python side expects.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
from support.native import assert_same_index, path_taken

from streamd.errors import RpcError
from streamd.golang import gounicode
from streamd.recall import oneshot, records
from streamd.recall.index import build, native, streamfile
from streamd.recall.index.index import Index
from streamd.recall.index.streamfile import Cursor

pytestmark = pytest.mark.slow

_native = native._native
needs_native = pytest.mark.skipif(_native is None, reason="streamd._native is not built")
BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_compiled_core_is_built_wherever_a_rust_toolchain_is():
    if shutil.which("cargo") is None:
        pytest.skip("no Rust toolchain here: the plain path is the install")
    assert _native is not None, "pip install -e . should have built streamd._native"


@needs_native
def test_the_compiled_core_shares_the_plain_paths_limits_and_unicode_edition():
    assert _native.UNICODE_VERSION == gounicode.UNICODE_VERSION
    assert _native.MAX_LINE_BYTES == records.MAX_LINE_BYTES
    assert _native.HOLD_LIMIT == streamfile.HOLD_LIMIT
    assert _native.MAX_DEPTH == records.MAX_DEPTH


@needs_native
def test_a_panic_in_the_core_is_a_python_exception_not_a_crash():
    with pytest.raises(_native.NativeError, match="internal error: as asked"):
        _native._panic_for_tests()
    assert issubclass(_native.NativeError, RuntimeError)


def test_without_the_compiled_core_a_build_warns_once_and_takes_the_plain_path(
    recall_world, monkeypatch, caplog
):
    monkeypatch.setattr(native, "_native", None)
    monkeypatch.setattr(native, "_missing", "is not installed")
    monkeypatch.setattr(native, "_warned", type(native._warned)())
    monkeypatch.delenv("STREAMD_NATIVE", raising=False)
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r{i}", title=f"record {i}") for i in range(10)))
    with caplog.at_level(logging.WARNING, logger="streamd.recall.index.native"):
        assert oneshot.current(w.adapter()).indexed == 10
        assert oneshot.current(w.adapter(), True).indexed == 10
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "plain Python path" in warnings[0] and "Rust toolchain" in warnings[0]
    assert "reinstall recall-streamd (pip install -e . in a clone)" in warnings[0]


def generated(tmp_path: Path, n: int) -> Path:
    sys.path.insert(0, str(BENCH))
    try:
        import gen_stream
    finally:
        sys.path.remove(str(BENCH))
    path = tmp_path / "gen.jsonl"
    gen_stream.generate(str(path), n, 11, 53)
    return path


def segment_bytes(workdir: Path) -> list[tuple[str, bytes]]:
    """Each segment file's contents, named by base and count (the rest of a
    segment's name is a random token)."""
    out = []
    for p in sorted((workdir / "index").glob("seg-*.seg")):
        base, count = p.name.split("-")[1:3]
        out.append((f"{base}-{count}", p.read_bytes()))
    return out


QUERIES = ["", "the", "task", "tasks", "queries", "td-f62256", "REC-118", "deploy failed",
           "owner/repo", "C0RECALL", "alpha beta gamma", "½"]


@needs_native
def test_a_generated_stream_builds_identical_segments_and_answers_on_both_paths(
    recall_world, tmp_path
):
    w = recall_world
    stream = generated(tmp_path, 40_000)
    shutil.copy(stream, w.path("a.jsonl"))
    answers, files = {}, {}
    for compiled in (False, True):
        work = tmp_path / f"work-{compiled}"
        work.mkdir()
        with path_taken(compiled):
            adapter = w.adapter(workdir=str(work))
            generation = oneshot.current(adapter)
            got = [generation.indexed, generation.failed, generation.latest]
            for q in QUERIES:
                got.append(w.search(adapter, q, limit=25))
                got.append(w.search(adapter, q, limit=5, as_of="2025-01-01T00:00:00Z"))
        for res in got[3:]:
            res["diagnostics"].pop("elapsed_ms", None)
        answers[compiled], files[compiled] = got, segment_bytes(work)
    assert answers[False][:2] == answers[True][:2] and answers[False][0] == 40_000
    assert answers[False] == answers[True]
    assert files[False] == files[True] and len(files[True]) >= 1


def line(body: str, pad: int = 0) -> bytes:
    return json.dumps({"schema": 2, "id": f"x{pad}", "event_time": "2026-05-02T10:00:00Z",
                       "text": body}).encode()


@needs_native
@pytest.mark.parametrize("block", [1 << 16, build.BLOCK_BYTES])
def test_lines_at_the_size_limits_count_alike_on_both_paths(tmp_path, monkeypatch, block):
    monkeypatch.setattr(build, "BLOCK_BYTES", block)
    limit = records.MAX_LINE_BYTES
    fits = line("a" * (limit - len(line(""))))
    assert len(fits) == limit
    over = line("a" * (limit + 1 - len(line(""))))
    padded = b" " * 1000 + fits + b"\t" * 1000  # longer than 1 MiB only untrimmed
    held_limit = streamfile.HOLD_LIMIT
    spaces_held = b" " * (held_limit - 1)  # blank, and just short enough to be held
    spaces_unheld = b" " * held_limit  # blank, but too long to hold: it fails
    huge = line("b" * (3 << 20))
    stream = tmp_path / "a.jsonl"
    stream.write_bytes(b"\n".join([fits, over, padded, spaces_held, spaces_unheld, huge,
                                   line("small"), huge + b"x"]))  # ends mid-line
    index = assert_same_index(stream)
    assert len(index) == 3  # fits, padded, small
    _, cur, _ = build_once(stream)
    assert cur.failed == 3 and cur.offset == stream.stat().st_size - len(huge) - 1


def build_once(path: Path) -> tuple[Index, Cursor, build.Consumer]:
    index = Index()
    consumer = build.Consumer(index, 0, 0)
    cur = Cursor(str(path))
    for _ in consumer.read_into(cur, 0):
        pass
    index.seal()
    return index, cur, consumer


@needs_native
def test_a_partial_tail_is_read_once_it_is_complete(tmp_path):
    stream = tmp_path / "a.jsonl"
    first, second = line("one", 1) + b"\n", line("two", 2)
    stream.write_bytes(first + second[:20])
    index, cur, consumer = build_once(stream)
    assert (len(index), cur.offset) == (1, len(first))
    with stream.open("ab") as f:
        f.write(second[20:] + b"\n")
    for _ in consumer.read_into(cur, 0):
        pass
    index.seal()
    assert index.ids == ["x1", "x2"] and cur.offset == stream.stat().st_size


@needs_native
@pytest.mark.parametrize("compiled", [False, True])
def test_a_missing_or_unreadable_file_is_reported_alike(tmp_path, compiled):
    with path_taken(compiled):
        missing = Cursor(str(tmp_path / "nope.jsonl"))
        for _ in build.Consumer(Index(), 0, 0).read_into(missing, 0):
            pass
        assert missing.missing
        (tmp_path / "dir.jsonl").mkdir()
        with pytest.raises(RpcError, match=r"^dir.jsonl became unreadable$"):
            for _ in build.Consumer(Index(), 0, 0).read_into(Cursor(str(tmp_path / "dir.jsonl")),
                                                             0):
                pass


@needs_native
def test_a_segment_can_span_files_on_both_paths(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(line("in a", 1) + b"\n")
    b.write_bytes(line("in b", 2) + b"\n" + line("in b too", 3) + b"\n")
    built = {}
    for compiled in (False, True):
        with path_taken(compiled):
            index = Index()
            consumer = build.Consumer(index, 7, 0)
            for file_no, p in enumerate((a, b)):
                for _ in consumer.read_into(Cursor(str(p)), file_no):
                    pass
            index.seal()
        assert len(index.segments) == 1
        built[compiled] = {k: v.tobytes() for k, v in index.segments[0].arrays().items()}
    assert built[False] == built[True]
