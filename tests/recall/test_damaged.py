"""A segment file damaged on disk (bytes flipped, arrays overwritten) is not
adopted: the restart says so in its log, indexes the files anew and answers
as a fresh build does, where it used to fail every request (``index build
failed``) until a full refresh, raise out of ``streamd search``, or answer
wrong. Each array's checksum (in the file's header) catches what the
tables' plausibility checks cannot: damage to the postings, and damage that
leaves a table plausible (a flipped low bit of a hash). A file written
before checksums is still adopted, on its plausibility alone. A saturated
count without its exact value still does not fail a search."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from support.native import path_taken
from support.segments import array_span, flip_low_bit, flip_posting, without_checksums

from streamd.recall.index import native

needs_native = pytest.mark.skipif(native._native is None, reason="streamd._native is not built")


def stream(w) -> None:
    w.write("a.jsonl", *(w.rec(f"r{i:04d}", title=f"alpha {i % 7}", text="beta " * (i % 70),
                               ref=f"T-{i % 13}") for i in range(400)))


def damage(path: Path, name: str, how: str) -> None:
    dtype, count, at = array_span(path, name)
    data = bytearray(path.read_bytes())
    size = count * dtype.itemsize
    if how == "flipped":  # every eighth byte inverted
        for i in range(at, at + size, 8):
            data[i] ^= 0xFF
    else:
        values = np.frombuffer(bytes(data[at:at + size]), dtype=dtype).copy()
        if name == "columns":
            values["kind"] = 1 << 30
        else:
            values[:] = {"max": np.iinfo(dtype).max, "zero": 0,
                         "negative": np.iinfo(dtype).min // 2 if dtype.kind == "i" else 1}[how]
        data[at:at + size] = values.tobytes()
    path.write_bytes(bytes(data))


def answers(w, adapter) -> list:
    """What each query finds, and how (the generation's name aside)."""
    return [[(c["source_record_id"], c["relevance"], c["metadata"]) for c in
             w.search(adapter, q)["candidates"]] for q in ("alpha", "beta", "r0042", "T-5")]


@pytest.mark.parametrize(("name", "how"), [
    ("ids", "flipped"), ("ids", "zero"), ("starts", "max"), ("starts", "negative"),
    ("term_local", "max"), ("term_local", "negative"), ("term_hash", "max"),
    ("term_hash", "zero"), ("ident_rec", "max"),
    ("ident_rec", "negative"), ("columns", "kinds"),
])
def test_a_damaged_segment_is_not_adopted_and_the_files_are_indexed_anew(
        recall_world, name: str, how: str) -> None:
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    damage(segment, name, how)
    restarted = w.adapter()
    assert answers(w, restarted) == expected
    assert restarted.generation is not None and restarted.generation.indexed == 400
    # The rebuild replaced the damaged file.
    assert not segment.exists()


def test_a_saturated_count_without_its_exact_value_does_not_fail_a_search(recall_world):
    w = recall_world
    stream(w)
    w.current(w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    damage(segment, "meta", "max")  # every posting saturated, none has its exact count
    restarted = w.adapter()
    result = w.search(restarted, "beta")
    assert result["diagnostics"]["matched"] > 0


@pytest.mark.parametrize("where", ["records", "latest", "offset"])
def test_a_manifest_number_read_as_infinity_is_not_adopted_and_the_files_are_indexed_anew(
        recall_world, where: str) -> None:
    # 1e400 is a valid JSON number that Python reads as infinity: int() of it
    # raised OverflowError out of the adoption, and every request failed
    # "index build failed", restart after restart, until a full refresh.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    manifest = w.work / "index" / "manifest.json"
    body = json.loads(manifest.read_text())
    holder = body["files"][0] if where == "offset" else body
    holder[where] = "INFINITY"
    manifest.write_text(json.dumps(body).replace('"INFINITY"', "1e400"))
    restarted = w.adapter()
    assert answers(w, restarted) == expected
    assert restarted.generation is not None and restarted.generation.indexed == 400


def test_a_segment_whose_header_length_is_damaged_is_not_adopted(recall_world) -> None:
    # The eight bytes after the magic say how long the header is: read as
    # asked, a damaged length was a MemoryError out of every build.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    data = bytearray(segment.read_bytes())
    data[8:16] = (1 << 62).to_bytes(8, "little")
    segment.write_bytes(bytes(data))
    restarted = w.adapter()
    assert answers(w, restarted) == expected
    assert restarted.generation is not None and restarted.generation.indexed == 400
    assert not segment.exists()


ARRAYS = ["term_hash", "term_local", "starts", "recs", "meta", "big_pos", "big_count",
          "ident_hash", "ident_rec", "columns", "ids"]


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_native)],
                         ids=["plain", "compiled"])
@pytest.mark.parametrize("name", ARRAYS)
def test_one_plausible_flipped_bit_in_any_array_is_caught_at_restart_and_indexed_anew(
        recall_world, caplog, name: str, compiled: bool) -> None:
    # Damage the plausibility checks pass: a posting's record number one
    # off, a hash one off, an id's digit changed. The segment used to be
    # adopted, and its searches answered wrong for as long as the workdir
    # lived (a record missing, or another in its place).
    w = recall_world
    with path_taken(compiled):
        stream(w)
        expected = answers(w, w.adapter())
        (segment,) = (w.work / "index").glob("seg-*")
        flip_low_bit(segment, name)
        with caplog.at_level(logging.WARNING, logger="streamd.recall"):
            restarted = w.adapter()
            assert answers(w, restarted) == expected
    assert restarted.generation is not None and restarted.generation.indexed == 400
    assert not segment.exists()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{segment}: its {name} do not match their checksums" in m
               and "indexing anew" in m for m in warned), warned


def test_a_posting_flipped_to_the_next_record_is_caught_at_restart(recall_world) -> None:
    # The fault in full: one bit of one posting list, and the record that
    # holds a term was answered with its neighbour, restart after restart.
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r{i:04d}", title=f"alpha {i}",
                               text="zebra" if i == 100 else "beta") for i in range(400)))

    def found(adapter) -> list[str]:
        return [c["source_record_id"] for c in w.search(adapter, "zebra")["candidates"]]

    assert found(w.adapter()) == ["r0100"]
    (segment,) = (w.work / "index").glob("seg-*")
    flip_posting(segment, "zebra")
    assert found(w.adapter()) == ["r0100"]


def test_a_segment_written_before_checksums_is_adopted(recall_world, caplog) -> None:
    # An upgrade must not rebuild every workdir: such a file is checked for
    # plausibility only, as it was when it was written.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_checksums(segment)
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert segment.exists()  # adopted: a rebuild would have written another
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_header_with_checksums_for_some_arrays_only_is_damaged(recall_world) -> None:
    # A file is written whole: a header that lost one checksum is damaged,
    # not one written before checksums (whose arrays would go unchecked).
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_checksums(segment, {"recs"})
    restarted = w.adapter()
    assert answers(w, restarted) == expected
    assert not segment.exists()
