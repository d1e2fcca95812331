"""The fast paths of ranking agree with the plain ones.

Scoring has two strategies (merging sorted postings, or accumulating over a
dense array of every record) and ordering two more (a full sort, or
partitioning on the sort keys first); which one runs depends on how many
records match. Forcing each and comparing whole result lists pins them to
the same answers, ties and float bits included.
"""

from __future__ import annotations

import random

import pytest

from streamd.recall.query import rank as search

VOCAB = [f"w{i}" for i in range(40)] + ["cats", "cat", "boxes", "city", "cities"]


def stream(world, n: int, seed: int) -> None:
    rnd = random.Random(seed)
    lines = []
    for i in range(n):
        words = rnd.choices(VOCAB, weights=[1 / (k + 1) for k in range(len(VOCAB))], k=8)
        lines.append(world.rec(
            f"r{i % (n - 7)}", f"2026-05-02T10:{rnd.randrange(3):02d}:00Z",
            title=" ".join(words[:2]), text=" ".join(words[2:]),
            ref=f"REF-{rnd.randrange(30)}", correlation=f"c{rnd.randrange(5)}",
        ))
    world.write("a.jsonl", *lines)


QUERIES = ["w0", "w1 w2", "w3 w3 w39", "cat", "boxes", "ref-7", "c3 w5", "w0 w1 w2 w3", "nothing",
           "city", "r12"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dense_sparse_and_partitioned_paths_rank_identically(recall_world, monkeypatch, seed):
    w = recall_world
    stream(w, 3000, seed)
    adapter = w.adapter()

    def run(dense_ratio: int, small: int, limit: int):
        monkeypatch.setattr(search, "_DENSE_RATIO", dense_ratio)
        monkeypatch.setattr(search, "_SMALL", small)
        out = []
        for q in QUERIES:
            r = w.search(adapter, q, limit=limit)
            out.append((r["diagnostics"]["matched"],
                        [(c["candidate_id"], c["local_score"], c["relevance"], c["metadata"]
                          ["byte_offset"]) for c in r["candidates"]]))
        return out

    for limit in (3, 50):
        plain = run(0, 10**9, limit)  # merged postings, full sort
        assert run(10**9, 10**9, limit) == plain  # dense accumulation
        assert run(0, 0, limit) == plain  # partitioned top-k
        assert run(10**9, 0, limit) == plain
