"""The queries ``run_bench.py`` times: a plan of query classes drawn from the
generated stream, their checks, and the search and expand loops."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen_stream  # noqa: E402
from bench_daemon import Daemon, deadline_in, rfc3339  # noqa: E402

SOURCE_ID = "bench"
DETAILS = ("summary", "excerpt", "full", "context")
CLASSES = (
    "exact_identifier",
    "rare_term",
    "common_term",
    "three_term",
    "window_browse",
    "as_of",
    "number_variant",
)


TEMPLATE_WORDS = {
    "task",
    "moved",
    "to",
    "created",
    "commented",
    "transitioned",
    "assigned",
    "posted",
    "in",
    "pr",
    "comment",
    "on",
    "see",
    "next",
    "todo",
    "progress",
    "done",
    "blocked",
    "review",
    "qa",
    "do",
    "event",
    "message",
    "tasks",
    "jira",
    "slack",
    "github",
    "opened",
    "merged",
    "closed",
    "reviewed",
    "updated",
}


class QueryPlan:
    """Queries per class, drawn from what the generator knows it wrote.

    - exact_identifier: a record id, a ref or a correlation value that exists
      (ids match one record, refs a handful);
    - rare_term: among the words with the fewest occurrences (1..a few dozen);
    - common_term: head words held by at least half the records;
    - three_term: one frequent (rank 10-200), one middling (200-5000) and one
      rare-ish (5000+) word;
    - window_browse: empty query, since/until window of 15 min .. 3 days;
    - as_of: a middling word (rank 20-500) with as_of between 10% and 90% of
      the stream's time span;
    - number_variant: a singular the stream never spells whose plural it does
      (found only through the number-variant rule).
    """

    def __init__(self, meta: dict, n: int, seed: int) -> None:
        self.rng = np.random.default_rng([seed, meta["records"], 0xBE])
        self.meta = meta
        self.vocab = gen_stream.Vocabulary.build(meta["seed"], meta["vocab_size"])
        self.counts = np.array(meta["word_counts"])
        self.n = n
        self.samples = [s for s in meta["samples"]]

    def _words(self, lo: int, hi: int, k: int) -> list[str]:
        idx = np.arange(lo, min(hi, len(self.vocab.words)))
        idx = idx[self.counts[idx] > 0]
        pick = self.rng.choice(idx, k, replace=len(idx) < k)
        return [self.vocab.words[i] for i in pick.tolist()]

    def exact_identifier(self) -> list[tuple[str, dict, dict]]:
        out = []
        order = self.rng.permutation(len(self.samples)).tolist()
        for j, si in enumerate(order[: self.n]):
            rid, _schema, system, ref, corr, _ns = self.samples[si]
            form = ("id", "ref", "correlation")[j % 3]
            # owner/repo#123 splits at '#' into two terms, so it is never exact.
            if form == "ref" and system == "github":
                form = "id"
            if form == "correlation" and (corr is None or "#" in corr):
                form = "id"
            value = {"id": rid, "ref": ref, "correlation": corr}[form]
            out.append((value, {}, {"form": form, "id": rid}))
        return out

    def rare_term(self) -> list[tuple[str, dict, dict]]:
        words = self.vocab.words
        ok = np.array(
            [self.counts[i] > 0 and words[i] not in TEMPLATE_WORDS for i in range(len(words))]
        )
        idx = np.nonzero(ok)[0]
        idx = idx[np.argsort(self.counts[idx], kind="stable")][: max(4 * self.n, 200)]
        pick = self.rng.choice(idx, min(self.n, len(idx)), replace=False)
        return [(words[i], {}, {"occurrences": int(self.counts[i])}) for i in pick.tolist()]

    def common_term(self) -> list[tuple[str, dict, dict]]:
        df = np.array(self.meta["top_df"]) / max(self.meta["records"], 1)
        heads = [
            self.vocab.words[i] for i in np.nonzero(df >= 0.5)[0].tolist()
        ] or self.vocab.words[:3]
        return [(heads[j % len(heads)], {}, {}) for j in range(self.n)]

    def three_term(self) -> list[tuple[str, dict, dict]]:
        a = self._words(10, 200, self.n)
        b = self._words(200, 5000, self.n)
        c = self._words(5000, 10**9, self.n)
        return [(f"{x} {y} {z}", {}, {}) for x, y, z in zip(a, b, c, strict=True)]

    def window_browse(self) -> list[tuple[str, dict, dict]]:
        lo, hi = self.meta["min_time_ns"], self.meta["max_time_ns"]
        span = max(hi - lo, 60 * 10**9)
        out = []
        for _ in range(self.n):
            width = int(np.exp(self.rng.uniform(np.log(900), np.log(3 * 86400))) * 1e9)
            width = min(width, span)
            start = lo + int(self.rng.uniform(0, span - width))
            f = {"since": rfc3339(start), "until": rfc3339(start + width)}
            out.append(("", f, {"width_s": width // 10**9}))
        return out

    def as_of(self) -> list[tuple[str, dict, dict]]:
        lo, hi = self.meta["min_time_ns"], self.meta["max_time_ns"]
        out = []
        for w in self._words(20, 500, self.n):
            at = lo + int(self.rng.uniform(0.1, 0.9) * (hi - lo))
            out.append((w, {}, {"as_of": rfc3339(at)}))
        return out

    def number_variant(self) -> list[tuple[str, dict, dict]]:
        index = {w: i for i, w in enumerate(self.vocab.words)}
        cands = sorted(
            s
            for s, p in self.vocab.plural_only.items()
            if self.counts[index[p]] > 0 and s not in TEMPLATE_WORDS
        )
        if not cands:
            return []
        pick = self.rng.choice(len(cands), min(self.n, len(cands)), replace=False)
        return [(cands[i], {}, {"plural": self.vocab.plural_only[cands[i]]}) for i in pick.tolist()]

    def locators(self, k: int) -> list[str]:
        order = self.rng.permutation(len(self.samples)).tolist()[:k]
        return [f"{SOURCE_ID}:v{self.samples[i][1]}/{self.samples[i][0]}" for i in order]


# -- measuring ---------------------------------------------------------------------


def summarize(ms: list[float]) -> dict:
    if not ms:
        return {"n": 0}
    a = np.array(ms)
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(a, 50)),
        "p95_ms": float(np.percentile(a, 95)),
        "mean_ms": float(a.mean()),
        "min_ms": float(a.min()),
        "max_ms": float(a.max()),
        "first_ms": float(a[0]),
    }


def search_params(query: str, filters: dict, extra: dict, limit: int, timeout: float) -> dict:
    p = {"query": query, "filters": filters, "limit": limit, "deadline": deadline_in(timeout)}
    if "as_of" in extra:
        p["as_of"] = extra["as_of"]
    return p


def check_search(cls: str, query: str, extra: dict, result: dict, indexed: int) -> str | None:
    """A cheap sanity check that a class asks what it claims to ask."""
    cands = result.get("candidates") or []
    diag = result.get("diagnostics") or {}
    matched = diag.get("matched")
    if cls == "exact_identifier":
        if not cands or "exact_identifier" not in (cands[0].get("match_signals") or []):
            return f"{query!r}: top candidate is not an exact identifier hit"
        if extra["form"] == "id" and cands[0].get("source_record_id") != extra["id"]:
            return f"{query!r}: top candidate is {cands[0].get('source_record_id')!r}"
    elif cls in ("rare_term", "number_variant", "three_term", "common_term") and not matched:
        return f"{query!r}: matched nothing"
    elif cls == "common_term" and matched is not None and matched < indexed // 2:
        return f"{query!r}: matched {matched} of {indexed}, not most records"
    return None


def run_searches(d: Daemon, cls: str, queries, cfg, indexed: int) -> dict:
    times, matched, elapsed, outcomes, errors, checks = [], [], [], {}, [], []
    outside: list[float] = []  # wall time the daemon's elapsed_ms does not cover
    started = time.perf_counter()
    budget_limited = False
    for k, (query, filters, extra) in enumerate(queries):
        if k >= 5 and time.perf_counter() - started > cfg.class_budget:
            budget_limited = True
            break
        msg, dt = d.call(
            "recall/search",
            search_params(query, filters, extra, cfg.limit, cfg.search_timeout),
            cfg.search_timeout,
        )
        times.append(dt * 1e3)
        if "error" in msg:
            errors.append(f"{query!r}: {msg['error']}")
            continue
        res = msg["result"]
        diag = res.get("diagnostics") or {}
        if diag.get("matched") is not None:
            matched.append(diag["matched"])
        if diag.get("elapsed_ms") is not None:
            elapsed.append(diag["elapsed_ms"])
            outside.append(dt * 1e3 - diag["elapsed_ms"])
        outcomes[res.get("outcome", "?")] = outcomes.get(res.get("outcome", "?"), 0) + 1
        problem = check_search(cls, query, extra, res, indexed)
        if problem:
            checks.append(problem)
    out = summarize(times)
    out.update(
        {
            "planned": len(queries),
            "budget_limited": budget_limited,
            "matched_median": statistics.median(matched) if matched else None,
            "matched_min": min(matched) if matched else None,
            "matched_max": max(matched) if matched else None,
            "daemon_elapsed_ms_median": statistics.median(elapsed) if elapsed else None,
            "outside_elapsed_ms_median": statistics.median(outside) if outside else None,
            "outcomes": outcomes,
            "errors": len(errors),
            "error_samples": errors[:5],
            "check_failures": len(checks),
            "check_samples": checks[:5],
            "example_query": queries[0][0] if queries else None,
        }
    )
    return out


def run_expands(d: Daemon, detail: str, locators: list[str], cfg) -> dict:
    times, errors, sizes, truncated = [], [], [], 0
    started = time.perf_counter()
    budget_limited = False
    for k, loc in enumerate(locators):
        if k >= 5 and time.perf_counter() - started > cfg.class_budget:
            budget_limited = True
            break
        params = {
            "locator": loc,
            "detail": detail,
            "budget_bytes": cfg.budget_bytes,
            "deadline": deadline_in(cfg.search_timeout),
        }
        msg, dt = d.call("recall/expand", params, cfg.search_timeout)
        times.append(dt * 1e3)
        if "error" in msg:
            errors.append(f"{loc}: {msg['error']}")
            continue
        res = msg["result"]
        sizes.append(len(json.dumps(res)))
        truncated += bool(res.get("truncated"))
    out = summarize(times)
    out.update(
        {
            "planned": len(locators),
            "budget_limited": budget_limited,
            "errors": len(errors),
            "error_samples": errors[:5],
            "truncated": truncated,
            "answer_bytes_median": statistics.median(sizes) if sizes else None,
        }
    )
    return out
