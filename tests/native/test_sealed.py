"""A sealed segment's arrays are lent to Python as they lie (``SealedArray``).

The seal's vectors reach numpy through the buffer protocol instead of being
copied into ``bytes``: the views read the plain Segment's little-endian
dtypes, are read-only, and keep the vectors alive after everything else
that named them is gone.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from streamd.recall.index import native

_native = native._native
pytestmark = pytest.mark.skipif(_native is None, reason="streamd._native is not built")

_LINES = (b'{"schema":1,"id":"a","event_time":"2026-05-02T10:00:00Z","body":"x y x"}\n'
          b'{"schema":2,"id":"b","event_time":"2026-05-02T11:00:00Z","title":"X"}\n')


def _sealed():
    assert _native is not None
    b = _native.ChunkBuilder(7)
    b.feed(_LINES, 0, 0, 10, 10, 0, 0)
    return b.seal()


def test_the_arrays_are_the_little_endian_bytes_of_the_plain_dtypes():
    d = _sealed()
    assert bytes(d["ids"]) == b'["a","b"]' and len(d["ids"]) == 9
    assert d["count"] == 2 and d["kinds"] == ["event"]
    recs = np.frombuffer(memoryview(d["recs"]), dtype=np.uint32)
    assert recs.tolist()[:2] == [7, 8]  # "x", in both records
    starts = np.frombuffer(memoryview(d["starts"]), dtype=np.int64)
    assert bytes(d["starts"]) == np.array([0, 2, 3, 5], dtype="<i8").tobytes() == starts.tobytes()
    assert len(d["ident_rec"]) == 16 and len(d["big_pos"]) == 0
    # One id a record, in the order of the ids' hashes.
    assert sorted(np.frombuffer(memoryview(d["ident_rec"]), dtype=np.int64).tolist()) == [7, 8]


def test_a_view_is_read_only_and_keeps_the_array_alive():
    d = _sealed()
    view = memoryview(d["ids"])
    assert view.readonly
    with pytest.raises((BufferError, TypeError)):
        (ctypes.c_char * len(view)).from_buffer(d["ids"])
    ids = np.frombuffer(view, dtype=np.uint8)
    assert not ids.flags.writeable
    del d, view
    gc.collect()
    _sealed()  # reuses what the first seal freed, if anything was
    assert ids.tobytes() == b'["a","b"]'
