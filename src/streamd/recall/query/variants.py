"""Number variants: a query term the source never spells may match its
plural or singular at half weight.

Generation, not stemming: candidate spellings are derived from the query term
and each is kept only if the source's own vocabulary holds it. Only the
regular English rules are here (-s, -es after a sibilant, -y/-ies), with the
reference's guards: three-character minimum, a six-byte minimum for reading
-ies as -y, no stripping of -ss/-is/-us, and two known non-plurals.
"""

from __future__ import annotations

from collections.abc import Callable

from streamd.recall.stop import Stop, check

NUMBER_VARIANT_WEIGHT = 0.5
_MIN_CHARS = 3
_MIN_IES_BYTES = 6
_NON_PLURAL = frozenset({"lens", "news"})
_SIBILANT = ("s", "x", "z", "ch", "sh")


def number_variants(term: str) -> list[str]:
    if len(term) < _MIN_CHARS:
        return []
    out: list[str] = []

    def add(v: str) -> None:
        if v and v != term and len(v) >= _MIN_CHARS and v not in out:
            out.append(v)

    # Read as a singular: how a corpus would spell more than one.
    if term.endswith(_SIBILANT):
        add(term + "es")
    elif term.endswith("y") and not (len(term) >= 2 and term[-2] in "aeiou"):
        add(term[:-1] + "ies")
    else:
        add(term + "s")

    # Read as a plural: the singular it came from.
    if term.endswith("ies") and len(term.encode()) >= _MIN_IES_BYTES:
        add(term[:-3] + "y")
        add(term[:-1])
    elif term.endswith("es") and term[:-2].endswith(_SIBILANT):
        add(term[:-2])
        add(term[:-1])
    elif (
        term.endswith("s")
        and not term.endswith(("ss", "is", "us"))
        and term not in _NON_PLURAL
    ):
        add(term[:-1])
    return out


def resolve(terms: list[str], holds: Callable[[str], bool],
            stop: Stop | None = None) -> dict[str, list[str]]:
    """Variants for the terms the source does not hold under their own spelling.

    ``holds`` must be source-wide: asking per record would admit every record
    that spells a word the other way beside those that spell it the caller's.
    """
    out: dict[str, list[str]] = {}
    probed: set[str] = set()
    for term in terms:
        if term in probed:
            continue
        check(stop)
        probed.add(term)
        if holds(term):
            continue
        found = [v for v in number_variants(term) if holds(v)]
        if found:
            out[term] = found
    return out
