"""Scoring, ordering, limits and filters, through StreamAdapter on real files.

Expected scores are the notes' rules done by hand: a token weighs its
strongest field (title 1.0; kind, system, actor, ref 0.5; text 0.4),
local_score is the left-to-right sum over the query's terms (duplicates
kept) divided by their number, and a number variant counts half when the
store holds no record with the term itself.
"""

from __future__ import annotations

import pytest


def order(result) -> list[str]:
    return [c["source_record_id"] for c in result["candidates"]]


def scores(result) -> dict[str, float]:
    return {c["source_record_id"]: c["local_score"] for c in result["candidates"]}


def at(minute: int, second: int = 0, nanos: int = 0) -> str:
    frac = f".{nanos:09d}" if nanos else ""
    return f"2026-05-02T10:{minute:02d}:{second:02d}{frac}Z"


# --- weights --------------------------------------------------------------------


def test_title_weighs_one_kind_system_actor_ref_half_and_text_four_tenths(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("t", at(0), title="Zeta"),
        w.rec("k", at(1), kind="zeta"),
        w.rec("s", at(2), system="zeta"),
        w.rec("a", at(3), actor="zeta"),
        w.rec("r", at(4), ref="ZETA 9"),  # a ref token; the whole ref is not the term
        w.rec("x", at(5), text="a zeta here"),
        w.rec("v1-actor", at(6), schema=1, actor="zeta"),  # schema 1 has no actor
        w.rec("corr", at(7), correlation="zeta-1 zeta"),  # correlation is not scored
        w.rec("zeta-id", at(8)),  # neither is the id
    )
    result = w.search(w.adapter(), "zeta")
    assert scores(result) == {"t": 1.0, "k": 0.5, "s": 0.5, "a": 0.5, "r": 0.5, "x": 0.4}
    # Score first, then the newest of the 0.5 group first.
    assert order(result) == ["t", "r", "a", "s", "k", "x"]
    assert result["diagnostics"]["matched"] == 6
    assert all(c["match_signals"] == ["lexical"] for c in result["candidates"])


def test_a_token_in_several_fields_weighs_its_strongest(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("title-and-text", at(0), title="zeta", text="zeta zeta"),
        w.rec("ref-and-text", at(0), ref="zeta x", text="zeta"),
    )
    assert scores(w.search(w.adapter(), "zeta")) == {"title-and-text": 1.0, "ref-and-text": 0.5}


def test_local_score_is_the_mean_over_terms_with_duplicates_kept(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("a", at(0), title="alpha", text="beta"),
        w.rec("b", at(0), title="beta", text="alpha"),
    )
    adapter = w.adapter()

    even = w.search(adapter, "alpha beta")
    assert scores(even) == {"a": (1.0 + 0.4) / 2, "b": (0.4 + 1.0) / 2}
    assert order(even) == ["a", "b"]  # a tie, broken by id

    alpha_twice = w.search(adapter, "alpha alpha beta")
    assert scores(alpha_twice) == {"a": (1.0 + 1.0 + 0.4) / 3, "b": (0.4 + 0.4 + 1.0) / 3}
    assert order(alpha_twice) == ["a", "b"]

    beta_twice = w.search(adapter, "beta alpha beta")
    assert scores(beta_twice) == {"a": (0.4 + 1.0 + 0.4) / 3, "b": (1.0 + 0.4 + 1.0) / 3}
    assert order(beta_twice) == ["b", "a"]
    assert beta_twice["diagnostics"]["terms"] == 3

    # A term no record holds still counts in the denominator.
    assert scores(w.search(adapter, "alpha omega")) == {"a": 1.0 / 2, "b": 0.4 / 2}


def test_relevance_is_coverage_times_concentration_over_the_record_length(recall_world):
    w = recall_world
    # Tokens: text "beta", kind "event", title "alpha": length 3.
    w.write("a.jsonl", w.rec("a", at(0), title="alpha", text="beta"))
    adapter = w.adapter()
    rel = {q: w.search(adapter, q)["candidates"][0]["relevance"]
           for q in ("alpha omega", "alpha alpha beta", "alpha")}
    d = 1 / 3
    assert rel["alpha omega"] == 0.5 * (d / (d + 0.02))
    assert rel["alpha alpha beta"] == 1.0 * (1.0 / (1.0 + 0.02))  # hits 3 of length 3
    assert rel["alpha"] == 1.0 * (d / (d + 0.02))


# --- exact identifiers ------------------------------------------------------------


def test_exact_hits_form_a_partition_above_higher_scores(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("sig-7", at(0), title="unrelated"),
        w.rec("lex", at(9), title="alpha", text="mentions sig-7"),
        w.rec("by-ref", at(1), ref="SIG-7"),
    )
    result = w.search(w.adapter(), "sig-7 alpha")
    assert order(result) == ["by-ref", "sig-7", "lex"]
    assert scores(result) == {"by-ref": (0.5 + 0) / 2, "sig-7": 0.0, "lex": (0.4 + 1.0) / 2}
    signals = {c["source_record_id"]: c["match_signals"] for c in result["candidates"]}
    assert signals == {"by-ref": ["exact_identifier"], "sig-7": ["exact_identifier"],
                       "lex": ["lexical"]}
    assert result["diagnostics"]["query_mode"] == "exact"


def test_an_exact_hit_on_a_correlation_scores_zero(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("c", at(0), title="other", correlation="corr-1"),
        w.rec("d", at(5), text="see corr-1"),
    )
    result = w.search(w.adapter(), "corr-1")
    assert order(result) == ["c", "d"]
    first = result["candidates"][0]
    assert (first["local_score"], first["match_signals"]) == (0, ["exact_identifier"])
    assert first["relevance"] == 0.0  # the record holds no occurrence of the term


def test_a_locator_local_part_is_an_exact_identifier_for_its_schema_only(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("SIG-9", at(0), schema=1, title="one"),
        w.rec("sig-9", at(1), schema=2, title="two"),
    )
    adapter = w.adapter()
    assert [c["candidate_id"] for c in w.search(adapter, "v1/sig-9")["candidates"]] == ["v1/SIG-9"]
    assert [c["candidate_id"] for c in w.search(adapter, "V2/SIG-9")["candidates"]] == ["v2/sig-9"]
    # Go prints no leading zeros, so v01/... names no record.
    assert w.search(adapter, "v01/sig-9")["candidates"] == []
    # The id alone matches both, case-insensitively.
    assert order(w.search(adapter, "Sig-9")) == ["sig-9", "SIG-9"]


def test_exact_comparison_is_simple_case_folding(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("STRASSE-1", at(0), title="street"))
    adapter = w.adapter()
    hit = w.search(adapter, "strasse-1")
    assert [c["match_signals"] for c in hit["candidates"]] == [["exact_identifier"]]
    miss = w.search(adapter, "straße-1")
    assert miss["candidates"] == []
    assert miss["diagnostics"]["query_mode"] == "lexical"


def test_a_substring_of_an_identifier_is_not_exact(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("td-f62256", at(0), title="task"))
    assert w.search(w.adapter(), "td-f6225")["candidates"] == []


# --- Go's Unicode tables (17.0.0), not the interpreter's (3.11: 14.0.0) -----------
# Values checked against go1.27's unicode and strings packages.


def test_a_letter_newer_than_unicode_14_keeps_its_word_whole(recall_world):
    w = recall_world
    # U+1E4D0 (Nag Mundari, Unicode 15.0) is a letter: tokens event, alpha, w\U0001e4d0x.
    w.write("a.jsonl", w.rec("a", at(0), kind="event", title="alpha w\U0001e4d0x"))
    adapter = w.adapter()
    assert w.search(adapter, "alpha")["candidates"][0]["relevance"] == 0.9433962264150942
    assert w.search(adapter, "x")["candidates"] == []
    assert order(w.search(adapter, "W\U0001e4d0X")) == ["a"]


def test_a_cjk_extension_h_ideograph_joins_the_next_one(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a", at(0), kind="event", title="\U00031350字"))
    adapter = w.adapter()
    assert w.search(adapter, "字")["candidates"] == []
    assert w.search(adapter, "\U00031350字")["candidates"][0]["relevance"] == 0.9615384615384615


def test_exact_identifiers_fold_case_pairs_newer_than_unicode_14(recall_world):
    w = recall_world
    # U+16EA0 and U+16EBB: a Beria Erfe capital and its small letter (Unicode 17.0).
    w.write("a.jsonl", w.rec("\U00016ea0-1", at(0), title="other"))
    hit = w.search(w.adapter(), "\U00016ebb-1")
    assert [c["match_signals"] for c in hit["candidates"]] == [["exact_identifier"]]


def test_a_record_key_matches_a_field_only_under_simple_case_folding(recall_world):
    w = recall_world
    # Full case mapping takes dotless i to I and back to i; Go's EqualFold does not,
    # so "tıtle" is an unknown key and the record has no title.
    w.write("a.jsonl", w.rec("a", at(0), **{"tıtle": "zeta"}), w.rec("b", at(1), title="zeta"))
    assert order(w.search(w.adapter(), "zeta")) == ["b"]


def test_a_settings_key_matches_under_simple_case_folding(recall_world):
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r{i}", at(i), title="alpha") for i in range(3)))
    # The long s folds with s, as Go's encoding/json matches struct fields.
    adapter = w.adapter(**{"max_candidateſ": 1})
    assert order(w.search(adapter, "alpha")) == ["r2"]


# --- ties -----------------------------------------------------------------


def test_ties_go_to_the_newest_event_to_the_nanosecond(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("a", at(0), title="alpha"),
        w.rec("z", at(0, 0, 1), title="alpha"),
        w.rec("m", at(0, 0, 0), title="alpha"),
    )
    assert order(w.search(w.adapter(), "alpha")) == ["z", "a", "m"]


def test_ties_in_score_and_time_go_by_id_in_byte_order(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        *(w.rec(i, at(0), title="alpha") for i in ("é", "b", "a", "B", "_", "Z9")),
    )
    # UTF-8 byte order: digits and capitals before '_' before lowercase before é.
    assert order(w.search(w.adapter(), "alpha")) == ["B", "Z9", "_", "a", "b", "é"]


def test_ties_in_score_time_and_id_keep_stream_order(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("dup", at(0), title="alpha one"),
        w.rec("dup", at(0), schema=1, title="alpha two"),
        w.rec("dup", at(0), title="alpha three"),
    )
    result = w.search(w.adapter(), "alpha")
    assert [c["title"] for c in result["candidates"]] == ["alpha one", "alpha two", "alpha three"]
    offsets = [c["metadata"]["byte_offset"] for c in result["candidates"]]
    assert offsets == sorted(offsets)


def test_after_an_incremental_build_stream_order_is_old_records_then_appended(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("dup", at(0), title="alpha from a"))
    w.write("b.jsonl", w.rec("dup", at(0), title="alpha from b"))
    adapter = w.adapter(["a.jsonl", "b.jsonl"])
    assert [c["title"] for c in w.search(adapter, "alpha")["candidates"]] == [
        "alpha from a", "alpha from b",
    ]
    w.append("a.jsonl", w.rec("dup", at(0), title="alpha appended to a"))
    assert [c["title"] for c in w.search(adapter, "alpha")["candidates"]] == [
        "alpha from a", "alpha from b", "alpha appended to a",
    ]
    # A full rebuild reads file by file again.
    w.current(adapter, full=True)
    assert [c["title"] for c in w.search(adapter, "alpha")["candidates"]] == [
        "alpha from a", "alpha appended to a", "alpha from b",
    ]


# --- number variants --------------------------------------------------------------


def test_a_plural_is_matched_through_a_variant_at_half_weight(recall_world):
    w = recall_world
    # Tokens: kind "event", title "buckets": length 2.
    w.write("a.jsonl", w.rec("r1", at(0), title="buckets"))
    result = w.search(w.adapter(), "bucket")
    (c,) = result["candidates"]
    assert c["local_score"] == 1.0 * 0.5
    assert c["match_signals"] == ["lexical"]
    # Relevance counts the variant's occurrences at full weight.
    assert c["relevance"] == 1.0 * (0.5 / (0.5 + 0.02))


def test_a_variant_is_not_used_once_any_record_holds_the_term_itself(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="buckets"))
    adapter = w.adapter()
    assert order(w.search(adapter, "bucket")) == ["r1"]
    w.append("a.jsonl", w.rec("r2", at(1), text="one bucket"))
    result = w.search(adapter, "bucket")
    assert scores(result) == {"r2": 0.4}
    assert result["diagnostics"]["matched"] == 1


def test_a_variant_weighs_half_its_field_and_mixes_with_plain_terms(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("boxes-in-text", at(0), text="two boxes"),
        w.rec("cities-in-title", at(1), title="cities alpha"),
    )
    adapter = w.adapter()
    assert scores(w.search(adapter, "box")) == {"boxes-in-text": 0.4 * 0.5}
    assert scores(w.search(adapter, "city alpha")) == {"cities-in-title": (1.0 * 0.5 + 1.0) / 2}
    # A singular stored, a plural asked.
    w.append("a.jsonl", w.rec("church", at(2), title="church"))
    assert scores(w.search(adapter, "churches")) == {"church": 0.5}


# --- limits ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_candidates", "limit", "returned"),
    [(None, 0, 50), (None, 55, 50), (None, 7, 7), (3, 0, 3), (3, 2, 2), (3, 10, 3), (60, 0, 60)],
)
def test_limit_is_the_smaller_of_max_candidates_or_50_and_a_positive_request_limit(
    recall_world, max_candidates, limit, returned
):
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r{i:02d}", at(i), title="alpha") for i in range(60)))
    settings = {} if max_candidates is None else {"max_candidates": max_candidates}
    result = w.search(w.adapter(**settings), "alpha", limit=limit)
    assert len(result["candidates"]) == returned
    # matched counts before the limit.
    assert result["diagnostics"]["matched"] == 60
    assert [c["local_rank"] for c in result["candidates"]] == list(range(1, returned + 1))
    assert order(result) == [f"r{i:02d}" for i in range(59, 59 - returned, -1)]


# --- filters ---------------------------------------------------------------------


@pytest.fixture
def quarter_hours(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        *(w.rec(f"q{m}", f"2026-05-02T09:{m:02d}:00Z", title="alpha") for m in (0, 15, 30, 45)),
    )
    return w, w.adapter()


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({"since": "2026-05-02T09:15:00Z", "until": "2026-05-02T09:30:00Z"}, ["q30", "q15"]),
        ({"since": "2026-05-02T09:15:00.000000001Z"}, ["q45", "q30"]),
        ({"until": "2026-05-02T09:29:59.999999999Z"}, ["q15", "q0"]),
        ({"since": "2026-05-02T11:15:00+02:00", "until": "2026-05-02T09:15:00Z"}, ["q15"]),
        ({"since": "2026-05-02T09:31:00Z", "until": "2026-05-02T09:44:00Z"}, []),
    ],
)
@pytest.mark.parametrize("query", ["alpha", ""])
def test_since_and_until_are_inclusive(quarter_hours, window, expected, query):
    w, adapter = quarter_hours
    result = w.search(adapter, query, **window)
    assert order(result) == expected
    assert result["diagnostics"]["matched"] == len(expected)


@pytest.mark.parametrize(
    ("as_of", "window", "expected"),
    [
        ("2026-05-02T09:15:00Z", {}, ["q15", "q0"]),
        ("2026-05-02T09:14:59Z", {}, ["q0"]),
        ("2026-05-02T09:45:00Z", {"until": "2026-05-02T09:30:00Z"}, ["q30", "q15", "q0"]),
        ("2026-05-02T09:30:00Z", {"since": "2026-05-02T09:15:00Z"}, ["q30", "q15"]),
    ],
)
def test_as_of_keeps_events_at_or_before_it(quarter_hours, as_of, window, expected):
    w, adapter = quarter_hours
    assert order(w.search(adapter, "alpha", as_of=as_of, **window)) == expected


def test_record_types_filter_keeps_only_those_kinds(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("e", at(0), title="alpha"),
        w.rec("m", at(1), title="alpha", kind="message"),
        w.rec("n", at(2), title="alpha", kind="note"),
    )
    adapter = w.adapter()
    assert order(w.search(adapter, "alpha", record_types=["message"])) == ["m"]
    assert order(w.search(adapter, "alpha", record_types=["event", "note"])) == ["n", "e"]
    assert order(w.search(adapter, "", record_types=["event"])) == ["e"]
    nothing = w.search(adapter, "alpha", record_types=["ticket"])
    assert (nothing["candidates"], nothing["diagnostics"]["matched"]) == ([], 0)


# --- browse ---------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   ", "½ ²", "!!! ---"])
def test_a_query_without_terms_browses_the_window_newest_first(recall_world, query):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("old", at(0), title="alpha"),
        w.rec("new", at(5), text="nothing in common"),
        w.rec("mid", at(3), kind="message"),
    )
    result = w.search(w.adapter(), query)
    assert order(result) == ["new", "mid", "old"]
    for c in result["candidates"]:
        assert c["match_signals"] == ["field"]
        assert c["relevance"] == 1
        assert c["local_score"] == 0
    d = result["diagnostics"]
    assert (d["query_mode"], d["terms"], d["matched"]) == ("temporal", 0, 3)


def test_a_query_matching_nothing_is_lexical_with_no_candidates(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a", at(0), title="alpha"))
    result = w.search(w.adapter(), "omega")
    assert result["candidates"] == []
    d = result["diagnostics"]
    assert (d["query_mode"], d["terms"], d["matched"], d["indexed"]) == ("lexical", 1, 0, 1)
    assert result["outcome"] == "success"


# --- the candidate itself ------------------------------------------------------------


def test_a_candidate_carries_every_recorded_field(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        b"\n",  # a blank line first, so the byte offset is not 0
        w.rec("sig-3", "2026-05-02T09:25:00.5Z", title="REC-118 in review", text="Reviewer asked.",
              kind="event", system="jira", ref="REC-118", correlation="REC-118", actor="marcus",
              revision="7", observed_at="2026-05-02T09:25:02Z"),
    )
    adapter = w.adapter(upstream={"jira": "jira-work"})
    (c,) = w.search(adapter, "review")["candidates"]
    assert c == {
        "candidate_id": "v2/sig-3",
        "source_uid": "",
        "source_id": "",
        "source_record_id": "sig-3",
        "locator": "signals:v2/sig-3",
        "derived_from": ["jira-work:REC-118"],
        "record_type": "event",
        "title": "REC-118 in review",
        "excerpt": "Reviewer asked.",
        "local_rank": 1,
        "local_score": 1.0,
        # Tokens: reviewer, asked, event, jira, marcus, rec-118, rec-118, in, review: 9.
        "relevance": 1.0 * ((1 / 9) / ((1 / 9) + 0.02)),
        "match_signals": ["lexical"],
        "observed_at": "2026-05-02T09:25:02Z",
        "confirmed_at": "2027-01-15T08:00:00Z",
        "event_time": "2026-05-02T09:25:00.5Z",
        "source_revision": "gen-1",
        "sensitivity": "internal",
        "metadata": {
            "actor": "marcus",
            "byte_offset": 1,
            "file": "a.jsonl",
            "ref": "REC-118",
            "schema": 2,
            "system": "jira",
            "upstream_revision": "7",
        },
    }


def test_observed_at_defaults_to_the_build_time_and_metadata_omits_empty_fields(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("bare", at(0), schema=1, title="alpha"))
    (c,) = w.search(w.adapter(), "alpha")["candidates"]
    assert c["observed_at"] == "2027-01-15T08:00:00Z"
    assert c["metadata"] == {"byte_offset": 0, "file": "a.jsonl", "schema": 1}
    assert "excerpt" not in c
    assert "derived_from" not in c


@pytest.mark.parametrize(
    ("system", "ref", "upstream", "derived"),
    [
        ("tasks", "td-1", {"tasks": "tasks-src"}, ["tasks-src:td-1"]),
        ("slack", "td-1", {"tasks": "tasks-src"}, None),  # unmapped system: no edge
        ("tasks", "", {"tasks": "tasks-src"}, None),  # no ref: nothing to point at
    ],
)
def test_derived_from_only_for_a_mapped_system_with_a_ref(
    recall_world, system, ref, upstream, derived
):
    w = recall_world
    w.write("a.jsonl", w.rec("x", at(0), title="alpha", system=system, ref=ref))
    (c,) = w.search(w.adapter(upstream=upstream), "alpha")["candidates"]
    assert c.get("derived_from") == derived


@pytest.mark.parametrize(
    ("text", "excerpt"),
    [
        ("a" * 240, "a" * 240),  # exactly at the limit: untouched
        ("word " * 60, ("word " * 48).strip() + "…"),  # cut at 240 bytes, then trimmed
        ("é" * 150, "é" * 120 + "…"),  # 240 bytes is 120 two-byte characters
        ("a" * 239 + "é" * 5, "a" * 239 + "…"),  # the cut would split an é: back off
        ("  padded  ", "  padded  "),  # short text is not trimmed
        # The cut ends on a no-break space, which Go's TrimSpace removes too.
        ("a" * 238 + "\u00a0" + "b" * 10, "a" * 238 + "…"),
    ],
)
def test_the_excerpt_is_clipped_at_240_bytes_on_a_character_boundary(recall_world, text, excerpt):
    w = recall_world
    w.write("a.jsonl", w.rec("x", at(0), title="alpha", text=text))
    (c,) = w.search(w.adapter(), "alpha")["candidates"]
    assert c["excerpt"] == excerpt
