"""Record lines decoded the way the reference's encoding/json decodes them.

Each case is a line the reference keeps or fails (RECALL-ADAPTER-NOTES, "Edge
behaviour of the reference"), plus what Go's decoder does with null, duplicate
keys and type errors. Values are written out by hand.
"""

from __future__ import annotations

import calendar

import pytest

from streamd.recall.index.index import Index
from streamd.recall.records import LineError, field_tokens, parse_line, trim_space

NS = 1_000_000_000
AT = b'"event_time":"2026-05-02T09:12:00Z"'
AT_NS = calendar.timegm((2026, 5, 2, 9, 12, 0, 0, 0, 0)) * NS


def line(*parts: bytes) -> bytes:
    return b"{" + b",".join(parts) + b"}"


def fails(raw: bytes) -> bool:
    try:
        parse_line(raw)
    except LineError:
        return True
    return False


# --- keys -----------------------------------------------------------------


def test_keys_match_case_insensitively():
    rec = parse_line(b'{"SCHEMA":2,"ID":"a-1","Event_Time":"2026-05-02T09:12:00Z","TiTlE":"T"}')
    assert (rec.schema, rec.id, rec.event_time, rec.title) == (2, "a-1", AT_NS, "T")


def test_keys_fold_like_go_including_long_s_and_kelvin():
    # Go folds field names with unicode.SimpleFold: ſ is s, the Kelvin sign is k.
    rec = parse_line('{"ſchema":2,"id":"a","\u212aind":"message",'.encode() + AT + b"}")
    assert (rec.schema, rec.kind) == (2, "message")


def test_the_last_of_duplicate_keys_wins():
    rec = parse_line(line(b'"schema":2', b'"id":"first"', b'"id":"second"', AT))
    assert rec.id == "second"


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((b'"id":"lower"', b'"ID":"upper"'), "upper"),
        ((b'"ID":"upper"', b'"id":"lower"'), "lower"),
        ((b'"Id":"x"', b'"iD":"y"', b'"id":"z"'), "z"),
    ],
)
def test_the_last_of_case_variant_duplicates_wins(parts, expected):
    assert parse_line(line(b'"schema":2', *parts, AT)).id == expected


def test_unknown_keys_are_ignored_whatever_their_value():
    rec = parse_line(line(b'"schema":2', b'"id":"a"', b'"extra":{"deep":[1,2e400,null]}', AT))
    assert rec.id == "a"


# --- null -----------------------------------------------------------------


def test_null_is_fine_for_every_string_field():
    raw = line(
        b'"schema":2', b'"id":"a"', AT, b'"kind":null', b'"system":null', b'"ref":null',
        b'"correlation":null', b'"title":null', b'"text":null', b'"actor":null',
        b'"revision":null', b'"body":null',
    )
    rec = parse_line(raw)
    assert rec.kind == "event"  # null kind is no kind, so the default applies
    assert (rec.system, rec.ref, rec.correlation, rec.title, rec.text, rec.actor,
            rec.revision) == ("", "", "", "", "", "", "")


def test_observed_at_null_is_absent():
    rec = parse_line(line(b'"schema":2', b'"id":"a"', AT, b'"observed_at":null'))
    assert rec.observed_at is None


def test_a_null_after_a_case_variant_value_leaves_a_string_field_as_it_was():
    # Go: null into a non-pointer is a no-op.
    rec = parse_line(line(b'"schema":2', b'"id":"a"', AT, b'"title":"kept"', b'"Title":null'))
    assert rec.title == "kept"


def test_a_null_after_an_exact_duplicate_leaves_a_string_field_as_it_was():
    rec = parse_line(line(b'"schema":2', b'"id":"a"', AT, b'"title":"kept"', b'"title":null'))
    assert rec.title == "kept"


def test_a_null_after_an_exact_duplicate_event_time_keeps_the_time():
    rec = parse_line(line(b'"schema":2', b'"id":"a"', AT, b'"event_time":null'))
    assert rec.event_time == AT_NS


def test_a_later_null_observed_at_clears_the_pointer():
    rec = parse_line(
        line(b'"schema":2', b'"id":"a"', AT, b'"observed_at":"2026-05-02T09:13:00Z"',
             b'"Observed_At":null')
    )
    assert rec.observed_at is None


# --- type errors ----------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [b'"schema":1.0', b'"schema":"1"', b'"schema":1e0', b'"schema":true', b'"schema":[1]',
     b'"schema":99999999999999999999'],
)
def test_a_schema_that_is_not_a_json_integer_fails_the_line(schema):
    assert fails(line(schema, b'"id":"a"', AT))


@pytest.mark.parametrize(
    "field",
    [b'"revision":7', b'"title":1', b'"id":5', b'"kind":false', b'"text":{}', b'"ref":[]'],
)
def test_a_number_or_structure_where_a_string_belongs_fails_the_line(field):
    assert fails(line(b'"schema":2', b'"id":"a"', AT, field))


@pytest.mark.parametrize(
    "dup",
    [
        (b'"title":7', b'"title":"x"'),
        (b'"schema":"2"', b'"schema":2'),
        (b'"event_time":"yesterday"', AT),
    ],
)
def test_a_bad_value_fails_the_line_even_if_a_later_duplicate_is_good(dup):
    assert fails(line(b'"schema":2', b'"id":"a"', AT, *dup))


def test_a_time_that_is_a_number_fails_the_line():
    assert fails(line(b'"schema":2', b'"id":"a"', b'"event_time":1777713120'))


def test_an_escaped_time_is_not_a_time():
    # Go parses a time from the raw bytes between the quotes, escapes and all.
    assert fails(line(b'"schema":2', b'"id":"a"', b'"event_time":"2026-05-02T09:12:00\\u005a"'))


def test_an_escaped_time_is_not_a_time_even_when_another_field_spells_it_plainly():
    assert fails(line(b'"schema":2', b'"id":"a"', b'"title":"2026-05-02T09:12:00Z"',
                      b'"event_time":"2026-05-02T09:12:00\\u005a"'))


@pytest.mark.parametrize(
    "raw",
    [b"[1,2]", b'"text"', b"42", b"{", b'{"schema":2,"id":"a",' + AT + b"} trailing",
     b"\xef\xbb\xbf" + line(b'"schema":2', b'"id":"a"', AT)],
)
def test_a_line_that_is_not_one_json_object_fails(raw):
    assert fails(raw)


# --- strings --------------------------------------------------------------


def test_invalid_utf8_becomes_one_replacement_character_per_byte_and_the_line_is_kept():
    rec = parse_line(line(b'"schema":2', b'"id":"a\xffb"', b'"title":"x\xe6\x97y"', AT))
    assert rec.id == "a\ufffdb"
    # A truncated three-byte sequence is two bad bytes, so two replacements.
    assert rec.title == "x\ufffd\ufffdy"


def test_a_lone_surrogate_escape_becomes_a_replacement_character():
    rec = parse_line(line(b'"schema":2', b'"id":"a\\ud800b"', b'"title":"\\ud83d\\ude00"', AT))
    assert rec.id == "a\ufffdb"
    assert rec.title == "\U0001f600"


@pytest.mark.parametrize("ctrl", [b"\t", b"\x01", b"\x1f", b"\r"])
def test_a_raw_control_character_inside_a_string_fails_the_line(ctrl):
    assert fails(line(b'"schema":2', b'"id":"a"', b'"title":"x' + ctrl + b'y"', AT))


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085", "\x7f"])
def test_raw_line_separators_inside_a_string_are_kept(sep):
    rec = parse_line(line(b'"schema":2', b'"id":"a"', f'"title":"x{sep}y"'.encode(), AT))
    assert rec.title == f"x{sep}y"


# --- required fields and schema versions ---------------------------------------


@pytest.mark.parametrize("schema", [b'"schema":0', b'"schema":3', b'"schema":-1', b""])
def test_a_schema_outside_1_to_2_fails_the_line(schema):
    parts = [p for p in (schema, b'"id":"a"', AT) if p]
    assert fails(line(*parts))


@pytest.mark.parametrize(
    "parts",
    [
        (b'"schema":2', AT),
        (b'"schema":2', b'"id":""', AT),
        (b'"schema":2', b'"id":"a"'),
        (b'"schema":2', b'"id":"a"', b'"event_time":null'),
    ],
)
def test_a_record_without_an_id_or_an_event_time_fails(parts):
    assert fails(line(*parts))


@pytest.mark.parametrize(
    "zero", [b'"0001-01-01T00:00:00Z"', b'"0001-01-01T01:00:00+01:00"', b'"0001-01-01T00:00:00.0Z"']
)
def test_the_zero_time_is_no_event_time(zero):
    assert fails(line(b'"schema":2', b'"id":"a"', b'"event_time":' + zero))


def test_one_nanosecond_after_the_zero_time_is_an_event_time():
    rec = parse_line(
        line(b'"schema":2', b'"id":"a"', b'"event_time":"0001-01-01T00:00:00.000000001Z"')
    )
    assert rec.event_time == -62_135_596_800 * NS + 1


def test_year_zero_is_an_event_time():
    rec = parse_line(line(b'"schema":1', b'"id":"a"', b'"event_time":"0000-06-01T00:00:00Z"'))
    assert rec.event_time < -62_135_596_800 * NS


def test_schema_1_text_is_body_and_it_has_no_actor():
    rec = parse_line(
        line(b'"schema":1', b'"id":"a"', AT, b'"body":"from body"', b'"text":"from text"',
             b'"actor":"marcus"')
    )
    assert (rec.text, rec.actor) == ("from body", "")


def test_schema_2_text_is_text_plus_actor():
    rec = parse_line(
        line(b'"schema":2', b'"id":"a"', AT, b'"body":"from body"', b'"text":"from text"',
             b'"actor":"marcus"')
    )
    assert (rec.text, rec.actor) == ("from text", "marcus")


def test_optional_fields_default():
    rec = parse_line(line(b'"schema":2', b'"id":"a"', AT))
    assert rec.kind == "event"
    assert rec.observed_at is None
    assert rec.local == "v2/a"


def test_an_empty_kind_is_the_default_kind():
    assert parse_line(line(b'"schema":2', b'"id":"a"', AT, b'"kind":""')).kind == "event"


def test_observed_at_keeps_nanoseconds():
    rec = parse_line(line(b'"schema":2', b'"id":"a"', AT,
                          b'"observed_at":"2026-05-02T09:12:04.000000007Z"'))
    assert rec.observed_at == AT_NS + 4 * NS + 7


# --- trimming and weighing ---------------------------------------------------------


def test_lines_are_trimmed_with_unicode_white_space():
    body = line(b'"schema":2', b'"id":"a"', AT)
    padded = "\u00a0\u3000 \t".encode() + body + "\u2028\u0085\r\n".encode()
    assert trim_space(padded) == body


def test_trimming_leaves_non_space_format_characters():
    # U+200B and U+FEFF are not white space to Go.
    raw = "\u200b".encode() + b"{}" + "\ufeff".encode()
    assert trim_space(raw) == raw


def test_a_token_weighs_its_strongest_field_and_every_occurrence_counts():
    rec = parse_line(
        line(b'"schema":2', b'"id":"a"', AT, b'"title":"Deploy alpha"',
             b'"text":"alpha beta alpha"', b'"kind":"message"', b'"system":"ci"',
             b'"actor":"beta"', b'"ref":"R-1"', b'"correlation":"corr"')
    )
    index = Index()
    index.add(rec.id, (0, 0, 0, 0, rec.schema, 0, 0, 0, 1), *field_tokens(rec), set())
    view = index.view()
    got = {}
    for term in ("deploy", "alpha", "beta", "message", "ci", "r-1", "corr", "a"):
        p = view.postings(term)
        if p is not None:
            got[term] = (float(p.weights[0]), int(p.counts[0]))
    assert got == {
        "deploy": (1.0, 1), "alpha": (1.0, 3), "beta": (0.5, 2), "message": (0.5, 1),
        "ci": (0.5, 1), "r-1": (0.5, 1),
    }
    # text 3 + kind 1 + system 1 + actor 1 + ref 1 + title 2; id and correlation are not scored.
    assert index.column("length", 0) == 9
