"""The compiled checksums are the plain path's: zlib's CRC-32 of the same
bytes, and of the same spans of a file read in chunks; a segment file
written on either path is the same file, and damage to it is refused by
either."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from support.native import path_taken
from support.segments import flip_low_bit

from streamd.recall.index import checksum, native
from streamd.recall.index import segment as seg
from streamd.recall.persist.atomic import write_atomic

needs_native = pytest.mark.skipif(native._native is None, reason="streamd._native is not built")
CHUNK = checksum.CHUNK
# Lengths around the compiled core's folding strides and around a chunk.
LENGTHS = [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097,
           CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 13]


def _data() -> bytes:
    return np.random.default_rng(17).integers(0, 256, 2 * CHUNK + 64, np.uint8).tobytes()


@needs_native
def test_the_compiled_core_answers_the_checksum_calls_of_these_sources() -> None:
    # Else the plain path answers for it, and the tests below compare it with itself.
    assert native._native is not None
    assert getattr(native._native, "CHECKSUM_INTERFACE", None) == checksum.CHECKSUM_INTERFACE


@needs_native
def test_the_compiled_crc32_is_zlibs_at_every_length_and_alignment() -> None:
    data = memoryview(_data())
    for n in LENGTHS:
        for start in (0, 1, 3, 8):
            piece = data[start:start + n]
            with path_taken(True):
                compiled = checksum.crc32(piece)
                chained = checksum.crc32(piece[n // 3:], checksum.crc32(piece[:n // 3]))
            assert compiled == chained == zlib.crc32(piece), (n, start)


@needs_native
def test_a_files_spans_check_alike_on_both_paths(tmp_path: Path) -> None:
    data = _data()
    path = tmp_path / "f"
    path.write_bytes(data)
    spans = [(at, n) for n in LENGTHS for at in (0, 5) if at + n <= len(data)]
    with path.open("rb") as f:
        by_path = {}
        for compiled in (False, True):
            with path_taken(compiled):
                by_path[compiled] = checksum.file_crc32(f.fileno(), spans)
                with pytest.raises(OSError):
                    checksum.file_crc32(f.fileno(), [(len(data) - 4, 8)])
    assert by_path[False] == by_path[True] == [zlib.crc32(data[a:a + n]) for a, n in spans]


def _built() -> seg.Segment:
    b = seg.SegmentBuilder(base=0)
    for i in range(500):
        b.add(f"id-{i}", (i, 0, i, 0, 2, 0, 0, i * 10, 9), [f"w{i % 13}", "common"] * 40,
              [f"f{i % 3}"], ["t"], {f"ref-{i % 7}"})
    return b.seal()


@needs_native
def test_a_segment_file_is_the_same_and_refused_the_same_on_both_paths(tmp_path: Path) -> None:
    s = _built()
    written = {}
    for compiled in (False, True):
        with path_taken(compiled):
            written[compiled] = b"".join(bytes(p) for p in seg.encode(s))
    assert written[False] == written[True]
    for name in ("recs", "meta", "columns"):
        path = tmp_path / f"{name}.seg"
        write_atomic(str(path), [written[True]])
        flip_low_bit(path, name)
        refusals = []
        for compiled in (False, True):
            with path_taken(compiled), pytest.raises(seg.Damaged) as refused:
                seg.check(seg.read(str(path)))
            refusals.append(str(refused.value))
        assert refusals[0] == refusals[1] == f"{path}: its {name} do not match their checksums"
