"""Number variants (pkg/recall/variants.go's rules) and the relevance formula.

Variant lists are derived by hand from the rules: read as a singular (+es
after s/x/z/ch/sh, consonant+y -> ies, else +s), then read as a plural (-ies
-> -y and -ie when the term is at least six BYTES; -es after a sibilant ->
stem and stem+e; -s unless -ss/-is/-us or lens/news), dropping anything under
three characters, the term itself, and repeats. Relevance values are the
notes' formula written out: coverage x d/(d+0.02).
"""

from __future__ import annotations

import pytest

from streamd.recall.query.relevance import relevance, relevance_over_counts
from streamd.recall.query.variants import NUMBER_VARIANT_WEIGHT, number_variants, resolve


@pytest.mark.parametrize(
    ("term", "variants"),
    [
        ("goldeneye", ["goldeneyes"]),
        ("goldeneyes", ["goldeneyeses", "goldeneye"]),
        ("cat", ["cats"]),
        ("index", ["indexes"]),
        ("indexes", ["indexeses", "index", "indexe"]),
        ("boxes", ["boxeses", "box", "boxe"]),
        ("churches", ["churcheses", "church", "churche"]),
        ("dishes", ["disheses", "dish", "dishe"]),
        ("buzz", ["buzzes"]),
        ("city", ["cities"]),
        ("sky", ["skies"]),
        ("day", ["days"]),  # a vowel before the y: plain -s
        ("key", ["keys"]),
        ("cities", ["citieses", "city", "citie"]),
        ("movies", ["movieses", "movy", "movie"]),
        ("notes", ["noteses", "note"]),  # "not" is not offered: t is no sibilant
    ],
)
def test_number_variants_follow_the_regular_rules(term, variants):
    assert number_variants(term) == variants


@pytest.mark.parametrize(
    ("term", "variants"),
    [
        ("ties", ["tieses", "tie"]),  # 4 bytes: the -ies reading is not tried
        ("abies", ["abieses", "abie"]),  # 5 bytes: still not
        # 5 characters but 7 bytes: the minimum counts bytes, so -ies -> -y applies.
        ("ññies", ["ññieses", "ññy", "ññie"]),
    ],
)
def test_the_ies_reading_needs_six_bytes_not_six_characters(term, variants):
    assert number_variants(term) == variants


@pytest.mark.parametrize(
    ("term", "variants"),
    [
        ("class", ["classes"]),
        ("less", ["lesses"]),
        ("analysis", ["analysises"]),
        ("basis", ["basises"]),
        ("status", ["statuses"]),
        ("bus", ["buses"]),
        ("corpus", ["corpuses"]),
    ],
)
def test_ss_is_us_endings_are_never_stripped(term, variants):
    assert number_variants(term) == variants


@pytest.mark.parametrize(("term", "variants"), [("lens", ["lenses"]), ("news", ["newses"])])
def test_lens_and_news_are_not_plurals(term, variants):
    assert number_variants(term) == variants


@pytest.mark.parametrize(
    ("term", "variants"),
    [
        ("as", []),
        ("us", []),
        ("x", []),
        ("", []),
        ("was", ["wases"]),  # "wa" is too short to offer
        ("its", ["itses"]),
        ("ñu", []),  # two characters, three bytes: the minimum counts characters
    ],
)
def test_nothing_shorter_than_three_characters_is_derived_from_or_to(term, variants):
    assert number_variants(term) == variants


def test_resolve_expands_only_terms_the_source_does_not_hold():
    vocabulary = {"project", "projects", "goldeneyes"}
    probed: list[str] = []

    def holds(term: str) -> bool:
        probed.append(term)
        return term in vocabulary

    got = resolve(["project", "goldeneye", "fujifilm", "goldeneye"], holds)
    assert got == {"goldeneye": ["goldeneyes"]}
    # A repeated term is probed once: "goldeneye" and its one variant, not twice.
    assert probed.count("goldeneye") == 1
    assert "projects" not in probed


def test_resolve_keeps_every_held_variant_in_rule_order():
    assert resolve(["cities"], {"city", "citie"}.__contains__) == {"cities": ["city", "citie"]}


def test_a_variant_is_worth_half():
    assert NUMBER_VARIANT_WEIGHT == 0.5


# --- relevance ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, 0, 0, 10), 1.0),  # no terms: a browse, everything equally relevant
        ((1, 1, 1, 0), 1.0),  # no length: cannot be reasoned about
        ((0, 2, 0, 10), 0.0),
        ((1, 2, 0, 10), 0.0),
        ((1, 1, 1, 1), 1.0 * (1.0 / (1.0 + 0.02))),
        ((1, 2, 1, 50), 0.25),  # density 0.02 is the half-way point
        ((2, 3, 4, 10), (2 / 3) * (0.4 / (0.4 + 0.02))),
        ((3, 2, 3, 5), 1.0 * (0.6 / (0.6 + 0.02))),  # coverage is capped at 1
    ],
)
def test_relevance_is_coverage_times_concentration(args, expected):
    assert relevance(*args) == expected


def test_relevance_over_counts_keeps_duplicate_terms():
    # "a" twice: two covered terms out of three, hits 2 + 2.
    got = relevance_over_counts(["a", "a", "b"], {"a": 2}, 10)
    assert got == (2 / 3) * (0.4 / (0.4 + 0.02))


def test_relevance_over_counts_of_no_terms_is_one():
    assert relevance_over_counts([], {"a": 3}, 7) == 1.0
