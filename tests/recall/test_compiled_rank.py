"""The compiled ranking answers exactly as the plain ranking does.

``query/rank.py``'s plain path is the definition. For any index and any
query (terms with duplicates, number variants, exact identifiers, time and
type windows, removed records) the compiled core must give the same hits in
the same order with bit-identical scores, and the same match counts. Tiny
segments, id blocks and time blocks put every boundary inside the data: a
term's postings spread over many segments, ties cut across id blocks, and
windows of time maxima that a view's records end inside.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamd.recall.index import idorder, native
from streamd.recall.index import index as index_module
from streamd.recall.index.index import Index
from streamd.recall.query import rank as ranking
from streamd.recall.query.rank import Query
from streamd.recall.tokenize import fold

pytestmark = pytest.mark.skipif(native.search_core() is None, reason="streamd._native is not built")

# Singular/plural pairs and a plural alone reach the number-variant rule.
_WORDS = ["cat", "cats", "box", "boxes", "glasses", "alpha", "beta", "gamma", "run"]
_IDS = ["r-1", "r-2", "R-2", "a", "b", "zeta", "é", "r-10"]
# Few distinct times, so that records tie on score and time and go by id.
_SECONDS = st.sampled_from([100, 101, 102, 5_000, -3])
_NANOS = st.sampled_from([0, 0, 1, 999_999_999])

_RECORD = st.fixed_dictionaries({
    "id": st.sampled_from(_IDS),
    "sec": _SECONDS,
    "nsec": _NANOS,
    "kind": st.integers(0, 2),
    "text": st.lists(st.sampled_from(_WORDS), max_size=6),
    "fields": st.lists(st.sampled_from(_WORDS), max_size=2),
    "title": st.lists(st.sampled_from(_WORDS), max_size=2),
    "ident": st.sampled_from(["", "td-1", "td-2"]),
})

_TIME = st.none() | st.sampled_from([100, 101, 102, 5_000]).flatmap(
    lambda s: st.sampled_from([0, 1, 999_999_999]).map(lambda ns: s * 10**9 + ns))


def _build(records: list[dict], published: int) -> tuple[Index, list, object]:
    """An index of ``records``, and the view published after the first
    ``published`` of them (kept while the rest went in)."""
    index = Index()
    kinds = [index.kind_code(k) for k in ("note", "task", "message")]
    early = None
    for i, r in enumerate(records):
        if i == published:
            early = index.view(merge=i % 2 == 0)
        row = (r["sec"], r["nsec"], r["sec"], r["nsec"], 2, kinds[r["kind"]], 0, i * 10, 10)
        idents = {fold(r["id"]), r["ident"]}
        index.add(r["id"], row, r["text"], r["fields"], r["title"], idents)
    return index, index.view(), early


def _answer(view, q: Query, limit: int, plain: bool) -> tuple:
    r = (ranking.rank_plain if plain else ranking.rank)(view, q, limit)
    return (r.terms, r.variants, [(h.rec, h.score, h.exact) for h in r.hits], r.matched,
            r.any_exact)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(_RECORD, min_size=1, max_size=120),
    published=st.integers(0, 120),
    text=st.lists(st.sampled_from([*_WORDS, "cats", "td-1", "r-2", "v2/r-1", "absent"]),
                  max_size=4).map(" ".join),
    since=_TIME, until=_TIME, as_of=_TIME,
    types=st.sampled_from([(), ("task",), ("note", "message"), ("nothing",)]),
    removed=st.none() | st.lists(st.booleans(), max_size=130),
    limit=st.sampled_from([1, 2, 3, 5, 50]),
    sizes=st.sampled_from([(4, 4, 2), (7, 16, 4), (64, 8, 1), (65_536, 65_536, 128)]),
)
def test_the_compiled_ranking_answers_as_the_plain_one(records, published, text, since, until,
                                                       as_of, types, removed, limit, sizes):
    segment, block, time_block = sizes
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(index_module, "SEGMENT_RECORDS", segment)
        mp.setattr(index_module, "TIME_BLOCK", time_block)
        mp.setattr(idorder, "BLOCK", block)
        _, view, early = _build(records, published)
        q = Query(text, since=since, until=until, as_of=as_of, record_types=types,
                  removed=None if removed is None else np.array(removed, dtype=bool))
        for v in (view, early):
            if v is None:
                continue
            assert _answer(v, q, limit, plain=False) == _answer(v, q, limit, plain=True)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(_RECORD, min_size=1, max_size=60), segment=st.sampled_from([3, 8, 64]))
def test_a_records_term_count_is_found_in_the_segment_that_holds_it(records, segment):
    # Relevance counts the hits' terms segment by segment (``View.counts``).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(index_module, "SEGMENT_RECORDS", segment)
        _, view, _ = _build(records, 0)
    recs = list(range(len(records)))
    for term in ("cat", "cats", "gamma", "absent"):
        expected = [(r["text"] + r["fields"] + r["title"]).count(term) for r in records]
        assert view.counts(term, recs) == expected
    assert view.counts("cat", [len(records)]) == [0]


def test_a_common_term_tied_everywhere_is_cut_by_id_across_blocks():
    # 300 records, one word, one time: every record ties on score and time,
    # so the answer is the smallest ids, found across five id blocks.
    ids = [f"id-{(i * 37) % 300:03d}" for i in range(300)]
    records = [{"id": rid, "sec": 7, "nsec": 0, "kind": 0, "text": ["alpha"], "fields": [],
                "title": [], "ident": ""} for rid in ids]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(idorder, "BLOCK", 64)
        mp.setattr(index_module, "SEGMENT_RECORDS", 50)
        _, view, _ = _build(records, 0)
        got = ranking.rank(view, Query("alpha"), 4)
    assert [view.index.ids[h.rec] for h in got.hits] == ["id-000", "id-001", "id-002", "id-003"]
    assert got.matched == 300
