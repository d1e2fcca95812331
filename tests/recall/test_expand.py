"""Expand: detail levels, byte budgets, locator errors and the context episode.

Expected content is written out by hand from the notes' layout: summary is
``title``, ``<kind> at <whole-second time>`` and ``upstream: <system> <ref>``;
each wider level only appends lines.
"""

from __future__ import annotations

import itertools

import msgspec
import pytest

from streamd.errors import LOCATOR_EXPIRED, LOCATOR_UNKNOWN, RpcError
from streamd.recall import oneshot
from streamd.recall.wire import ExpandParams


def expand_locator(w, adapter, locator: str, detail: str = "full", budget: int = 0):
    params = msgspec.convert(
        {"locator": locator, "detail": detail, "budget_bytes": budget,
         "deadline": "2999-01-01T00:00:00Z"},
        ExpandParams,
    )
    adapter.parse_locator(params)
    return msgspec.to_builtins(oneshot.expand(adapter, w.current(adapter), params))


def error_of(fn, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(RpcError) as err:
        fn(*args, **kwargs)
    return err.value.code, err.value.message


SUMMARY = "Deploy td-1\nevent at 2026-05-02T10:00:00Z\nupstream: tasks td-1"


@pytest.fixture
def full_record(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("n1", "2026-05-02T10:10:00Z", title="Neighbour"),
        w.rec("x", "2026-05-02T10:00:00.5Z", title="Deploy td-1", system="tasks", ref="td-1",
              text="body text", actor="marcus", correlation="c-1", revision="7"),
    )
    return w, w.adapter()


@pytest.mark.parametrize(
    ("detail", "content"),
    [
        ("summary", SUMMARY),
        ("excerpt", SUMMARY + "\n\nbody text"),
        ("full", SUMMARY + "\n\nbody text\nactor: marcus\ncorrelation: c-1\nupstream_revision: 7"),
        ("context", SUMMARY + "\n\nbody text\nactor: marcus\ncorrelation: c-1\n"
         "upstream_revision: 7\n\nEpisode:\n- v2/n1 2026-05-02T10:10:00Z Neighbour"),
    ],
)
def test_each_detail_level_renders_the_recorded_layout(full_record, detail, content):
    w, adapter = full_record
    n1_len = len(w.rec("n1", "2026-05-02T10:10:00Z", title="Neighbour"))
    assert w.expand(adapter, "v2/x", detail) == {
        "content": content,
        "source_revision": "gen-1",
        "truncated": False,
        "provenance": f"a.jsonl@{n1_len} (v2/x)",
    }


def test_levels_widen_and_never_rewrite(full_record):
    w, adapter = full_record
    texts = [w.expand(adapter, "v2/x", d)["content"]
             for d in ("summary", "excerpt", "full", "context")]
    for narrow, wide in itertools.pairwise(texts):
        assert wide.startswith(narrow)
        assert len(wide) > len(narrow)


def test_the_excerpt_level_clips_the_text_and_full_does_not(recall_world):
    w = recall_world
    text = "word " * 60
    w.write("a.jsonl", w.rec("x", "2026-05-02T10:00:00Z", title="T", text=text))
    adapter = w.adapter()
    head = "T\nevent at 2026-05-02T10:00:00Z"
    assert w.expand(adapter, "v2/x", "excerpt")["content"] == (
        head + "\n\n" + ("word " * 48).strip() + "…"
    )
    assert w.expand(adapter, "v2/x", "full")["content"] == head + "\n\n" + text


def test_optional_lines_are_left_out_when_their_fields_are_empty(recall_world):
    w = recall_world
    # A system without a ref has no upstream line; no text means no body block.
    w.write("a.jsonl", w.rec("x", "2026-05-02T10:00:00Z", kind="message", system="tasks"))
    adapter = w.adapter()
    for detail in ("summary", "excerpt", "full", "context"):
        assert w.expand(adapter, "v2/x", detail)["content"] == "\nmessage at 2026-05-02T10:00:00Z"


# --- budgets --------------------------------------------------------------------------


TEN_E = "é" * 10  # 20 bytes
BUDGET_CONTENT = TEN_E + "\nevent at 2026-05-02T10:00:00Z"


@pytest.mark.parametrize(
    ("budget", "content"),
    [
        (5, "éé"),  # the fifth byte starts an é: cut before it
        (4, "éé"),
        (1, ""),
        (21, TEN_E + "\n"),
        (len(BUDGET_CONTENT.encode()) - 1, BUDGET_CONTENT[:-1]),
    ],
)
def test_over_budget_content_is_cut_on_a_utf8_boundary(recall_world, budget, content):
    w = recall_world
    w.write("a.jsonl", w.rec("x", "2026-05-02T10:00:00Z", title=TEN_E))
    result = w.expand(w.adapter(), "v2/x", "summary", budget)
    assert result["content"] == content
    assert len(result["content"].encode()) <= budget
    assert result["truncated"] is True
    assert result["truncation_boundary"] == "budget_bytes"


@pytest.mark.parametrize("budget", [0, 1000])
def test_a_budget_of_zero_or_one_the_content_fits_does_not_truncate(recall_world, budget):
    w = recall_world
    w.write("a.jsonl", w.rec("x", "2026-05-02T10:00:00Z", title=TEN_E))
    result = w.expand(w.adapter(), "v2/x", "summary", budget)
    assert result["content"] == BUDGET_CONTENT
    assert result["truncated"] is False
    assert "truncation_boundary" not in result


def test_a_budget_equal_to_the_content_size_does_not_truncate(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("x", "2026-05-02T10:00:00Z", title=TEN_E))
    result = w.expand(w.adapter(), "v2/x", "summary", len(BUDGET_CONTENT.encode()))
    assert (result["content"], result["truncated"]) == (BUDGET_CONTENT, False)


# --- locators -----------------------------------------------------------------------


@pytest.fixture
def v1_record(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("x", "2026-05-02T10:00:00Z", schema=1, title="one"))
    return w, w.adapter()


@pytest.mark.parametrize(
    ("local", "message"),
    [
        ("v 1/x", '"v 1/x" names no schema version'),
        ("v1_0/x", '"v1_0/x" names no schema version'),
        ("v٣/x", '"v٣/x" names no schema version'),
        ("v0/x", '"v0/x" names no schema version'),
        ("v-1/x", '"v-1/x" names no schema version'),
        ("v/x", '"v/x" names no schema version'),
        ("v1.0/x", '"v1.0/x" names no schema version'),
        ("v\t1/x", '"v\\t1/x" names no schema version'),  # quoted like Go's %q
        ('v"1/x', '"v\\"1/x" names no schema version'),
        ("x", '"x" is not a stream locator, want v<schema>/<id>'),
        ("1/x", '"1/x" is not a stream locator, want v<schema>/<id>'),
        ("V1/x", '"V1/x" is not a stream locator, want v<schema>/<id>'),
        ("v1/", '"v1/" is not a stream locator, want v<schema>/<id>'),
    ],
)
def test_a_locator_that_names_no_stream_record_is_unknown(v1_record, local, message):
    w, adapter = v1_record
    assert error_of(w.expand, adapter, local) == (LOCATOR_UNKNOWN, message)


def test_a_canonical_locator_expands(v1_record):
    w, adapter = v1_record
    result = w.expand(adapter, "v1/x", "summary")
    assert result["content"] == "one\nevent at 2026-05-02T10:00:00Z"
    assert result["provenance"] == "a.jsonl@0 (v1/x)"


@pytest.mark.parametrize("local", ["v+1/x", "v01/x", "v001/x"])
def test_a_signed_or_zero_padded_schema_number_parses_like_gos_atoi(v1_record, local):
    _, adapter = v1_record
    params = msgspec.convert(
        {"locator": f"signals:{local}", "detail": "summary", "budget_bytes": 0,
         "deadline": "2999-01-01T00:00:00Z"},
        ExpandParams,
    )
    assert adapter.parse_locator(params) == (1, "x", local)


@pytest.mark.parametrize("local", ["v+1/x", "v01/x"])
def test_a_non_canonical_local_part_misses_the_identity_like_the_reference(v1_record, local):
    w, adapter = v1_record
    assert error_of(w.expand, adapter, local) == (
        LOCATOR_EXPIRED, "x is now schema v1, the locator names v1"
    )


def test_a_schema_number_at_the_int64_limit_is_a_schema(v1_record):
    w, adapter = v1_record
    assert error_of(w.expand, adapter, "v9223372036854775807/x") == (
        LOCATOR_EXPIRED, "x is now schema v1, the locator names v9223372036854775807"
    )


def test_a_schema_number_past_int64_names_no_schema(v1_record):
    w, adapter = v1_record
    assert error_of(w.expand, adapter, "v9223372036854775808/x") == (
        LOCATOR_UNKNOWN, '"v9223372036854775808/x" names no schema version'
    )


def test_the_source_part_of_a_locator_is_ignored_and_the_id_may_hold_colons(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a:b", "2026-05-02T10:00:00Z", title="colon"))
    adapter = w.adapter()
    result = expand_locator(w, adapter, "somebody-else:v2/a:b", "summary")
    assert result["content"].startswith("colon\n")
    assert result["provenance"] == "a.jsonl@0 (v2/a:b)"


def test_a_record_held_under_another_schema_is_expired_and_named(v1_record):
    w, adapter = v1_record
    assert error_of(w.expand, adapter, "v2/x") == (
        LOCATOR_EXPIRED, "x is now schema v1, the locator names v2"
    )


def test_a_record_not_held_is_expired_with_the_generation(v1_record):
    w, adapter = v1_record
    assert error_of(w.expand, adapter, "v1/nope") == (LOCATOR_EXPIRED, "gen-1 holds no record nope")


def test_expand_compares_ids_exactly_not_by_case_folding(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("X", "2026-05-02T10:00:00Z", title="upper"))
    assert error_of(w.expand, w.adapter(), "v2/x") == (
        LOCATOR_EXPIRED, "gen-1 holds no record x"
    )


def test_is_now_schema_names_the_first_record_with_that_id_in_stream_order(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("x", "2026-05-02T10:00:00Z", schema=2, title="two"),
        w.rec("x", "2026-05-02T09:00:00Z", schema=1, title="one"),
    )
    assert error_of(w.expand, w.adapter(), "v3/x") == (
        LOCATOR_EXPIRED, "x is now schema v2, the locator names v3"
    )


# --- the episode ----------------------------------------------------------------------


def test_the_episode_is_every_other_id_within_15_minutes_inclusive_in_stream_order(recall_world):
    w = recall_world
    long_title = "t" * 130
    w.write(
        "a.jsonl",
        w.rec("out-before", "2026-05-02T09:44:59.999999999Z", title="too early"),
        w.rec("edge-after", "2026-05-02T10:15:00Z", title="last in"),
        w.rec("m", "2026-05-02T10:05:00Z", schema=1, title="same id, other schema"),
        w.rec("m", "2026-05-02T10:00:00Z", title="main"),
        w.rec("same-time", "2026-05-02T10:00:00Z", title=long_title),
        w.rec("edge-before", "2026-05-02T09:45:00Z", title="first in"),
        w.rec("out-after", "2026-05-02T10:15:00.000000001Z", title="too late"),
    )
    content = w.expand(w.adapter(), "v2/m", "context")["content"]
    assert content == (
        "main\nevent at 2026-05-02T10:00:00Z\n\nEpisode:"
        "\n- v2/edge-after 2026-05-02T10:15:00Z last in"
        f"\n- v2/same-time 2026-05-02T10:00:00Z {'t' * 120}…"
        "\n- v2/edge-before 2026-05-02T09:45:00Z first in"
    )


def test_no_neighbours_means_no_episode_block(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("m", "2026-05-02T10:00:00Z", title="main"),
        w.rec("far", "2026-05-02T11:00:00Z", title="far"),
    )
    assert w.expand(w.adapter(), "v2/m", "context")["content"] == (
        "main\nevent at 2026-05-02T10:00:00Z"
    )


def test_the_episode_follows_stream_order_after_an_incremental_build(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("m", "2026-05-02T10:00:00Z", title="main"),
        w.rec("a-old", "2026-05-02T10:01:00Z", title="a old"),
    )
    w.write("b.jsonl", w.rec("b-old", "2026-05-02T10:02:00Z", title="b old"))
    adapter = w.adapter(["a.jsonl", "b.jsonl"])
    w.current(adapter)
    w.append("a.jsonl", w.rec("a-new", "2026-05-02T10:03:00Z", title="a new"))

    def episode() -> list[str]:
        content = w.expand(adapter, "v2/m", "context")["content"]
        return [line.split()[1] for line in content.split("\n") if line.startswith("- ")]

    assert episode() == ["v2/a-old", "v2/b-old", "v2/a-new"]
    w.current(adapter, full=True)
    assert episode() == ["v2/a-old", "v2/a-new", "v2/b-old"]


@pytest.mark.parametrize("budget", [1, 28, 29, 58, 59, 300, 2000])
def test_a_budgeted_context_reads_back_only_the_episode_lines_that_can_show(
        recall_world, monkeypatch, budget):
    # A window of 3,000 records (a bulk import stamped with one second): at a
    # million such records the expand read every line back, 26 s and 1 GB,
    # to show the first few dozen (the reference answers in 3.7 s).
    w = recall_world
    titles = ["", "é" * 9, "t"]
    w.write("a.jsonl", *(w.rec(f"r-{i}", "2026-05-02T10:00:00Z", title=titles[i % 3])
                         for i in range(3000)))
    adapter = w.adapter()
    whole = expand_locator(w, adapter, "signals:v2/r-5", "context")
    read: list[int] = []
    real = oneshot.read_spans

    def counted(spans):
        read.append(len(spans))
        return real(spans)

    monkeypatch.setattr(oneshot, "read_spans", counted)
    cut = expand_locator(w, adapter, "signals:v2/r-5", "context", budget)
    assert read == [1 + budget // 29 + 1]
    content = whole["content"].encode()[:budget].decode("utf-8", "ignore")
    assert (cut["content"], cut["truncated"]) == (content, True)
