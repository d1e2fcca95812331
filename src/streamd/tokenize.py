"""The reference tokenizer: identifier runs, lowercased.

A token is a run of Unicode letters, decimal digits and ``- _ . / :``, with
those five trimmed from its ends, so ``td-f62256`` and
``C0RECALL/1746177600.000200`` survive whole and can be compared to a
record's ids. Lowercasing is per character (Go's simple mapping), which is
not what ``str.lower`` does for ``İ`` or a final sigma.
"""

from __future__ import annotations

import re
from functools import lru_cache

# \w is a superset of what the reference keeps (it also admits numeric
# characters such as ² or ½); non-ASCII runs are refined below.
_RUN = re.compile(r"[\w\-./:]+")
_TRIM = "-_./:"

# Go's unicode.IsSpace set; str.strip() would also eat U+001C..U+001F.
GO_SPACE = (
    " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


@lru_cache(maxsize=4096)
def _lower_char(ch: str) -> str:
    low = ch.lower()
    if len(low) == 1:
        return low
    # Only U+0130 lowercases to two characters; Go's simple mapping gives "i".
    return "i" if ch == "\u0130" else ch


def lower(s: str) -> str:
    if s.isascii():
        return s.lower()
    return "".join(map(_lower_char, s))


def _keeps(ch: str) -> bool:
    return ch.isalpha() or ch.isdecimal() or ch in _TRIM


def _refine(run: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    for ch in run:
        if ch.isascii() or _keeps(ch):
            current.append(ch)
        elif current:
            parts.append("".join(current))
            current = []
    if current:
        parts.append("".join(current))
    return parts


# For ASCII text one pass finds the trimmed tokens directly: a token starts
# and ends with a letter or digit, with identifier punctuation allowed inside.
_ASCII_TOKEN = re.compile(r"[a-z0-9](?:[a-z0-9_\-./:]*[a-z0-9])?")


def tokenize(s: str) -> list[str]:
    if s.isascii():
        return _ASCII_TOKEN.findall(s.lower())
    out: list[str] = []
    for run in _RUN.findall(lower(s)):
        if run.isascii():
            token = run.strip(_TRIM)
            if token:
                out.append(token)
            continue
        for part in _refine(run):
            token = part.strip(_TRIM)
            if token:
                out.append(token)
    return out


@lru_cache(maxsize=4096)
def _fold_char(ch: str) -> str:
    up = ch.upper()
    if len(up) != 1:
        return ch.lower() if len(ch.lower()) == 1 else ch
    low = up.lower()
    if len(low) != 1 or ch == "\u0131":
        # Dotless i and dotted capital I stand alone under simple folding.
        return ch
    return low


def fold(s: str) -> str:
    """Simple case folding, so that ``a == b`` iff Go's ``strings.EqualFold(a, b)``."""
    if s.isascii():
        return s.lower()
    return "".join(map(_fold_char, s))
