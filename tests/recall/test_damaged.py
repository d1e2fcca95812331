"""A segment file damaged on disk (bytes flipped, arrays overwritten) is not
adopted: the restart indexes the files anew and answers as a fresh build
does, where it used to fail every request (``index build failed``) until a
full refresh, raise out of ``streamd search``, or answer wrong. What is not
looked for: damage to the postings (they are not read at a restart) and
damage that leaves a table plausible (a flipped low bit of a hash): segment
files carry no checksum. A saturated count without its exact value still
does not fail a search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streamd.recall.index import segment as seg


def stream(w) -> None:
    w.write("a.jsonl", *(w.rec(f"r{i:04d}", title=f"alpha {i % 7}", text="beta " * (i % 70),
                               ref=f"T-{i % 13}") for i in range(400)))


def array_span(path: Path, name: str) -> tuple[np.dtype, int, int]:
    """(dtype, count, byte offset) of array ``name`` in a segment file."""
    data = path.read_bytes()
    size = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16:16 + size])
    head = (16 + size + 7) // 8 * 8
    spec = next(a for a in header["arrays"] if a["name"] == name)
    dtype = seg.COLUMNS if name == "columns" else np.dtype(spec["dtype"])
    return dtype, spec["len"], head + spec["offset"]


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
