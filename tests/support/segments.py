"""Segment files of a workdir, damaged on purpose, or made as an older streamd wrote them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from streamd.recall.index import segment as seg

# A segment file's magic with a header checksum, and without (older files).
_CHECKED, _UNCHECKED = b"STRMSEG2", b"STRMSEG1"
# The arrays a lookup binary-searches: damage must keep them sorted to be
# plausible (the other arrays hold any value in range).
_SORTED = {"term_hash", "starts", "big_pos", "ident_hash"}


def _header(data: bytes) -> tuple[dict, int]:
    """A segment file's header, and where its arrays begin."""
    size = int.from_bytes(data[8:16], "little")
    at = _json_at(data)
    return json.loads(data[at:at + size]), (at + size + 7) // 8 * 8


def _json_at(data: bytes) -> int:
    """Where a segment file's header JSON begins: after the header's own
    checksum in a file that has one."""
    return 20 if data[:8] == _CHECKED else 16


def _unchecked(header: dict, arrays: bytes) -> bytes:
    """A segment file as a streamd wrote it before headers had checksums."""
    body = json.dumps(header).encode()
    start = _UNCHECKED + len(body).to_bytes(8, "little") + body
    return start + b"\0" * (-len(start) % 8) + arrays


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
    ``names`` (all: the file as a streamd before checksums wrote it), and
    without its own. The arrays' bytes are kept; the header's length
    changes, which their offsets (from the end of the header) allow."""
    data = path.read_bytes()
    header, head = _header(data)
    for spec in header["arrays"]:
        assert "crc32" in spec, "this streamd writes no checksums"
        if names is None or spec["name"] in names:
            del spec["crc32"]
    path.write_bytes(_unchecked(header, data[head:]))


def without_header_checksum(path: Path) -> None:
    """Rewrite a segment file as a streamd wrote it before its header had a
    checksum of its own (its arrays' checksums kept)."""
    data = path.read_bytes()
    header, head = _header(data)
    path.write_bytes(_unchecked(header, data[head:]))


def header_fields(path: Path) -> list[tuple[str, str]]:
    """(array name or "", key) of every field of a segment file's header
    whose value :func:`flip_header_bit` can flip: base, count, and each
    array's dtype, len, offset and crc32 (those it has)."""
    header, _ = _header(path.read_bytes())
    return [("", "base"), ("", "count")] + [
        (spec["name"], key) for spec in header["arrays"]
        for key in ("dtype", "len", "offset", "crc32") if key in spec]


def flip_header_bit(path: Path, array: str, key: str) -> str:
    """Flip one bit of a header field's value (``array`` "" for the
    segment's own fields) so that the JSON still parses, to a value of the
    same kind: a number's last digit by one (its lowest bit), an element
    type's byte order (``'<'`` to ``'>'``, ``'|'`` to ``'<'``). Returns the
    field's text after the flip."""
    data = bytearray(path.read_bytes())
    at = _json_at(data)
    size = int.from_bytes(data[8:16], "little")
    text = bytes(data[at:at + size])
    start = re.search(rb'"name":\s*"%s"' % array.encode(), text).start() if array else 0
    key_at = re.compile(rb'"%s":\s*' % key.encode()).search(text, start).end()
    end = min(i for i in (text.find(b",", key_at), text.find(b"}", key_at)) if i >= 0)
    if key == "dtype":
        i = at + key_at + 1
        data[i] ^= 0x02 if data[i] == ord("<") else 0x40
    else:
        i = at + end - 1
        data[i] ^= 1
    flipped = bytes(data[at:at + size])
    json.loads(flipped)  # still parses
    path.write_bytes(bytes(data))
    return flipped[key_at:end].decode()
