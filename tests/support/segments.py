"""Segment files of a workdir, damaged on purpose, or made as an older streamd wrote them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from streamd.recall.index import segment as seg

# The arrays a lookup binary-searches: damage must keep them sorted to be
# plausible (the other arrays hold any value in range).
_SORTED = {"term_hash", "starts", "big_pos", "ident_hash"}


def _header(data: bytes) -> tuple[dict, int]:
    """A segment file's header, and where its arrays begin."""
    size = int.from_bytes(data[8:16], "little")
    return json.loads(data[16:16 + size]), (16 + size + 7) // 8 * 8


def array_span(path: Path, name: str) -> tuple[np.dtype, int, int]:
    """(dtype, count, byte offset) of array ``name`` in a segment file."""
    header, head = _header(path.read_bytes())
    spec = next(a for a in header["arrays"] if a["name"] == name)
    dtype = seg.COLUMNS if name == "columns" else np.dtype(spec["dtype"])
    return dtype, spec["len"], head + spec["offset"]


def flip_low_bit(path: Path, name: str) -> None:
    """Flip the lowest bit of one element of array ``name``, near its middle:
    damage that leaves every table plausible (sorted ones still sorted, ids
    still decoding, to as many ids), which only a checksum sees. The
    element is the first from the middle whose flip keeps its array sorted
    and its values distinct from its neighbours'; in the ids, a digit."""
    dtype, count, at = array_span(path, name)
    data = bytearray(path.read_bytes())
    if name in ("ids", "columns"):
        # A digit of an id stays a digit; a row's first byte is the low byte
        # of its event time.
        i = at + count // 2 * dtype.itemsize
        while name == "ids" and not chr(data[i]).isdigit():
            i += 1
        data[i] ^= 1
    else:
        values = np.frombuffer(bytes(data[at:at + count * dtype.itemsize]), dtype=dtype)
        for i in range(count // 2, count):
            flipped = values[i] ^ dtype.type(1)
            if name not in _SORTED or (
                    (i == 0 or values[i - 1] < flipped)
                    and (i == count - 1 or flipped < values[i + 1])):
                break
        else:
            raise AssertionError(f"no element of {name} flips plausibly")
        data[at + i * dtype.itemsize] ^= 1
    path.write_bytes(bytes(data))


def flip_posting(path: Path, term: str) -> None:
    """Flip the lowest bit of the record number of ``term``'s first posting:
    a search for it then finds the record next to the one that holds it."""
    s = seg.read(str(path))
    at = int(s.starts[s.find(np.uint64(seg.term_hash(term)))])
    dtype, _, offset = array_span(path, "recs")
    data = bytearray(path.read_bytes())
    data[offset + at * dtype.itemsize] ^= 1
    path.write_bytes(bytes(data))


def without_checksums(path: Path, names: set[str] | None = None) -> None:
    """Rewrite a segment file's header without the checksums of arrays
    ``names`` (all: the file as a streamd before checksums wrote it). The
    arrays' bytes are kept; the header's length changes, which their
    offsets (from the end of the header) allow."""
    data = path.read_bytes()
    header, head = _header(data)
    for spec in header["arrays"]:
        assert "crc32" in spec, "this streamd writes no checksums"
        if names is None or spec["name"] in names:
            del spec["crc32"]
    body = json.dumps(header).encode()
    start = data[:8] + len(body).to_bytes(8, "little") + body
    path.write_bytes(start + b"\0" * (-len(start) % 8) + data[head:])
