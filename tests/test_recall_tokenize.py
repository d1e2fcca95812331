"""The reference tokenizer and the identifier comparison.

Expectations follow the rule in RECALL-ADAPTER-NOTES: lowercase per
character, split on anything that is not a Unicode letter, a decimal digit
or one of ``- _ . / :``, trim those five from both ends, drop empties.
"""

from __future__ import annotations

import pytest

from streamd.tokenize import fold, lower, tokenize


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("td-f62256", ["td-f62256"]),
        ("C0RECALL/1746177600.000200", ["c0recall/1746177600.000200"]),
        ("REC-118 transitioned", ["rec-118", "transitioned"]),
        ("snake_case and a:b:c", ["snake_case", "and", "a:b:c"]),
        ("https://example.org/x", ["https://example.org/x"]),
    ],
)
def test_identifier_punctuation_stays_inside_a_token(text, tokens):
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("--foo.bar:/", ["foo.bar"]),
        ("_x_", ["x"]),
        ("(a-b), c_d!", ["a-b", "c_d"]),
        ("...:", []),
        ("- / _ . :", []),
        ("--日本--", ["日本"]),
        ("ünï..", ["ünï"]),
    ],
)
def test_identifier_punctuation_is_trimmed_from_both_ends(text, tokens):
    assert tokenize(text) == tokens


def test_unicode_letters_and_decimal_digits_build_tokens():
    # Arabic-Indic and fullwidth digits are decimal digits (Nd); CJK is letters.
    assert tokenize("Ünïcode ١٢٣ 日本語 １２") == ["ünïcode", "١٢٣", "日本語", "１２"]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("x²", ["x"]),  # superscript two is a digit but not a decimal digit
        ("a½b", ["a", "b"]),  # a vulgar fraction is numeric, not a digit
        ("aⅫb", ["a", "b"]),  # a roman numeral is a letter number, not a letter
        ("e\u0301x", ["e", "x"]),  # a combining mark is not a letter
    ],
)
def test_numeric_characters_and_marks_split_tokens(text, tokens):
    assert tokenize(text) == tokens


def test_a_query_of_only_vulgar_fractions_and_superscripts_has_no_terms():
    assert tokenize("½ ²") == []


def test_dotted_capital_i_lowercases_to_a_plain_i():
    # str.lower() would give "i" + U+0307, and the combining dot would split the token.
    assert tokenize("İSTANBUL") == ["istanbul"]
    assert lower("İ") == "i"


def test_a_final_capital_sigma_lowercases_to_the_medial_sigma():
    # Per-character lowercasing knows no word position: Σ is σ everywhere.
    assert tokenize("ΟΔΟΣ") == ["οδοσ"]
    assert lower("ΣΑΣ") == "σασ"


def test_titlecase_letters_lowercase_by_the_simple_mapping():
    assert tokenize("ǅemal") == ["ǆemal"]


def test_ascii_text_is_lowercased():
    assert tokenize("Hello WORLD") == ["hello", "world"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("STRASSE-1", "strasse-1"),
        ("Td-F62256", "td-f62256"),
        ("\u212a", "k"),  # Kelvin sign folds with k
        ("ſ", "S"),  # long s folds with s
        ("ς", "Σ"),  # final sigma, sigma, capital sigma: one orbit
        ("ẞ", "ß"),  # capital sharp s folds to sharp s
    ],
)
def test_simple_case_folding_equates(a, b):
    assert fold(a) == fold(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("straße-1", "strasse-1"),  # full folding would equate these; simple does not
        ("ß", "ss"),
        ("td-1", "td-2"),
    ],
)
def test_simple_case_folding_keeps_apart(a, b):
    assert fold(a) != fold(b)
