"""The compiled checksums are the plain path's: zlib's CRC-32 of the same
bytes, and of the same spans of a file read in chunks."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from support.native import path_taken

from streamd.recall.index import checksum, native

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
