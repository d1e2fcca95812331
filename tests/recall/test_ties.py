"""Matches that tie on every numeric key are cut by the index's id ranks.

A search over many records that share one event time and one score orders
them by id, then stream order; it must do so without looking at the id of
every match (it runs on the event loop, in front of a deadline).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from streamd.recall.index import idorder
from streamd.recall.index.idorder import IdOrder


def brute_best(ids: list[str], recs: list[int], k: int) -> list[int]:
    return sorted(recs, key=lambda r: (ids[r], r))[:k]


def random_ids(rng: random.Random, n: int) -> list[str]:
    alphabet = ["a", "b", "B", "_", "é", "\x00", "9", "ab", "a\x00"]
    return ["".join(rng.choices(alphabet, k=rng.randint(0, 3))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_the_best_of_each_block_hold_the_best_of_all_however_the_ranks_grew(
    monkeypatch, seed
):
    monkeypatch.setattr(idorder, "BLOCK", 16)
    rng = random.Random(seed)
    ids = random_ids(rng, 100)
    order = IdOrder()
    # Ranked in uneven steps (prefixes published mid-block), as a build does.
    upto = 0
    while upto < len(ids):
        upto = min(len(ids), upto + rng.randint(1, 40))
        order.extend(ids[:upto])
        assert order.count == upto
        recs = sorted(rng.sample(range(upto), rng.randint(1, upto)))
        k = rng.randint(1, 6)
        kept = np.asarray(recs)[order.best(np.asarray(recs, dtype=np.int64), k)].tolist()
        assert len(kept) <= k * (-(-upto // 16))
        assert brute_best(ids, kept, k) == brute_best(ids, recs, k)


def test_ranks_after_a_truncation_are_those_of_the_records_that_replace_the_cut_ones(
    monkeypatch,
):
    monkeypatch.setattr(idorder, "BLOCK", 8)
    order = IdOrder()
    ids = [f"id-{i:02d}" for i in range(20)]
    order.extend(ids)
    # A failed pass added records 13..19; the next one reads other ids there.
    kept = ids[:13]
    order.truncate(kept)
    assert order.count == 13
    again = [*kept, "a", "b", "c", "d", "e"]
    order.extend(again)
    recs = np.arange(len(again), dtype=np.int64)
    best = recs[order.best(recs, 3)].tolist()
    assert brute_best(again, best, 3) == [13, 14, 15]


@pytest.mark.parametrize("seed", range(4))
def test_ranks_taken_from_each_new_batch_equal_those_read_back_from_the_ids(
    monkeypatch, seed
):
    monkeypatch.setattr(idorder, "BLOCK", 16)
    rng = random.Random(seed)
    ids = random_ids(rng, 120)
    whole, batched = IdOrder(), IdOrder()
    held: list[str] = []
    while len(held) < len(ids):
        new = ids[len(held) : len(held) + rng.randint(1, 40)]
        held.extend(new)
        if rng.random() < 0.3:
            # Records no batch brought (the plain path's, one by one) are
            # ranked at the next publish; later batches wait for it.
            continue
        batched.extend_new(held, new)
    batched.extend(held)  # what the publish does: ranks what is left
    whole.extend(ids)
    assert [b.tolist() for b in batched.block_ranks()] == [
        b.tolist() for b in whole.block_ranks()
    ]


class CountingIds(list):
    """An index's ids that count how many are looked at."""

    looked = 0

    def __getitem__(self, i):
        CountingIds.looked += 1
        return super().__getitem__(i)


def test_a_search_over_thousands_of_ties_looks_at_the_ids_of_a_few(recall_world, monkeypatch):
    monkeypatch.setattr(idorder, "BLOCK", 1024)
    w = recall_world
    rng = random.Random(7)
    ids = [f"evt-{rng.randrange(10**6)}" for _ in range(5000)]
    w.write("a.jsonl", *(w.rec(i, title="deploy") for i in ids[:3000]))
    adapter = w.adapter()
    w.current(adapter)
    w.append("a.jsonl", *(w.rec(i, title="deploy") for i in ids[3000:]))
    generation = w.current(adapter)  # ranks grown by a catch-up, not built at once
    index = generation.view.index
    monkeypatch.setattr(index, "ids", CountingIds(index.ids))
    CountingIds.looked = 0
    result = w.search(adapter, "deploy", limit=5)
    # Every match ties on exactness, score and time: id, then stream order.
    want = sorted(range(len(ids)), key=lambda r: (ids[r], r))[:5]
    assert [c["source_record_id"] for c in result["candidates"]] == [ids[r] for r in want]
    assert result["diagnostics"]["matched"] == 5000
    # The best five of each of the five blocks, and the five answered: not 5,000.
    assert CountingIds.looked <= 5 * 5 + 5 * 10
