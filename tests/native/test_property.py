"""Property tests: the compiled indexing core against the plain path, its oracle.

Both are fed the same random streams, built to hit every Go quirk the
record rules have (keys spelled in other cases, with escapes or with the
non-ASCII runes that fold into ASCII letters, duplicates with nulls and
wrong types, invalid UTF-8 and lone surrogates, odd times, deep nesting,
Unicode white space, letters only Unicode 15-17 knows, number-variant
words, blank lines, a partial tail), and must agree on every line's
trimming and record, every field's tokens and folds, the cursor counters,
the segments (byte for byte) and the answers a search gives.
"""

from __future__ import annotations

import json
import os
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.native import assert_same_index, path_taken

from streamd.golang import gounicode
from streamd.recall import records
from streamd.recall.index import build, native
from streamd.recall.tokenize import fold, tokenize

_native = native._native
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_native is None, reason="streamd._native is not built"),
]

EXAMPLES = int(os.environ.get("STREAMD_NATIVE_EXAMPLES", "150"))




# --- what streams are made of ---------------------------------------------------------------

# Letters and digits Unicode 17 has and Python 3.11's unicodedata (14.0) does
# not: only the pinned tables can tell they build tokens.
NEW_LETTERS = [
    chr(lo + k)
    for lo, hi in gounicode.LETTER_OR_DIGIT
    for k in range(0, hi - lo + 1, 7)
    if unicodedata.category(chr(lo + k)) == "Cn"
][:400]
assert len(NEW_LETTERS) > 50

WORDS = ["task", "tasks", "query", "queries", "bus", "buses", "box", "boxes", "news", "city",
         "cities", "alpha", "Alpha", "ALPHA", "td-f62256", "C0RECALL/1746177600.000200",
         "REC-118", "owner/repo#12", "v1/a1", "x²", "½", "٣٤", "İstanbul", "ΟΔΟΣ", "ς", "Straße",
         "STRASSE", "ẞ", "e\u0301", "😀", "\ufffd", "--", "a.b.", ":x:", "_", "naïve", "日本語"]
SPACES = [" ", "\t", "  ", "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\u001c", "\n"]


@st.composite
def prose(draw) -> str:
    parts = draw(st.lists(st.one_of(
        st.sampled_from(WORDS),
        st.sampled_from(NEW_LETTERS).map(lambda c: c * 2),
        st.text(max_size=6),
    ), max_size=12))
    seps = draw(st.lists(st.sampled_from(SPACES), min_size=len(parts), max_size=len(parts)))
    return "".join(p + s for p, s in zip(parts, seps, strict=True))


def j(s: str, ascii_only: bool = False) -> bytes:
    return json.dumps(s, ensure_ascii=ascii_only).encode()


# Raw JSON string tokens Go decodes specially.
ODD_STRINGS = [
    b'"\\ud800"', b'"a\\ud83d\\ude00b"', b'"\\ud800\\u0041"', b'"\\udc00\\ud800"', b'"\\u0000"',
    b'"a\xffb"', b'"\xe2\x80"', b'"\xed\xa0\x80"', b'"\xc0\x80x"', b'"\xf4\x90\x80\x80"',
    b'"tab\tin"', b'"\xe2\x80\xa8"', b'"\\/\\b\\f\\n\\r\\t\\"\\\\"', b'""', b'"\\x"',
]


@st.composite
def string_value(draw) -> bytes:
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(ODD_STRINGS))
    return j(draw(prose()), draw(st.booleans()))


TIMES = [
    "2026-05-02T10:00:00Z", "2026-05-02T10:00:00.5Z", "2026-05-02T10:00:00,123456789123Z",
    "2026-05-02T10:00:00+24:00", "2026-05-02T10:00:00-00:60", "2026-05-02T1:00:00Z",
    "0000-01-01T00:00:00Z", "0000-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01",
    "0001-01-01T00:00:00Z", "0001-01-01T01:00:00+01:00", "2024-02-29T00:00:00Z",
    "2025-02-29T00:00:00Z", "2026-05-02t10:00:00Z", "2026-05-02T10:00:00z",
    "2026-05-02 10:00:00Z", "2026-05-02T10:00:60Z", "2026-05-02T10:00:00+0200",
    "2026-05-02T10:00:00+02", "2026-05-02T10:00:00.Z", "1969-12-31T23:59:59.999999999Z",
]


@st.composite
def time_value(draw) -> bytes:
    k = draw(st.integers(0, 9))
    if k == 0:
        return draw(st.sampled_from([b'"2026-05-02T10:00:00\\u005a"', b"20260502", b"null",
                                     b'"2026-05-02T10:00:00\xff"', b"true"]))
    if k <= 3:
        return j(draw(st.sampled_from(TIMES)))
    y, mo, d = draw(st.integers(0, 9999)), draw(st.integers(1, 12)), draw(st.integers(1, 28))
    h, mi, s = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 59))
    frac = draw(st.sampled_from(["", ".1", ".000000001", ",25", ".1234567891"]))
    zone = draw(st.sampled_from(["Z", "+00:00", "-07:30", "+14:00", "+24:00"]))
    return j(f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{zone}")


SCHEMAS = [b"1", b"2", b"1", b"2", b"3", b"0", b"-1", b"1.0", b"1e0", b'"1"', b"-0",
           b"9223372036854775807", b"9223372036854775808", b"18446744073709551616", b"true"]


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@st.composite
def other_value(draw) -> bytes:
    k = draw(st.integers(0, 12))
    if k == 0:
        return nested(draw(st.sampled_from([1, 3, 998, 999, 1000, 1001, 5000, 9998, 9999, 10000])))
    if k == 1:
        return b'{"a":{"b":[1,2,{"c":null}]},"d":[]}'
    return draw(st.sampled_from([b"null", b"true", b"false", b"0", b"-1.5e3", b"1E400", b"[]",
                                 b"{}", b'["x"]', b"NaN", b"01", b"[1,]", b'{"a"}', b"1.", b"-"]))


# Spellings of each known key as they appear in the line (already JSON text).
KEYS = {
    "schema": ["schema", "SCHEMA", "Schema", "\u017fchema", "\\u0073chema", "sch\\u0065ma",
               "\\u017fchema"],
    "id": ["id", "ID", "Id", "\\u0069d", "i\\u0044"],
    "kind": ["kind", "KIND", "\u212aind", "\\u212aind", "\\u004bind"],
    "event_time": ["event_time", "Event_Time", "EVENT_TIME", "event\\u005ftime"],
    "observed_at": ["observed_at", "Observed_At", "observed\\u005Fat"],
    "system": ["system", "SYSTEM", "\u017fy\u017ftem"],
    "ref": ["ref", "REF", "r\\u0065f"],
    "correlation": ["correlation", "Correlation"],
    "title": ["title", "TITLE", "ti\\u0074le"],
    "body": ["body", "Body"],
    "text": ["text", "TEXT", "t\\u0065xt"],
    "actor": ["actor", "Actor"],
    "revision": ["revision", "REVISION"],
}
UNKNOWN = ["extra", "idx", "i d", "", "\\u0000", "\u00fcber", "id\\u0000", "ids", "\u0130d"]


@st.composite
def member(draw, name: str) -> bytes:
    spelled = draw(st.sampled_from(KEYS[name])) if draw(st.integers(0, 3)) else name
    if draw(st.integers(0, 12)) == 0:
        value = draw(other_value())  # the wrong type, or null
    elif name == "schema":
        value = draw(st.sampled_from(SCHEMAS))
    elif name in ("event_time", "observed_at"):
        value = draw(time_value())
    else:
        value = draw(string_value())
    return b'"' + spelled.encode() + b'":' + value


@st.composite
def record_line(draw) -> bytes:
    names = ["schema", "id", "event_time"]
    names += draw(st.lists(st.sampled_from(sorted(KEYS)), max_size=8))
    names = draw(st.permutations(names))
    members = [draw(member(n)) for n in names]
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(UNKNOWN)).encode()
        members.insert(draw(st.integers(0, len(members))),
                       b'"' + key + b'":' + draw(st.one_of(other_value(), string_value())))
    ws = draw(st.sampled_from([b"", b" ", b"\t", b"\r", b"\n "]))
    line = b"{" + ws + (b"," + ws).join(members) + ws + b"}"
    k = draw(st.integers(0, 30))
    if k == 0:
        line = line[: draw(st.integers(0, len(line)))]  # truncated
    elif k == 1:
        line += b"x"
    elif k == 2:
        line = b"null"
    elif k == 3:
        line = b"[" + line + b"]"
    pad = draw(st.sampled_from([b"", b" ", b"\t", "\u00a0".encode(), "\u3000".encode(),
                                "\u0085".encode(), "\u2028".encode(), b"\r", b"\xef\xbb\xbf",
                                b"\x1c", b"\xc2"]))
    return pad + line + draw(st.sampled_from([b"", b" ", b"\r", "\u2029".encode(), pad]))


@st.composite
def stream(draw) -> bytes:
    lines = draw(st.lists(st.one_of(
        record_line(), record_line(), record_line(), record_line(),
        st.sampled_from([b"", b"   ", "\u00a0\u3000".encode(), b"not json", b"{", b"\xff\xfe"]),
    ), min_size=1, max_size=25))
    data = b"\n".join(lines) + b"\n"
    if draw(st.booleans()):
        data += draw(record_line())  # a write in progress: no newline yet
    return data


# --- the comparisons ------------------------------------------------------------------------


def plain_record(line: bytes) -> dict | None:
    try:
        r = records.parse_line(line)
    except records.LineError:
        return None
    return {
        "schema": r.schema, "id": r.id, "kind": r.kind, "event_time": r.event_time,
        "observed_at": r.observed_at, "system": r.system, "ref": r.ref,
        "correlation": r.correlation, "title": r.title, "text": r.text, "actor": r.actor,
        "revision": r.revision,
    }


def check_line(raw: bytes) -> None:
    trimmed = records.trim_space(raw)
    assert _native.trim_space(raw) == trimmed, raw
    if not trimmed or len(trimmed) > records.MAX_LINE_BYTES:
        return
    want = plain_record(trimmed)
    assert _native.parse_record(trimmed) == want, trimmed
    if want is not None:
        for name in ("text", "title", "kind", "system", "actor", "ref", "id", "correlation"):
            assert _native.tokenize(want[name]) == tokenize(want[name]), (name, want[name])
            assert _native.fold(want[name]) == fold(want[name]), (name, want[name])






@settings(max_examples=EXAMPLES * 3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example,
                                 HealthCheck.data_too_large])
@given(line=record_line())
def test_every_line_decodes_trims_and_tokenizes_as_on_the_plain_path(line):
    check_line(line)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example,
                                 HealthCheck.data_too_large])
@given(data=stream(), block=st.sampled_from([7, 64, 1000, build.BLOCK_BYTES]))
# Found by CI: a record whose every field is a lone surrogate has no token at all.
@example(data=b'{"schema":[],"id":[],"event_time":[]}x\n{"actor":"\\ud800","id":"\\ud800",'
              b'"kind":"\\ud800","schema":1,"event_time":"2026-05-02T10:00:00Z","actor":null}\n',
         block=7)
def test_a_stream_builds_the_same_records_counters_and_segments_on_both_paths(data, block):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.jsonl"
        path.write_bytes(data)
        for raw in data.split(b"\n")[:-1]:
            check_line(raw + b"\n")
        saved, build.BLOCK_BYTES = build.BLOCK_BYTES, block
        try:
            assert_same_index(path)
        finally:
            build.BLOCK_BYTES = saved


@settings(max_examples=max(10, EXAMPLES // 3), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example,
                                 HealthCheck.data_too_large])
@given(data=stream(), picks=st.lists(st.integers(0, 1 << 30), min_size=4, max_size=8))
def test_a_stream_gives_the_same_search_answers_on_both_paths(make_recall_world, data, picks):
    held = [plain_record(records.trim_space(raw)) for raw in data.split(b"\n")[:-1]]
    held = [r for r in held if r is not None]
    pool = [t for r in held for f in ("text", "title", "kind", "system", "actor", "ref")
            for t in tokenize(r[f])] + [r[k] for r in held for k in ("id", "ref", "correlation")]
    pool = [p for p in pool if p] or ["alpha"]
    queries = ["", *(pool[i % len(pool)] for i in picks)]
    queries += [q + "s" for q in queries[1:3]] + [f"{queries[1]} {queries[2]}", "task queries"]
    with tempfile.TemporaryDirectory() as tmp:
        w = make_recall_world(Path(tmp))
        w.write("a.jsonl", data)
        answers = []
        for compiled in (False, True):
            work = Path(tmp) / f"work-{compiled}"
            work.mkdir()
            with path_taken(compiled):
                adapter = w.adapter(workdir=str(work))
                got = []
                for q in queries:
                    res = w.search(adapter, q, limit=10)
                    res["diagnostics"].pop("elapsed_ms", None)
                    got.append(res)
            answers.append(got)
        assert answers[0] == answers[1]
