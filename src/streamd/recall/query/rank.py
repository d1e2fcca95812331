"""Ranking within one generation: which records match, in what order.

The order is the reference's: exact-identifier hits first (a partition, not
a bonus), then local score descending, then event time newest first (to the
nanosecond), then id in byte order, then stream order. local_score is the
mean over the query's terms, duplicates kept, of each term's weight in the
record (its strongest field), or half the best number variant's weight when
the source spells the term nowhere.

A search touches only the postings of its terms and variants. Only the top
``limit`` matches are fully ordered: the rest are cut by partitioning on the
sort keys in priority order, the id by the index's ranks of ids (``idorder``),
which keeps a term held by most records cheap, even when they all tie.

That is the plain path (``rank_plain``): the definition of every answer,
and the oracle of the compiled one (``compiled``), which ``rank`` takes
where the compiled core is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streamd.golang.gotime import NS
from streamd.recall.index import native
from streamd.recall.index.index import View
from streamd.recall.query import compiled
from streamd.recall.query import variants as numvar
from streamd.recall.query.relevance import relevance_over_counts
from streamd.recall.stop import Stop, check
from streamd.recall.tokenize import tokenize

# Below this many matches a plain Python sort is cheaper than partitioning.
_SMALL = 2048
# With at least one candidate per this many records, scoring walks a dense
# array of all records instead of merging sorted postings.
_DENSE_RATIO = 32


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    since: int | None = None
    until: int | None = None
    as_of: int | None = None
    record_types: tuple[str, ...] = ()
    # Records a source has taken back (the event log's deleted events), True
    # by record number; records past its end are kept. Never matched.
    removed: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    rec: int
    score: float
    exact: bool


@dataclass(slots=True)
class Ranked:
    terms: list[str]
    variants: dict[str, list[str]]
    hits: list[Hit]
    matched: int
    any_exact: bool
    # Each hit's relevance, in hit order, once ``with_relevances`` has run.
    relevances: list[float] | None = None


def _window_mask(view: View, recs: np.ndarray | None, q: Query) -> np.ndarray | None:
    """Which of ``recs`` (all records when None) pass the time and type filters."""
    sec, nsec = view.columns()
    if recs is not None:
        sec, nsec = sec[recs], nsec[recs]
    mask: np.ndarray | None = None

    def both(m: np.ndarray) -> None:
        nonlocal mask
        mask = m if mask is None else mask & m

    upper = min((t for t in (q.as_of, q.until) if t is not None), default=None)
    if upper is not None:
        us, un = divmod(upper, NS)
        both((sec < us) | ((sec == us) & (nsec <= un)))
    if q.since is not None:
        ls, ln = divmod(q.since, NS)
        both((sec > ls) | ((sec == ls) & (nsec >= ln)))
    if q.record_types:
        codes = [i for i, k in enumerate(view.index.kinds) if k in q.record_types]
        kinds = view.rows()["kind"]
        if recs is not None:
            kinds = kinds[recs]
        both(np.isin(kinds, codes))
    if q.removed is not None and q.removed.any():
        gone = np.zeros(view.n, dtype=bool)
        upto = min(view.n, len(q.removed))
        gone[:upto] = q.removed[:upto]
        both(~(gone if recs is None else gone[recs]))
    return mask


def _term_weights(view: View, term: str, resolved: dict[str, list[str]]):
    """(recs, weights) of one query term: its own postings, or the best
    variant at half weight."""
    own = view.postings(term)
    if own is not None:
        return own.recs, own.weights
    found = [p for v in resolved.get(term, ()) if (p := view.postings(v)) is not None]
    if not found:
        return None
    if len(found) == 1:
        return found[0].recs, found[0].weights * numvar.NUMBER_VARIANT_WEIGHT
    recs = np.concatenate([p.recs for p in found])
    weights = np.concatenate([p.weights * numvar.NUMBER_VARIANT_WEIGHT for p in found])
    uniq, inverse = np.unique(recs, return_inverse=True)
    best = np.zeros(len(uniq))
    np.maximum.at(best, inverse, weights)
    return uniq, best


def rank(view: View, q: Query, limit: int, stop: Stop | None = None) -> Ranked:
    """The best ``limit`` matches of ``q``, ordered; by the compiled core
    where it is built (``compiled``), else by the plain path below, which
    defines the answer. Raises ``Stopped`` once ``stop`` is set."""
    view.keep_mapped_within_budget()
    core = native.search_core()
    if core is None:
        return rank_plain(view, q, limit, stop)
    limit = _within(view, limit)
    terms = tokenize(q.text)
    resolved = numvar.resolve(terms, view.holds, stop)
    exact = _exact(view, terms, stop)
    upper = min((t for t in (q.as_of, q.until) if t is not None), default=None)
    recs, scores, is_exact, matched, any_exact = compiled.candidates(
        core, view, terms, resolved, exact, q.since, upper, q.record_types, q.removed, limit,
        stop)
    sec, nsec = view.columns()
    hits = _sorted_hits(view, recs, scores, is_exact, sec[recs].tolist(), nsec[recs].tolist(),
                        limit)
    return Ranked(terms, resolved, hits, matched, any_exact)


def _within(view: View, limit: int) -> int:
    """``limit``, or the number of records when that is less: no more can
    be kept, and the compiled core reserves room for ``limit`` hits (a
    ``max_candidates`` of a billion must not take 40 GB)."""
    return max(0, min(limit, view.n))


def _exact(view: View, terms: list[str], stop: Stop | None) -> set[int]:
    exact: set[int] = set()
    for t in set(terms):
        check(stop)
        exact |= view.exact_hits(t)
    return exact


def rank_plain(view: View, q: Query, limit: int, stop: Stop | None = None) -> Ranked:
    """``rank`` in numpy: the definition (see the module's rules)."""
    limit = _within(view, limit)
    terms = tokenize(q.text)
    resolved = numvar.resolve(terms, view.holds, stop)
    if not terms:
        return _browse(view, q, limit, terms, resolved, stop)

    per_term = {}
    for t in set(terms):
        check(stop)
        per_term[t] = _term_weights(view, t, resolved)
    exact = _exact(view, terms, stop)
    parts = [pw[0] for pw in per_term.values() if pw is not None]
    exact_recs = np.fromiter(sorted(exact), dtype=np.int64, count=len(exact))
    if exact:
        parts.append(exact_recs)
    if not parts:
        return Ranked(terms, resolved, [], 0, False)
    total = sum(len(p) for p in parts)
    # Query order, duplicates included: the same additions in the same order
    # as the reference, so the last bit agrees.
    weighted = [per_term[t] for t in terms if per_term[t] is not None]
    if total * _DENSE_RATIO >= view.n:
        # Many candidates: accumulate over a dense array of every record.
        seen = np.zeros(view.n, dtype=bool)
        for p in parts:
            seen[p] = True
        recs = np.flatnonzero(seen)
        dense = np.zeros(view.n)
        for term_recs, weights in weighted:
            check(stop)
            dense[term_recs] += weights
        sums = dense[recs]
        is_exact = np.zeros(view.n, dtype=bool)
        is_exact[exact_recs] = True
        is_exact = is_exact[recs]
    else:
        # Postings are sorted and unique per term: one part needs no union.
        recs = parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))
        sums = np.zeros(len(recs))
        for term_recs, weights in weighted:
            check(stop)
            sums[np.searchsorted(recs, term_recs)] += weights
        is_exact = np.isin(recs, exact_recs) if exact else np.zeros(len(recs), dtype=bool)
    scores = sums / len(terms)
    mask = _window_mask(view, recs, q)
    if mask is not None:
        recs, scores, is_exact = recs[mask], scores[mask], is_exact[mask]
    return _order(view, terms, resolved, recs, scores, is_exact, limit)


def _browse(view: View, q: Query, limit: int, terms, resolved, stop: Stop | None) -> Ranked:
    check(stop)
    mask = _window_mask(view, None, q)
    recs = np.arange(view.n, dtype=np.int64) if mask is None else np.flatnonzero(mask)
    zeros = np.zeros(len(recs))
    return _order(view, terms, resolved, recs, zeros, np.zeros(len(recs), dtype=bool), limit)


def _top(keys: list[np.ndarray], k: int, idx: np.ndarray,
         last: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """Positions holding the k best rows under lexicographic ``keys`` (larger
    is better), plus rows tied with the k-th on every key that ``last`` (given
    the ascending positions still tied and how many of them are wanted)
    keeps: it must keep the best of them, and may keep more."""
    if len(idx) <= k:
        return idx
    if not keys:
        return last(idx, k)
    col = keys[0][idx]
    kth = np.partition(col, len(col) - k)[len(col) - k]
    better = idx[col > kth]
    tied = idx[col == kth]  # still ascending
    return np.concatenate([better, _top(keys[1:], k - len(better), tied, last)])


def _order(view: View, terms, resolved, recs, scores, is_exact, limit: int) -> Ranked:
    matched = len(recs)
    any_exact = bool(is_exact.any()) if matched else False
    sec, nsec = view.columns()
    rsec, rnsec = sec[recs], nsec[recs]
    pick = np.arange(matched)
    if matched > max(limit, _SMALL):
        # Rows tied on every numeric key are cut by id with the index's id
        # ranks, not by sorting them all here (see ``idorder``).
        def by_id(tied: np.ndarray, k: int) -> np.ndarray:
            return tied[view.index.id_order.best(recs[tied], k)]

        pick = _top([is_exact.astype(np.int8), scores, rsec, rnsec], limit, pick, by_id)
    picked = pick.tolist()
    hits = _sorted_hits(
        view, recs[picked].tolist(), scores[picked].tolist(), is_exact[picked].tolist(),
        rsec[picked].tolist(), rnsec[picked].tolist(), limit)
    return Ranked(terms, resolved, hits, matched, any_exact)


def _sorted_hits(view: View, recs: list[int], scores: list[float], is_exact: list[bool],
                 sec: list[int], nsec: list[int], limit: int) -> list[Hit]:
    """The best ``limit`` of a few candidates, in the full order (ids
    compared as strings: code points, the reference's byte order)."""
    ids = view.index.ids
    rows = sorted(
        zip((not e for e in is_exact), (-s for s in scores), (-s for s in sec),
            (-n for n in nsec), (ids[r] for r in recs), recs, strict=True)
    )
    return [Hit(rec=row[5], score=-row[1], exact=not row[0]) for row in rows[:limit]]


def with_relevances(view: View, ranked: Ranked, stop: Stop | None = None) -> Ranked:
    """``ranked`` with its hits' ``relevances``: a query of many distinct
    terms costs a lookup of each in the segments holding the hits, so this
    is work for the same thread as the ranking, stopped as it is."""
    ranked.relevances = relevances(view, [h.rec for h in ranked.hits], ranked.terms,
                                   ranked.variants, stop)
    return ranked


def relevances(view: View, recs: list[int], terms: list[str],
               resolved: dict[str, list[str]], stop: Stop | None = None) -> list[float]:
    """The relevance of each record of ``recs`` to the query's terms."""
    order = sorted(range(len(recs)), key=recs.__getitem__)
    ascending = [recs[i] for i in order]
    per_term: dict[str, list[int]] = {}
    for t in set(terms):
        check(stop)
        total = view.counts(t, ascending)
        for v in resolved.get(t, ()):
            total = [a + b for a, b in zip(total, view.counts(v, ascending), strict=True)]
        per_term[t] = total
    out = [0.0] * len(recs)
    for k, i in enumerate(order):
        check(stop)
        counts = {t: c[k] for t, c in per_term.items()}
        out[i] = relevance_over_counts(terms, counts, view.index.column("length", recs[i]))
    return out


def query_mode(terms: list[str], any_exact: bool) -> str:
    if any_exact:
        return "exact"
    return "lexical" if terms else "temporal"
