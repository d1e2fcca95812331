"""The index's rows of record columns: what goes in comes out, however it grows."""

from __future__ import annotations

import numpy as np

from streamd.recall.index.index import TIME_BLOCK, Columns
from streamd.recall.index.segment import COLUMNS


def _rows(start: int, n: int) -> np.ndarray:
    rows = np.zeros(n, dtype=COLUMNS)
    numbers = np.arange(start, start + n)
    rows["sec"] = 1_700_000_000 + numbers * 3
    rows["nsec"] = numbers % 1_000
    rows["kind"] = numbers % 5
    rows["offset"] = numbers * 100
    rows["length"] = -(numbers % 7)
    return rows


def test_rows_appended_across_growth_read_back_field_for_field():
    c = Columns()
    parts = [_rows(0, 700), _rows(700, 3_000), _rows(3_700, 5)[::-1], _rows(3_705, 9_000)]
    for part in parts:
        c.extend(part)
    want = np.concatenate(parts)
    got = c.view(c.n)
    assert c.n == len(want) == 12_705
    for field in ("sec", "nsec", "kind", "offset", "length"):
        assert (got[field] == want[field]).all(), field
    # Reversed rows (a view with a negative stride) landed reversed.
    assert got["offset"][3_700:3_705].tolist() == [370_400, 370_300, 370_200, 370_100, 370_000]


def test_rows_of_another_layout_are_converted_field_by_field():
    aligned = np.dtype([(name, COLUMNS.fields[name][0]) for name in COLUMNS.names], align=True)
    assert aligned.itemsize != COLUMNS.itemsize
    rows = _rows(0, 300).astype(aligned)
    c = Columns()
    c.extend(rows)
    assert (c.view(300)["offset"] == np.arange(300) * 100).all()
    assert (c.view(300)["sec"] == 1_700_000_000 + np.arange(300) * 3).all()


def test_the_block_maxima_bound_every_second_after_growth():
    c = Columns()
    for start in range(0, 5_000, 999):
        c.extend(_rows(start, 999)[::-1].copy())
    maxima, m = c.sec_max()
    sec = c.view(c.n)["sec"]
    assert m == c.n
    for b, top in enumerate(maxima.tolist()):
        assert top == sec[b * TIME_BLOCK : (b + 1) * TIME_BLOCK].max()
