"""A search ranked by the compiled core (``native/src/rank.rs``).

The plain ranking (``rank``) is the definition: numpy over unpacked
postings, which at a million records spends tens to hundreds of
milliseconds on a term most records hold (unpacking, a dense array per
term, partitions on every key). The compiled core walks the same postings
straight from the segments, newest record first, with the GIL released,
and keeps the best ``limit`` in a heap: one pass, no array per record.

What stays here, so that both paths share it: tokenizing the query and
resolving its number variants, the exact-identifier lookup, and the final
order of the few candidates the core returns (their ids compared as Python
strings, exactly as the plain path compares them). The tests hold the two
paths to identical answers (``tests/recall/test_compiled_rank.py``).
"""

from __future__ import annotations

import numpy as np

from streamd.golang.gotime import NS
from streamd.recall.index import idorder
from streamd.recall.index import index as index_module
from streamd.recall.index.index import WEIGHTS, View
from streamd.recall.index.native import Core
from streamd.recall.query import variants as numvar
from streamd.recall.stop import Stop, Stopped, check

_I64 = (-(1 << 63), (1 << 63) - 1)
_WEIGHTS = (float(WEIGHTS[0]), float(WEIGHTS[1]), float(WEIGHTS[2]), float(WEIGHTS[3]))


def _bound(ns: int | None) -> tuple[int, int] | None:
    if ns is None:
        return None
    sec, nsec = divmod(ns, NS)
    # Beyond any record's seconds either way: the comparison comes out the same.
    return min(max(sec, _I64[0]), _I64[1]), nsec


def candidates(core: Core, view: View, terms: list[str], resolved: dict[str, list[str]],
               exact: set[int], since: int | None, upper: int | None,
               record_types: tuple[str, ...], removed: np.ndarray | None,
               limit: int, stop: Stop | None = None,
               ) -> tuple[list[int], list[float], list[bool], int, bool]:
    """``(recs, scores, exact, matched, any_exact)``: a superset of the best
    ``limit`` under the plain path's order, unordered. Raises ``Stopped``
    once ``stop`` is set."""
    slots: dict[str, int] = {}
    given: list[tuple[float, list[list[tuple[np.ndarray, np.ndarray]]]]] = []
    for t in dict.fromkeys(terms):
        check(stop)
        own = view.lists(t)
        if own:
            chains, scale = [own], 1.0
        else:
            chains = [c for v in resolved.get(t, ()) if (c := view.lists(v))]
            scale = numvar.NUMBER_VARIANT_WEIGHT
        if chains:
            slots[t] = len(given)
            given.append((scale, chains))
    order = [slots[t] for t in terms if t in slots]
    rows = view.rows()
    fields = rows.dtype.fields
    assert fields is not None
    layout = (rows.dtype.itemsize, fields["sec"][1], fields["nsec"][1], fields["kind"][1])
    kinds = [k in record_types for k in view.index.kinds] if record_types else None
    sec_max, covered = view.index.columns.sec_max()
    found = core.rank_search(
        view.n, given, order, len(terms),
        np.fromiter(sorted(exact), dtype=np.int64, count=len(exact)),
        not terms, _WEIGHTS, rows.view(np.uint8), layout,
        _bound(upper), _bound(since), kinds,
        None if removed is None else np.ascontiguousarray(removed).view(np.uint8),
        view.index.id_order.block_ranks(), idorder.BLOCK, sec_max, min(covered, view.n),
        index_module.TIME_BLOCK, limit, None if stop is None else stop.flag,
    )
    if found is None:
        raise Stopped
    return found
