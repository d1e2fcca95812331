"""Relevance: coverage x concentration, on the definition every Recall source shares.

The arithmetic mirrors the reference operation for operation; a different
order of the same float operations changes the last bit, and the transcripts
compare numbers exactly.
"""

from __future__ import annotations

CONCENTRATION_REFERENCE = 0.02


def relevance(matched: int, retained: int, hits: int, length: int) -> float:
    if retained <= 0 or length <= 0:
        return 1.0
    if matched <= 0 or hits <= 0:
        return 0.0
    coverage = min(matched / retained, 1.0)
    density = hits / length
    return coverage * (density / (density + CONCENTRATION_REFERENCE))


def relevance_over_counts(terms: list[str], counts: dict[str, int], length: int) -> float:
    """``counts`` maps each query term to its occurrences in the record,
    variants included."""
    covered = hits = 0
    for term in terms:
        n = counts.get(term, 0)
        if n > 0:
            covered += 1
            hits += n
    return relevance(covered, len(terms), hits, length)
