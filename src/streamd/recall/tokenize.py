"""The reference tokenizer: identifier runs, lowercased.

A token is a run of Unicode letters, decimal digits and ``- _ . / :``, with
those five trimmed from its ends, so ``td-f62256`` and
``C0RECALL/1746177600.000200`` survive whole and can be compared to a
record's ids. Lowercasing is per character (Go's simple mapping), which is
not what ``str.lower`` does for ``İ`` or a final sigma.

Which characters are letters or digits, how they lowercase and how they fold
is Unicode 17.0.0 (``UNICODE_VERSION``), the edition of the go1.27 that the
reference is built with, whatever Python runs streamd: the tables come from
Go itself (``gounicode``, generated), never from ``unicodedata`` or ``str``
methods, which follow the interpreter's edition (3.11: 14.0.0) and would
split words written in scripts added since. The same functions serve index
and query time, so both sides agree by construction.

ASCII text takes a path of its own (``str.lower`` and one regex), which the
generator checks agrees with Go's tables. Other text is lowered and
classified in one ``str.translate`` over a table for the whole BMP (each
character becomes its lowercase if it is a token character, a space if it
separates tokens); the rare characters beyond the BMP go through a cached
lookup, since a table for them would hold a million entries and a regex
class scans its non-BMP ranges one by one.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache, lru_cache

from streamd.golang import gounicode

UNICODE_VERSION = gounicode.UNICODE_VERSION

# Go's unicode.IsSpace set; str.strip() would also eat U+001C..U+001F.
GO_SPACE = gounicode.SPACE

_JOINERS = "-_./:"
_BMP_END = 0x10000

# For ASCII text one pass finds the trimmed tokens directly: a token starts
# and ends with a letter or digit, with identifier punctuation allowed inside.
_ASCII_TOKEN = re.compile(r"[a-z0-9](?:[a-z0-9_\-./:]*[a-z0-9])?")

# The same over text that has been through the BMP table and the non-BMP
# lookup, where a space is the only separator left.
_TOKEN = re.compile(r"[^ \-_./:](?:[^ ]*[^ \-_./:])?")
_NON_BMP = re.compile("[\U00010000-\U0010ffff]")


def _mapping(groups: tuple[tuple[int, int, int, int], ...]) -> dict[int, int]:
    return {r: r + delta for lo, hi, step, delta in groups for r in range(lo, hi + 1, step)}


@dataclass(frozen=True, slots=True)
class _Tables:
    lower: dict[int, int]  # Go's ToLower, ASCII included, for str.translate
    fold: dict[int, int]  # rune -> the member that stands for its fold orbit
    bmp: str  # index = code point < 0x10000 -> its lowercase, or " " if no token char
    starts: list[int]  # token-character ranges beyond the BMP, for bisect
    ends: list[int]


@cache
def _tables() -> _Tables:
    # Built on first use: ASCII-only work never pays the few milliseconds.
    ascii_upper = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
    lower = ascii_upper | _mapping(gounicode.TO_LOWER)
    fold = ascii_upper | _mapping(gounicode.FOLD)

    identity = array("I", range(_BMP_END)).tobytes().decode("utf-32-le", "surrogatepass")
    parts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    done = 0
    for lo, hi in gounicode.LETTER_OR_DIGIT:
        if hi >= _BMP_END:
            starts.append(max(lo, _BMP_END))
            ends.append(hi)
        if lo < _BMP_END:
            top = min(hi, _BMP_END - 1)
            parts += (" " * (lo - done), identity[lo : top + 1])
            done = top + 1
    parts.append(" " * (_BMP_END - done))
    bmp = list("".join(parts))
    for ch in _JOINERS:
        bmp[ord(ch)] = ch
    for r, low in lower.items():
        if r < _BMP_END and bmp[r] != " ":
            bmp[r] = chr(low)
    return _Tables(lower, fold, "".join(bmp), starts, ends)


@lru_cache(maxsize=4096)
def _non_bmp(ch: str) -> str:
    t = _tables()
    r = ord(ch)
    i = bisect_right(t.starts, r) - 1
    if i >= 0 and r <= t.ends[i]:
        return chr(t.lower.get(r, r))
    return " "


def _non_bmp_match(m: re.Match[str]) -> str:
    return _non_bmp(m.group())


def lower(s: str) -> str:
    """Go's per-character ``unicode.ToLower`` over the whole string."""
    if s.isascii():
        return s.lower()
    return s.translate(_tables().lower)


def tokenize(s: str) -> list[str]:
    if s.isascii():
        return _ASCII_TOKEN.findall(s.lower())
    # Characters beyond the table's end pass through translate unchanged.
    text = s.translate(_tables().bmp)
    if _NON_BMP.search(text):
        text = _NON_BMP.sub(_non_bmp_match, text)
    return _TOKEN.findall(text)


def fold(s: str) -> str:
    """Simple case folding, so that ``a == b`` iff Go's ``strings.EqualFold(a, b)``."""
    if s.isascii():
        return s.lower()
    return s.translate(_tables().fold)
