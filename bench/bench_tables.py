"""``run_bench.py``'s tables: streamd's rows at each size, and the ratios to
the reference adapter's run."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from query_plan import CLASSES, DETAILS  # noqa: E402

APPEND_RECORDS = 1000
"""Records appended for each catch-up step (the scenario's and the tables')."""

# The targets, at 1,000,000 records on the 2-core bench machine.
TARGETS = {
    "index_mb_s": ">= 52",
    "search.exact_identifier": "p50 <= 10",
    "search.rare_term": "p50 <= 10",
    "search.common_term": "p50 <= 40",
    "search.three_term": "p50 <= 20",
    "search.window_browse": "p50 <= 100",
    "catchup_refresh_ms": "<= 15",
    "restart_first_answer_ms": "<= 1000",
    "peak_rss_mb": "<= 500",
    "peak_tree_pss_mb": "<= 400",
}


def _ms(v) -> str:
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}"
    if v < 100:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def _get(d: dict, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def size_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def table(results: dict, key: str = "scenarios", title: str = "streamd") -> str:
    scen = results[key]
    rows: list[tuple[str, list[str], str]] = []

    def row(label, fn, target=""):
        cells = []
        for s in scen:
            try:
                cells.append(fn(s))
            except (TypeError, KeyError, ValueError):
                cells.append("-")
        rows.append((label, cells, target))

    def pp(*path):
        def f(s):
            r = _get(s, *path)
            if not r or not r.get("n"):
                return "-"
            mark = "*" if r.get("budget_limited") else ""
            return f"{_ms(r['p50_ms'])} / {_ms(r['p95_ms'])}{mark}"

        return f

    row("stream MB", lambda s: f"{s['bytes'] / 1e6:,.1f}")
    row("startup: spawn -> initialized ms", lambda s: _ms(s["startup"]["spawn_to_initialized_ms"]))
    row("full index s", lambda s: f"{s['index']['seconds']:.2f}")
    row("full index MB/s", lambda s: f"{s['index']['mb_per_s']:.1f}", TARGETS["index_mb_s"])
    row("full index records/s", lambda s: f"{s['index']['records_per_s']:,.0f}")
    row("RSS after index MB", lambda s: f"{s['index']['rss_after_mb']:,.0f}")
    row("first search after index ms", lambda s: _ms(s["first_search_ms"]))
    for cls in CLASSES:
        row(f"search {cls} p50 / p95 ms", pp("search", cls), TARGETS.get(f"search.{cls}", ""))
    for detail in DETAILS:
        row(f"expand {detail} p50 / p95 ms", pp("expand", detail))
    row("health, nothing new, p50 / p95 ms", pp("health_nochange"))
    row(
        f"catch-up {APPEND_RECORDS} appended: refresh ms",
        lambda s: _ms(s["catchup"]["refresh_ms_median"]),
        TARGETS["catchup_refresh_ms"],
    )
    row(
        f"catch-up {APPEND_RECORDS} appended: search ms",
        lambda s: _ms(s["catchup"]["search_ms_median"]),
    )
    row(
        "restart: spawn -> first answer ms (median)",
        lambda s: _ms(s["restart"]["spawn_to_first_answer_ms_median"]),
        TARGETS["restart_first_answer_ms"],
    )
    row(
        "  each restart, in order",
        lambda s: " / ".join(_ms(r["spawn_to_first_answer_ms"]) for r in s["restart"]["runs"]),
    )
    row("restart: peak RSS MB", lambda s: f"{s['restart']['peak_rss_mb_max']:,.0f}")
    row(
        "restart: peak PSS with workers MB",
        lambda s: f"{s['restart']['peak_tree_pss_mb_max']:,.0f}",
    )
    row("peak RSS, daemon process MB", lambda s: f"{s['peak_rss_mb']:,.0f}", TARGETS["peak_rss_mb"])
    row(
        "  RSS at the end: anonymous / mapped files MB",
        lambda s: f"{s.get('rss_anon_mb', 0):,.0f} / {s.get('rss_file_mb', 0):,.0f}",
    )
    row("peak PSS, daemon + workers MB", lambda s: f"{s['peak_tree_pss_mb']:,.0f}",
        TARGETS["peak_tree_pss_mb"])
    row("peak RSS sum, daemon + workers MB", lambda s: f"{s['peak_tree_rss_mb']:,.0f}")
    row("worker processes seen (max)", lambda s: str(s["max_worker_processes"]))
    row("workdir MB", lambda s: f"{s['workdir_mb']:,.1f}")
    row("daemon CPU s (first process)", lambda s: f"{s['daemon_cpu_s']:.1f}")
    row("  + its worker processes' CPU s", lambda s: f"{s['workers_cpu_s']:.1f}")
    rows.append(("matched records per query (median)", ["" for _ in scen], ""))
    for cls in CLASSES:
        row(f"  {cls}", lambda s, c=cls: f"{s['search'][c]['matched_median']:,.0f}")

    head = ["", *[size_label(s["records"]) for s in scen], "target @1M"]
    w0 = max(len(r[0]) for r in rows)
    wc = [max([len(head[i + 1])] + [len(r[1][i]) for r in rows]) for i in range(len(scen))]
    lines = []
    m = results["machine"]
    lines.append(
        f"{title} bench {m['date']}  {m['cores_logical']} cores {m['cpu_model']}  "
        f"Python {m['python']}  streamd {m['versions']['recall-streamd']} "
        f"({m['git_commit']}{'+dirty src' if m['git_src_dirty'] else ''})"
    )
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, wc, strict=True))  # noqa: E731
    lines.append(f"{head[0]:<{w0}}  {fmt(head[1:-1])}  {head[-1]}")
    for label, cells, target in rows:
        lines.append(f"{label:<{w0}}  {fmt(cells)}  {target}".rstrip())
    lines.append("(* = the class hit its time budget before running every planned query)")
    return "\n".join(lines)


def comparison(results: dict) -> str:
    """streamd against the reference, size by size, from the same run."""
    lines = ["streamd vs reference (same run, same stream): streamd / reference, and the ratio"]

    def pair(label, fn, better_high=False):
        cells = []
        for s, r in zip(results["scenarios"], results["reference"], strict=True):
            try:
                a, b = fn(s), fn(r)
                ratio = (a / b) if better_high else (b / a)
                cells.append(f"{size_label(s['records'])}: {a:,.1f} / {b:,.1f} ({ratio:,.1f}x)")
            except (TypeError, KeyError, ValueError, ZeroDivisionError):
                cells.append(f"{size_label(s['records'])}: -")
        lines.append(f"  {label:<38} " + "   ".join(cells))

    pair("full index MB/s", lambda s: s["index"]["mb_per_s"], better_high=True)
    pair(f"catch-up {APPEND_RECORDS}: refresh ms", lambda s: s["catchup"]["refresh_ms_median"])
    for cls in CLASSES:
        pair(f"search {cls} p50 ms", lambda s, c=cls: s["search"][c]["p50_ms"])
    pair("restart: spawn -> first answer ms",
         lambda s: s["restart"]["spawn_to_first_answer_ms_median"])
    pair("peak PSS, adapter + workers MB", lambda s: s["peak_tree_pss_mb"])
    lines.append("  (ratio: how many times better streamd is; below 1 means worse)")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------
