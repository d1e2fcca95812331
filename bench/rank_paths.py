#!/usr/bin/env python3
"""The two ranking paths side by side, in process, on the bench's queries.

    python bench/rank_paths.py STREAM.jsonl [--workdir DIR] [--queries 30] [--limit 10]

STREAM.jsonl is a stream ``gen_stream.py`` wrote (its ``.meta.json`` beside
it picks the queries, class by class, as ``run_bench.py`` does). The index is
built once (or resumed from ``--workdir``); then every query is ranked by
the plain path (``query/rank.py``, numpy: the definition) and by the compiled
core (``native/src/rank.rs``), alternately, and their answers are compared
hit for hit, score bit for bit. Prints p50 per class for both, and the
ratio; any disagreement is printed and fails the run. Nothing is asserted
about speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import query_plan  # noqa: E402

from streamd.golang import gotime  # noqa: E402
from streamd.recall import oneshot  # noqa: E402
from streamd.recall.query import rank as ranking  # noqa: E402


def _query(text: str, filters: dict) -> ranking.Query:
    def at(key: str) -> int | None:
        v = filters.get(key)
        return None if v is None else gotime.parse(v)

    return ranking.Query(text, since=at("since"), until=at("until"), as_of=at("as_of"))


def _answer(r: ranking.Ranked) -> tuple:
    return [(h.rec, h.score, h.exact) for h in r.hits], r.matched, r.any_exact


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stream")
    ap.add_argument("--workdir", help="keep the index here (default: a temporary directory)")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    cfg = ap.parse_args()
    meta = json.loads(Path(cfg.stream + ".meta.json").read_text())
    plan = query_plan.QueryPlan(meta, cfg.queries, cfg.seed)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        _, generation = oneshot.open_adapter([cfg.stream], cfg.workdir or tmp)
        view = generation.view
        print(f"{view.n:,} records, index ready in {time.perf_counter() - t:.1f} s")
        print(f"{'class':<18} {'plain p50 ms':>13} {'compiled p50 ms':>16} {'ratio':>7}")
        bad = 0
        for cls in query_plan.CLASSES:
            plain, compiled = [], []
            for text, filters, _ in getattr(plan, cls)():
                q = _query(text, filters)
                t0 = time.perf_counter()
                a = ranking.rank_plain(view, q, cfg.limit)
                t1 = time.perf_counter()
                b = ranking.rank(view, q, cfg.limit)
                t2 = time.perf_counter()
                plain.append((t1 - t0) * 1e3)
                compiled.append((t2 - t1) * 1e3)
                if _answer(a) != _answer(b):
                    bad += 1
                    print(f"  DISAGREE on {text!r} {filters}", file=sys.stderr)
            if plain:
                p, c = statistics.median(plain), statistics.median(compiled)
                print(f"{cls:<18} {p:>13.2f} {c:>16.2f} {p / c:>6.1f}x")
        print("answers agree" if not bad else f"{bad} answers disagree")
        return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
