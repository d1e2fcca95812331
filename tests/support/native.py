"""The compiled and the plain index compared."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from streamd.golang import gotime
from streamd.recall.index import build
from streamd.recall.index.index import Index
from streamd.recall.index.streamfile import Cursor

BUILT_AT = 1_800_000_000_123_456_789


@contextlib.contextmanager
def path_taken(compiled: bool):
    """Builds inside take the compiled path, or the plain one."""
    old = os.environ.get("STREAMD_NATIVE")
    os.environ["STREAMD_NATIVE"] = "1" if compiled else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["STREAMD_NATIVE"]
        else:
            os.environ["STREAMD_NATIVE"] = old


def build_index(path: Path, compiled: bool) -> tuple[Index, Cursor, build.Consumer]:
    with path_taken(compiled):
        index = Index()
        consumer = build.Consumer(index, BUILT_AT, gotime.ZERO_TIME)
        cur = Cursor(str(path))
        for _ in consumer.read_into(cur, 0):
            pass
        index.seal()
    return index, cur, consumer


def assert_same_index(path: Path) -> Index:
    a, ca, sa = build_index(path, compiled=False)
    b, cb, sb = build_index(path, compiled=True)
    assert (ca.offset, ca.records, ca.failed) == (cb.offset, cb.records, cb.failed)
    assert (sa.latest, sa.bytes_done, sa.records_done) == (sb.latest, sb.bytes_done,
                                                           sb.records_done)
    assert a.ids == b.ids and a.kinds == b.kinds and len(a) == len(b)
    assert [(s.base, s.count) for s in a.segments] == [(s.base, s.count) for s in b.segments]
    for sa_, sb_ in zip(a.segments, b.segments, strict=True):
        for name, arr in sa_.arrays().items():
            other = sb_.arrays()[name]
            assert arr.dtype == other.dtype, name
            assert arr.tobytes() == other.tobytes(), name
    return a

