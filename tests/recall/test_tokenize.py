"""The reference tokenizer and the identifier comparison.

Expectations follow the rule in RECALL-ADAPTER-NOTES: lowercase per
character, split on anything that is not a Unicode letter, a decimal digit
or one of ``- _ . / :``, trim those five from both ends, drop empties.

Letters, digits, case and folding are Unicode 17.0.0, go1.27's tables. The
expectations for characters newer than Python 3.11's Unicode 14.0.0 were
checked against a Go program built with go1.27 (``unicode.IsLetter``,
``unicode.IsDigit``, ``unicode.ToLower``, ``strings.EqualFold``); the edition
that assigned each one is from the Unicode Character Database.
"""

from __future__ import annotations

import pytest

from streamd.golang import gounicode
from streamd.recall.tokenize import UNICODE_VERSION, fold, lower, tokenize


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


# --- the pinned Unicode edition ---------------------------------------------------


def test_the_unicode_edition_is_the_references_not_the_interpreters():
    assert UNICODE_VERSION == "17.0.0"


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # Unicode 15.0: a Nag Mundari letter and a CJK Extension H ideograph.
        ("alpha w\U0001e4d0x", ["alpha", "w\U0001e4d0x"]),
        ("\U00031350字", ["\U00031350字"]),
        # Unicode 16.0: Todhri and Tulu-Tigalari letters, Garay digits (Nd).
        ("a\U000105c0\U000105c1b", ["a\U000105c0\U000105c1b"]),
        ("\U00011380\U00011381-1", ["\U00011380\U00011381-1"]),
        ("garay\U00010d40\U00010d41", ["garay\U00010d40\U00010d41"]),
        # Unicode 17.0: Sidetic, Tolong Siki and Beria Erfe letters.
        ("\U00010940\U00010941 x", ["\U00010940\U00010941", "x"]),
        ("\U00011db0\U00011db1.y", ["\U00011db0\U00011db1.y"]),
        ("--\U00016ea0--", ["\U00016ebb"]),
    ],
    ids=["nag-mundari", "cjk-ext-h", "todhri", "tulu-tigalari", "garay-digits", "sidetic",
         "tolong-siki", "beria-erfe"],
)
def test_letters_and_digits_newer_than_unicode_14_build_tokens(text, tokens):
    assert tokenize(text) == tokens


def test_each_edge_of_the_generated_letter_or_digit_ranges_is_honoured():
    # The tokenizer expands the ranges into a BMP table and a search beyond
    # it; an off-by-one at any edge would move a character across the line.
    for lo, hi in gounicode.LETTER_OR_DIGIT:
        for r, inside in ((lo - 1, False), (lo, True), (hi, True), (hi + 1, False)):
            if 0xD800 <= r <= 0xDFFF or r > 0x10FFFF or chr(r) in "-_./:":
                continue
            assert len(tokenize(f"x{chr(r)}y")) == (1 if inside else 2), hex(r)


def test_symbols_beyond_the_bmp_split_tokens_and_letters_there_lowercase():
    assert tokenize("a\U0001f389b") == ["a", "b"]  # an emoji is no letter
    assert tokenize("Ünï \U0001f389 \U00010400\U00010401") == ["ünï", "\U00010428\U00010429"]


@pytest.mark.parametrize(
    ("text", "lowered", "tokens"),
    [
        ("\ua7cbX", "\u0264x", ["\u0264x"]),  # Latin capital ramshorn (16.0)
        ("\U00010d50\U00010d51", "\U00010d70\U00010d71", ["\U00010d70\U00010d71"]),  # Garay (16.0)
        ("\U00016ea0-7", "\U00016ebb-7", ["\U00016ebb-7"]),  # Beria Erfe (17.0)
        ("\ua7dc", "\u019b", ["\u019b"]),  # capital lambda with stroke
    ],
    ids=["latin-ramshorn", "garay", "beria-erfe", "lambda-with-stroke"],
)
def test_case_pairs_unknown_to_unicode_14_lowercase_as_go_does(text, lowered, tokens):
    assert lower(text) == lowered
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("STRASSE-1", "strasse-1"),
        ("Td-F62256", "td-f62256"),
        ("\u212a", "k"),  # Kelvin sign folds with k
        ("ſ", "S"),  # long s folds with s
        ("ς", "Σ"),  # final sigma, sigma, capital sigma: one orbit
        ("ẞ", "ß"),  # capital sharp s folds to sharp s
        ("\ua7cb-1", "\u0264-1"),  # case pairs newer than Unicode 14
        ("\U00010d50", "\U00010d70"),
        ("\U00016ea0-1", "\U00016ebb-1"),
        ("\ua7dc", "\u019b"),
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
        ("ı", "i"),  # dotless i and dotted capital I each stand alone
        ("İ", "i"),
        ("\U00016ea0", "\U00016ea1"),  # two Beria Erfe capitals
    ],
)
def test_simple_case_folding_keeps_apart(a, b):
    assert fold(a) != fold(b)
