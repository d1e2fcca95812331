"""The compiled core projects and indexes events exactly as the plain path does.

``recall/eventlog/project.py`` is the oracle: for any row the compiled
projection either gives the same kind, title, text and line bytes, or
declines the row (which the plain projection then handles); and a log
indexed through the compiled core leaves byte-identical segments to the
plain path's, declined and failing rows included.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.native import path_taken

from streamd.recall.eventlog.build import LogIndex
from streamd.recall.eventlog.project import describe, line
from streamd.recall.eventlog.settings import LogSettings
from streamd.recall.index import index as index_module
from streamd.recall.index import native

pytestmark = pytest.mark.skipif(native._native is None, reason="streamd._native is not built")

# Text that reaches every rule: spaces Python and Go disagree on (U+001C..F,
# U+0085, U+2028), escapes, multi-byte characters at cut points, newlines.
_CHARS = st.sampled_from([*"ab Z9-_.\n\t\"\\/", "\x00", "\x1c", "\x1f", "\x7f", "\x85",
                          "\u2028", "\u3000", "é", "ſ", "🙂"])
_TEXT = st.lists(_CHARS, max_size=40).map("".join) | st.builds(
    lambda c, n: c * n, _CHARS, st.integers(100, 70_000))
_SCALAR = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _TEXT | st.floats(
    allow_nan=False, allow_infinity=False)
_JSON = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    _TEXT, inner, max_size=4), max_leaves=12)
_NAME = _TEXT | st.none() | st.integers(0, 3) | st.booleans() | st.just([]) | st.just({})


def _part() -> st.SearchStrategy[Any]:
    call = st.fixed_dictionaries({"name": _NAME}, optional={"args": _JSON})
    response = st.fixed_dictionaries({"name": _NAME}, optional={"response": _JSON})
    return st.one_of(
        st.fixed_dictionaries({"text": _TEXT | _JSON}),
        st.fixed_dictionaries({"function_call": call | st.none()}),
        st.fixed_dictionaries({"functionCall": call}),
        st.fixed_dictionaries({"function_response": response}),
        st.fixed_dictionaries({"functionResponse": response}),
        _JSON,
    )


_PARTS = st.lists(_part(), max_size=4)
_CONTENT = st.one_of(
    st.builds(lambda p, r: {"role": r, "parts": p}, _PARTS, _NAME),
    st.builds(lambda p, r: {"content": {"role": r, "parts": p}, "id": "x"}, _PARTS, _NAME),
    st.builds(lambda p: {"parts": p}, _PARTS),
    _TEXT.map(lambda t: {"text": t}),
    _JSON,
)
_DELTA = st.none() | st.just("{}") | st.builds(
    lambda d: json.dumps(d), st.dictionaries(st.sampled_from(["app", "user", "session", "x"]),
                                             st.dictionaries(_TEXT, _SCALAR, max_size=3)
                                             | _SCALAR, max_size=3))
_TIME = st.integers(-(2**62) // 1000, 2**62 // 1000) | st.integers(0, 4_102_444_800_000_000) \
    | st.just(-62_135_596_800_000_000)  # Go's zero time: no event time, a failed record


def _row(seq: int, content: Any, delta: str | None, at_us: int, author: str,
         event_id: str = "ev", session: str = "s") -> tuple[Any, ...]:
    return (seq, "app", "u", session, event_id, "inv", author, "br", at_us,
            json.dumps(content, ensure_ascii=False), delta)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=_CONTENT, delta=_DELTA, at_us=_TIME,
       author=st.sampled_from(["user", "model", ""]))
def test_a_projection_is_the_plain_paths_or_declined(content, delta, at_us, author):
    row = _row(1, content, delta, at_us, author)
    got = native.project_event(row)
    if got is None:
        return  # declined: the plain path projects it (the index test below)
    if not -62_167_219_200_000_000 <= at_us < 253_402_300_800_000_000:
        return  # an unprintable time: both paths fail the record, the line is moot
    assert got == (*describe(row[9], author, delta), line(row))


@pytest.mark.parametrize("content", [
    {"role": "model", "parts": [{"text": "plain words"}]},
    {"role": "user", "parts": [{"text": "a"}, {"function_call": {"name": "f", "args": {
        "q": "x", "n": 3, "deep": [True, None, {"k": "v"}]}}}]},
    {"parts": [{"function_response": {"name": "f", "response": {"hits": ["a", "b"]}}}]},
    "from --text", {"text": "from --content"}, {"any": ["json", {"with": "strings"}], "n": 2.5},
])
def test_what_streamd_and_adk_write_is_never_declined(content):
    assert native.project_event(_row(1, content, None, 1_777_680_000_000_000, "model")) \
        is not None


@pytest.mark.parametrize("content", [
    {"parts": [{"function_call": {"name": 7}}]},  # str() of a number
    {"parts": [{"function_call": {"name": "f", "args": {"x": 1.5}}}]},  # a float re-encoded
    {"role": ["user"], "parts": []},  # str() of a list
])
def test_what_only_python_defines_is_declined(content):
    assert native.project_event(_row(1, content, None, 1_777_680_000_000_000, "model")) is None


def _rows() -> list[tuple[Any, ...]]:
    rows = []
    contents = [
        {"role": "model", "parts": [{"text": "a turn about the checksum drill"}]},
        {"parts": [{"function_call": {"name": "search", "args": {"q": "drill", "n": 1}}}]},
        {"parts": [{"function_call": {"name": 3, "args": {}}}]},  # declined
        {"parts": [{"function_call": {"name": "f", "args": {"x": 0.25}}}]},  # declined
        "plain text",
        {},
    ]
    for n in range(1, 2_400):
        content = contents[n % len(contents)]
        at_us = 1_777_680_000_000_000 + n * 1_000_017
        event_id = f"ev-{n}"
        if n % 97 == 0:
            event_id = ""  # no id: a failed record on both paths
        if n % 101 == 0:
            at_us = 253_402_300_800_000_000 + n  # year 10000: unprintable, failed
        delta = '{"session": {"k": 1}}' if n % 13 == 0 else None
        rows.append(_row(n, content, delta, at_us, "user" if n % 3 else "model",
                         event_id, session=f"s{n % 40}"))
    return rows


def _build(compiled: bool, pages: list[list[tuple[Any, ...]]]) -> LogIndex:
    with path_taken(compiled):
        idx = LogIndex(LogSettings(), lambda: 1_800_000_000_000_000_000)
        for page in pages:
            idx.consume(page)
        idx.publish()
    return idx


def test_a_log_indexed_through_the_compiled_core_is_the_plain_paths(monkeypatch):
    # Small segments, so runs of rows cross seals and declined rows land at
    # segment edges too.
    monkeypatch.setattr(index_module, "SEGMENT_RECORDS", 64)
    rows = _rows()
    pages = [rows[i:i + 333] for i in range(0, len(rows), 333)]
    plain, compiled = _build(False, pages), _build(True, pages)
    assert (plain.seq, plain.failed, plain.latest) == (compiled.seq, compiled.failed,
                                                       compiled.latest)
    assert plain.failed == 24 + 23  # the rows without an id and those of year 10000
    a, b = plain.index, compiled.index
    assert a.ids == b.ids and a.kinds == b.kinds and len(a) == len(b)
    assert [(s.base, s.count) for s in a.segments] == [(s.base, s.count) for s in b.segments]
    for sa, sb in zip(a.segments, b.segments, strict=True):
        for name, arr in sa.arrays().items():
            assert arr.tobytes() == sb.arrays()[name].tobytes(), name


def test_rows_read_twice_and_settings_narrowing_them_index_the_same_on_both_paths():
    rows = _rows()[:300]
    narrowed = LogSettings(authors=["user"])
    built = []
    for compiled in (False, True):
        with path_taken(compiled):
            idx = LogIndex(narrowed, lambda: 0)
            idx.consume(rows[:200])
            idx.consume(rows[150:])  # overlapping pages: the overlap is read once
            built.append(idx.publish())
    plain, comp = built
    # 200 of seqs 1..300 are the user's; 4 of those fail (seqs 97 and 194
    # have no id, 101 and 202 are in year 10000).
    assert plain.view.n == comp.view.n == 196
    assert plain.seq == comp.seq == 300


def test_identifiers_recurring_across_pages_and_segments_index_alike_on_both_paths(monkeypatch):
    # The compiled core keeps recent identifiers' hashes (1,024 slots a
    # thread), reserves a segment's arrays once 1,024 records are in, and
    # cuts a run of 2,048 rows or more in two halves indexed on two threads:
    # 3,000 sessions recurring out of order evict each other from the slots,
    # some too long to be kept, some folded; pages of 3,000 rows in segments
    # of 5,000 are cut at every length; declined rows fall in either half,
    # and new terms and a new kind first appear in a second half; contents
    # with escapes and a repeated key are decoded into borrowed and copied
    # strings alike.
    monkeypatch.setattr(index_module, "SEGMENT_RECORDS", 5_000)
    contents = [
        '{"role":"model","parts":[{"text":"words about the drill"}]}',
        '{"role":"user","parts":[{"text":"quoted \\"drill\\"\\nsecond line"}]}',
        '{"parts":[{"text":"first"}],"parts":[{"text":"kept, in first place"}]}',
        '{"content":{"parts":[{"function_call":{"name":"search","args":{"q":"x\\u00e9"}}}]}}',
        '"just text"',
    ]
    rows = []
    for n in range(1, 14_001):
        session = (f"Séss-{n * 7919 % 3_000}" if n % 5 else
                   f"a-session-id-well-past-forty-bytes-long-{n % 50}")
        content = contents[n % len(contents)]
        if n % 1_301 == 0:
            content = '{"parts":[{"function_call":{"name":7}}]}'  # declined
        elif n % 3_000 > 2_200 and n % 7 == 0:
            content = f'{{"parts":[{{"function_response":{{"name":"late{n}","response":1}}}}]}}'
        rows.append((n, f"app-{n % 3}", f"U{n % 60}", session, f"ev-{n}", f"inv-{n // 4}",
                     "model", "" if n % 2 else f"br.{n % 7}", 1_777_680_000_000_000 + n,
                     content, None))
    pages = [rows[i:i + 3_000] for i in range(0, len(rows), 3_000)]
    plain, compiled = _build(False, pages), _build(True, pages)
    assert plain.failed == compiled.failed == 0
    a, b = plain.index, compiled.index
    assert a.ids == b.ids and a.kinds == b.kinds and len(a.segments) == len(b.segments) == 3
    for sa, sb in zip(a.segments, b.segments, strict=True):
        for name, arr in sa.arrays().items():
            assert arr.tobytes() == sb.arrays()[name].tobytes(), name


def test_a_segment_sealed_behind_joins_the_index_in_order_and_its_failure_is_not_lost(
    monkeypatch,
):
    # A full compiled builder is sealed on a thread of its own while the
    # next pages are added (Index.seal_behind); the segment joins the index
    # at the next call that needs it. Small segments, so several seals run
    # behind a page, with a sink that writes slowly.
    monkeypatch.setattr(index_module, "SEGMENT_RECORDS", 300)
    rows = _rows()
    kept: list[int] = []

    def slow_sink(segment):
        time.sleep(0.01)
        kept.append(segment.base)
        return segment

    with path_taken(True):
        idx = LogIndex(LogSettings(), lambda: 1_800_000_000_000_000_000, slow_sink)
        idx.consume(rows[:1_000])
        assert len(idx.index) == 1_000 - idx.failed == 981  # records sealed behind count
        idx.consume(rows[1_000:])
        generation = idx.publish()
    assert kept[:3] == [0, 300, 600]  # each written once sealed, in order
    segments = generation.view.segments
    assert all(a.base + a.count == b.base for a, b in itertools.pairwise(segments))
    plain = _build(False, [rows[:1_000], rows[1_000:]])
    assert idx.index.ids == plain.index.ids and idx.failed == plain.failed
    for sa, sb in zip(plain.index.segments, segments, strict=True):
        for name, arr in sa.arrays().items():
            assert arr.tobytes() == sb.arrays()[name].tobytes(), name

    # A seal that fails behind is raised by the next call that needs its
    # segment; one a failed pass truncates is dropped.
    def failing_sink(segment):
        raise RuntimeError("the sealing thread failed")

    with path_taken(True):
        idx = LogIndex(LogSettings(), lambda: 0, failing_sink)
        with pytest.raises(RuntimeError, match="the sealing thread failed"):
            idx.consume(rows[:1_000])
            idx.publish()
        idx = LogIndex(LogSettings(), lambda: 0, failing_sink)
        idx.consume(rows[:400])
        idx.index.truncate(0)
        assert len(idx.index) == 0 and idx.index.segments == ()
