"""``eventlog_load.py``'s report: the table of each scenario's rows, the
with/without-watchers pairs and the targets, met or missed."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

# The baseline the work started from (appends/s with 0, 1, 2, 8 watchers), printed
# for comparison.
BASELINE = {0: 9_756, 1: 4_143, 2: 2_860, 8: 1_368}


# --- report -------------------------------------------------------------------------------


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def pairs(table_rows: list[dict[str, Any]], watchers: int) -> list[dict[str, float]]:
    """Each round's row with ``watchers`` against its own no-watcher row: the
    rate and the daemon's CPU per append, as ratios."""
    out = []
    by_round: dict[int, dict[int, dict[str, Any]]] = {}
    for r in table_rows:
        if "appends_per_s" in r:
            by_round.setdefault(r.get("round", 0), {})[r["watchers"]] = r
    for rows in by_round.values():
        if 0 in rows and watchers in rows:
            alone, watched = rows[0], rows[watchers]
            out.append({
                "rate": watched["appends_per_s"] / alone["appends_per_s"],
                "cpu": watched["daemon_cpu_us_per_append"] / alone["daemon_cpu_us_per_append"],
            })
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    rows = results.get("table", [])
    alone = [r["appends_per_s"] for r in rows if "appends_per_s" in r and r["watchers"] == 0]
    if alone:
        out.append({"target": f"{rows[0]['writers']} writers, no watcher: appends/s >= 25,000"
                              f" (median of {len(alone)})",
                    "value": statistics.median(alone), "bound": 25_000, "op": ">="})
    eight = pairs(rows, 8)
    if eight:
        n = f"median of {len(eight)} pair{'s' if len(eight) != 1 else ''}"
        out.append({"target": f"8 watchers: >= 80% of the no-watcher rate ({n})",
                    "value": 100 * statistics.median(p["rate"] for p in eight), "bound": 80,
                    "op": ">=", "unit": "%"})
        out.append({"target": f"8 watchers: daemon CPU per append <= 1.2x without ({n})",
                    "value": statistics.median(p["cpu"] for p in eight), "bound": 1.2,
                    "op": "<=", "unit": "x"})
    p99 = results.get("p99")
    if p99 and "append" in p99:
        w = p99["watchers"]
        out.append({"target": f"{p99['writers']} x {p99['inflight']} + {w} "
                              f"watcher{'s' if w != 1 else ''}: append p99 <= 50 ms",
                    "value": p99["append"]["p99_ms"], "bound": 50, "op": "<=", "unit": "ms"})
    cross = results.get("cross")
    if cross and cross.get("watcher_lag"):
        out.append({"target": "cross-process watch latency p50 <= 10 ms",
                    "value": cross["watcher_lag"]["p50_ms"], "bound": 10, "op": "<=",
                    "unit": "ms"})
    for t in out:
        v, b = t["value"], t["bound"]
        t["met"] = bool(v >= b if t["op"] == ">=" else v <= b)
    return out


def report(results: dict[str, Any], tgs: list[dict[str, Any]], a: argparse.Namespace) -> str:
    rows = [*results.get("table", [])]
    rows += [results[k] for k in ("p99", "burst") if k in results]
    bases = {r.get("round", 0): r.get("appends_per_s") for r in reversed(rows)
             if r["scenario"].startswith("table") and r["watchers"] == 0}
    head = ["scenario", "writers x in flight", "watchers", "appends/s", "% of no-watcher",
            "append p50 / p99 / max ms", "watcher lag p50 / p99 ms",
            "watchers done after last ack s", "daemon peak MiB",
            "CPU us/append daemon / writers / watchers", "exactly-once"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for r in rows:
        if "appends_per_s" not in r:
            lines.append(f"| {r['scenario']} | {r['writers']} x {r['inflight']} | "
                         f"{r['watchers']} | failed: {r.get('error', '?')} |")
            continue
        rel = "-"
        base = bases.get(r.get("round", 0))
        if base and r["scenario"].startswith("table"):
            rel = f"{100 * r['appends_per_s'] / base:.0f}%"
        lag = r["watcher_lag"]
        ap = r["append"]
        lines.append(
            "| " + " | ".join([
                r["scenario"],
                f"{r['writers']} x {r['inflight']}",
                str(r["watchers"]),
                f"{r['appends_per_s']:,.0f}",
                rel,
                f"{fmt_ms(ap['p50_ms'])} / {fmt_ms(ap['p99_ms'])} / {fmt_ms(ap['max_ms'])}",
                f"{fmt_ms(lag['p50_ms'])} / {fmt_ms(lag['p99_ms'])}" if lag else "-",
                "-" if r["watchers_done_after_last_ack_s"] is None
                else f"{r['watchers_done_after_last_ack_s']:.2f}",
                f"{r['daemon_peak_mib']:.0f}",
                f"{r['daemon_cpu_us_per_append']:.0f} / {r['clients_cpu_us_per_append']:.0f}"
                f" / {r['watchers_cpu_us_per_append']:.0f}",
                ("yes" if r["exactly_once_ok"] else "**NO**") if r["watchers"] else "-",
            ]) + " |"
        )
    out = ["\n".join(lines)]
    c = results.get("cross")
    if c:
        if c.get("watcher_lag"):
            lag = c["watcher_lag"]
            poll = a.watch_interval_ms if a.watch_interval_ms is not None else "default (200)"
            out.append(
                f"cross-process watch latency (append to daemon A, watcher on daemon B, poll "
                f"{poll} ms, {c['appends']} samples): p50 {fmt_ms(lag['p50_ms'])} ms, p99 "
                f"{fmt_ms(lag['p99_ms'])} ms, max {fmt_ms(lag['max_ms'])} ms; append ack p50 "
                f"{fmt_ms(c['append']['p50_ms'])} ms; exactly-once "
                f"{'yes' if c['exactly_once_ok'] else 'NO'}; peak MiB "
                f"{' / '.join(f'{m:.0f}' for m in c['daemon_peak_mib_each'])}"
            )
        else:
            out.append(f"cross-process: failed: {c.get('error', '?')}")
    t_lines = ["targets:"]
    for t in tgs:
        unit = t.get("unit", "")
        v = f"{t['value']:,.2f}" if unit == "x" else (
            f"{t['value']:,.1f}" if unit else f"{t['value']:,.0f}")
        t_lines.append(f"  {t['target']}: {v}{' ' + unit if unit else ''} "
                       f"{'met' if t['met'] else 'MISSED'}")
    out.append("\n".join(t_lines))
    if results.get("table"):
        out.append("baseline before the fan-out work (0/1/2/8 watchers): "
                   + " / ".join(f"{v:,}" for v in BASELINE.values()) + " appends/s")
    watched = [r for r in [*rows, *([c] if c else [])] if r.get("watchers")]
    bad = [r["scenario"] for r in watched if not r.get("exactly_once_ok", False)]
    if bad:
        out.append(f"EXACTLY-ONCE VIOLATED (or not checked: the run failed) in: {', '.join(bad)}")
    elif watched:
        out.append("exactly-once: every watcher received every acknowledged seq once, in order")
    notes = []
    for r in [*rows, *([c] if c else [])]:
        for n in r.get("notes", []):
            notes.append(f"  {r['scenario']}: {n}")
    if notes:
        out.append("notes:\n" + "\n".join(notes))
    return "\n\n".join(out)
