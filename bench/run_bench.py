#!/usr/bin/env python3
"""Bench streamd the way a Recall core sees it: a subprocess over JSON-RPC.

    python bench/run_bench.py [--quick] [--sizes 10000,100000,1000000]
                              [--out bench/results/latest.json] [--reference PATH]

For every size it generates (or reuses) a deterministic stream with
``gen_stream.py``, copies it into a fresh run directory beside an empty
workdir, starts ``python -m streamd`` on pipes and measures, in this order:

1. startup: spawn until ``recall/initialize`` answers;
2. full index: the first ``recall/refresh {full: false}`` on the cold
   workdir, as seconds and MB/s, with the daemon's peak RSS meanwhile;
3. search latency per query class (see ``QueryPlan``), p50/p95, plus how
   many records each class matched so the classes can be told apart;
4. expand latency per detail level;
5. health with nothing to catch up (the per-request freshness check);
6. incremental catch-up: append 1,000 records, time ``recall/refresh``;
   append 1,000 more, time a search for the newest id (catch-up on search);
7. restart: shut down, start a new process on the same (warm) workdir and
   time spawn -> initialize -> first answered search;
8. peak RSS: sampled with psutil, and ``VmHWM`` from /proc at the end.

With ``--reference PATH`` (the Go reference adapter, ``recall-stream``) every
size is run a second time against that binary, on its own copy of the same
stream, right after streamd's run: the two tables and the ratios between
them come from one run on one machine.

Every request carries a deadline and the driver waits on the pipe with a
timeout, so a hung daemon fails the bench instead of hanging it. The bench
talks to the process over pipes only; it never imports streamd. Nothing here
asserts a speed: numbers go to stdout and to a JSON file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import gen_stream  # noqa: E402
from bench_daemon import BenchError, Daemon, deadline_in, machine_facts  # noqa: E402
from bench_tables import APPEND_RECORDS, TARGETS, comparison, size_label, table  # noqa: E402
from query_plan import (  # noqa: E402
    CLASSES,
    DETAILS,
    SOURCE_ID,
    QueryPlan,
    run_expands,
    run_searches,
    search_params,
    summarize,
)

try:
    import psutil
except ImportError:  # psutil is optional: /proc gives RSS too
    psutil = None

UPSTREAM = {"tasks": "tasks", "jira": "jira-work", "github": "github"}


def ensure_base(data_dir: Path, n: int, cfg) -> tuple[Path, dict]:
    """The cached base stream for n records, generated when missing or stale."""
    path = data_dir / f"base-n{n}-s{cfg.seed}-b{cfg.bad_every}.jsonl"
    try:
        meta = gen_stream.load_meta(str(path))
        vocab = gen_stream.Vocabulary.build(cfg.seed, meta["vocab_size"])
        if (
            meta.get("vocab_digest") == vocab.digest
            and meta.get("format") == gen_stream.META_FORMAT
            and meta.get("generator_revision") == gen_stream.GENERATOR_REVISION
            and meta["records"] == n
            and meta["appended_records"] == 0
            and path.stat().st_size == meta["bytes"]
        ):
            return path, {"cached": True}
    except (OSError, ValueError, KeyError):
        pass
    t = time.perf_counter()
    gen_stream.generate(str(path), n, cfg.seed, cfg.bad_every, progress=sys.stderr.isatty())
    return path, {"cached": False, "seconds": time.perf_counter() - t}


def child_env(run: Path, log_level: str | None = None) -> dict:
    env = dict(os.environ)
    if log_level:
        env["STREAMD_LOG"] = log_level
    # Keep any event log the daemon might open inside the run directory.
    env["XDG_STATE_HOME"] = str(run / "state")
    env.pop("STREAMD_DB", None)
    if importlib.util.find_spec("streamd") is None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p
        )
    return env


def initialize(d: Daemon, stream_dir: Path, work: Path, timeout: float) -> dict:
    params = {
        "protocol_version_min": 1,
        "protocol_version_max": 1,
        "workdir": str(work),
        "source_id": SOURCE_ID,
        "location": str(stream_dir),
        "settings": {"files": ["stream.jsonl"], "upstream": UPSTREAM},
    }
    res, dt = d.result("recall/initialize", params, timeout)
    return {
        "initialize_ms": dt * 1e3,
        "spawn_to_initialized_ms": (time.perf_counter() - d.t_spawn) * 1e3,
        "protocol_version": res.get("protocol_version"),
    }


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def scenario(n: int, cfg, argv: list[str] | None = None) -> dict:
    """Every measure at one size, against streamd or, with ``argv``, another adapter."""
    res: dict = {"records": n, "ok": False, "errors": [], "notes": []}
    if argv:
        res["adapter"] = argv
    base, gen_info = ensure_base(cfg.data_dir, n, cfg)
    res["generation"] = gen_info
    run = Path(tempfile.mkdtemp(prefix=f"run-n{n}-", dir=cfg.data_dir))
    stream_dir, work = run / "stream", run / "work"
    stream_dir.mkdir()
    work.mkdir()
    stream = stream_dir / "stream.jsonl"
    shutil.copyfile(base, stream)
    shutil.copyfile(gen_stream.meta_path(str(base)), gen_stream.meta_path(str(stream)))
    meta = gen_stream.load_meta(str(stream))
    res["bytes"] = meta["bytes"]
    res["lines"] = meta["records"] + meta["bad_lines"]
    res["bad_lines"] = meta["bad_lines"]
    plan = QueryPlan(meta, cfg.queries, cfg.seed)
    env = child_env(run, cfg.daemon_log)
    d: Daemon | None = None
    try:
        log(f"n={n:,}: {meta['bytes'] / 1e6:.1f} MB in {run}")
        d = Daemon(run, env, argv=argv)
        res["startup"] = initialize(d, stream_dir, work, cfg.init_timeout)

        # Full index on a cold workdir.
        d.new_phase()
        health, dt = d.result(
            "recall/refresh",
            {"deadline": deadline_in(cfg.index_timeout), "full": False},
            cfg.index_timeout + 5,
        )
        st = d.status()
        indexed = health.get("indexed_count")
        res["index"] = {
            "seconds": dt,
            "mb_per_s": meta["bytes"] / 1e6 / dt,
            "records_per_s": res["lines"] / dt,
            "peak_rss_mb": max(d.phase_peak, st.get("VmHWM", 0)) / 2**20,
            "peak_tree_pss_mb": max(d.phase_peak_tree, d.phase_peak) / 2**20,
            "worker_processes": d.max_children,
            "rss_after_mb": st.get("VmRSS", 0) / 2**20,
            "cpu_s": st.get("cpu_s"),
            "children_cpu_s": st.get("children_cpu_s"),
            "status": health.get("status"),
            "coverage": health.get("coverage"),
            "indexed_count": indexed,
            "generation": health.get("index_generation"),
            "watermark": health.get("index_watermark"),
        }
        log(
            f"n={n:,}: indexed in {dt:.2f} s ({meta['bytes'] / 1e6 / dt:.1f} MB/s), "
            f"RSS {st.get('VmRSS', 0) / 2**20:.0f} MB"
        )
        if indexed != meta["records"]:
            res["notes"].append(
                f"health indexed_count {indexed} != {meta['records']} records written"
            )

        # The first search after an index may pay for lazily built structures.
        first_id = plan.samples[len(plan.samples) // 2][0]
        _, dt = d.call(
            "recall/search",
            search_params(first_id, {}, {}, cfg.limit, cfg.search_timeout),
            cfg.search_timeout,
        )
        res["first_search_ms"] = dt * 1e3

        d.new_phase()
        res["search"] = {}
        for cls in CLASSES:
            queries = getattr(plan, cls)()
            r = run_searches(d, cls, queries, cfg, indexed or meta["records"])
            res["search"][cls] = r
            log(
                f"n={n:,}: search {cls}: p50 {r.get('p50_ms', float('nan')):.2f} ms "
                f"p95 {r.get('p95_ms', float('nan')):.2f} ms over {r['n']} "
                f"(matched median {r['matched_median']})"
            )
            for e in r["error_samples"]:
                res["notes"].append(f"search {cls} error: {e}")
            for c in r["check_samples"]:
                res["notes"].append(f"search {cls} check: {c}")
        res["expand"] = {}
        locs = plan.locators(cfg.expands)
        for detail in DETAILS:
            r = run_expands(d, detail, locs, cfg)
            res["expand"][detail] = r
            log(f"n={n:,}: expand {detail}: p50 {r.get('p50_ms', float('nan')):.2f} ms")
            for e in r["error_samples"]:
                res["notes"].append(f"expand {detail} error: {e}")
        res["search_peak_rss_mb"] = d.phase_peak / 2**20

        times = []
        for _ in range(cfg.health_calls):
            _, dt = d.result(
                "recall/health", {"deadline": deadline_in(cfg.search_timeout)}, cfg.search_timeout
            )
            times.append(dt * 1e3)
        res["health_nochange"] = summarize(times)

        # Incremental catch-up: append, then time the call that consumes it.
        d.new_phase()
        cu: dict = {
            "records": APPEND_RECORDS,
            "refresh_ms": [],
            "search_ms": [],
            "append_gen_s": [],
        }
        expect = indexed or meta["records"]
        for _ in range(cfg.catchup_rounds):
            t = time.perf_counter()
            gen_stream.append(str(stream), APPEND_RECORDS)
            cu["append_gen_s"].append(time.perf_counter() - t)
            expect += APPEND_RECORDS
            h, dt = d.result(
                "recall/refresh",
                {"deadline": deadline_in(cfg.search_timeout), "full": False},
                cfg.search_timeout,
            )
            cu["refresh_ms"].append(dt * 1e3)
            if h.get("indexed_count") != expect:
                res["notes"].append(
                    f"after append: indexed_count {h.get('indexed_count')} != {expect}"
                )
                expect = h.get("indexed_count") or expect
        for _ in range(cfg.catchup_rounds):
            m = gen_stream.append(str(stream), APPEND_RECORDS)
            expect += APPEND_RECORDS
            newest = f"evt-{m['next_index']:07d}"
            r, dt = d.result(
                "recall/search",
                search_params(newest, {}, {}, cfg.limit, cfg.search_timeout),
                cfg.search_timeout,
            )
            cu["search_ms"].append(dt * 1e3)
            cands = r.get("candidates") or []
            if not cands or cands[0].get("source_record_id") != newest:
                res["notes"].append(f"search right after append did not find {newest}")
        cu["refresh_ms_median"] = statistics.median(cu["refresh_ms"])
        cu["search_ms_median"] = statistics.median(cu["search_ms"])
        cu["peak_rss_mb"] = d.phase_peak / 2**20
        res["catchup"] = cu

        st = d.status()
        res["daemon_cpu_s"] = st.get("cpu_s")
        res["workers_cpu_s"] = st.get("children_cpu_s")
        res.update(d.memory(st))
        res["vm_hwm_mb"] = st.get("VmHWM", 0) / 2**20
        # Mapped index segments count toward RSS as file pages (reclaimable
        # page cache); the anonymous part is the daemon's own heap.
        res["rss_anon_mb"] = st.get("RssAnon", 0) / 2**20
        res["rss_file_mb"] = st.get("RssFile", 0) / 2**20
        sd = d.shutdown(cfg.init_timeout)
        d = None
        res["shutdown"] = sd
        if sd.get("error") or sd.get("exit_code") not in (0, None):
            res["notes"].append(f"shutdown: {sd}")
        elif sd.get("stderr_tail") and not cfg.daemon_log:
            res["notes"].append(f"daemon stderr: {sd['stderr_tail'][-1][:200]}")
        if sd.get("left_running"):
            res["notes"].append(
                f"{sd['left_running']} processes of the daemon's group still ran 3 s after it "
                f"exited (killed): {sd['left_running_cmdlines']}"
            )
        workdir_files = sorted(p.name for p in work.iterdir())
        res["workdir_files"] = workdir_files
        res["workdir_mb"] = sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) / 1e6

        # Restart on the warm workdir: spawn -> initialize -> first answered search.
        restarts = []
        for k in range(cfg.restarts):
            d = Daemon(run, env, argv=argv)
            info = initialize(d, stream_dir, work, cfg.init_timeout)
            probe = plan.samples[(k * 7919) % len(plan.samples)][0]
            r, dt = d.result(
                "recall/search",
                search_params(probe, {}, {}, cfg.limit, cfg.index_timeout),
                cfg.index_timeout + 5,
            )
            info["first_search_ms"] = dt * 1e3
            info["spawn_to_first_answer_ms"] = (time.perf_counter() - d.t_spawn) * 1e3
            cands = r.get("candidates") or []
            if not cands or cands[0].get("source_record_id") != probe:
                res["notes"].append(f"restart: first search did not find {probe}")
            _, dt = d.result(
                "recall/search",
                search_params(probe, {}, {}, cfg.limit, cfg.search_timeout),
                cfg.search_timeout,
            )
            info["second_search_ms"] = dt * 1e3
            st = d.status()
            info.update(d.memory(st))
            info["generation"] = (r.get("diagnostics") or {}).get("generation")
            sd = d.shutdown(cfg.init_timeout)
            d = None
            info["shutdown"] = sd
            if sd.get("error") or sd.get("exit_code") not in (0, None):
                res["notes"].append(f"restart shutdown: {sd}")
            if sd.get("left_running"):
                res["notes"].append(
                    f"restart {k + 1}: {sd['left_running']} processes of the daemon's group "
                    f"still ran 3 s after it exited (killed): {sd['left_running_cmdlines']}"
                )
            restarts.append(info)
            log(
                f"n={n:,}: restart {k + 1}: first answer after "
                f"{info['spawn_to_first_answer_ms']:.0f} ms"
            )
        if restarts:
            res["restart"] = {
                "runs": restarts,
                "spawn_to_first_answer_ms_median": statistics.median(
                    r["spawn_to_first_answer_ms"] for r in restarts
                ),
                "peak_rss_mb_max": max(r["peak_rss_mb"] for r in restarts),
                "peak_tree_pss_mb_max": max(r["peak_tree_pss_mb"] for r in restarts),
            }
        res["ok"] = True
    except BenchError as exc:
        res["errors"].append(str(exc))
        log(f"n={n:,}: FAILED: {exc}")
    finally:
        if d is not None:
            d.kill()
        if not cfg.keep:
            shutil.rmtree(run, ignore_errors=True)
        else:
            res["run_dir"] = str(run)
    return res


# -- the table ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke run: 20k records, few queries (well under a minute)",
    )
    ap.add_argument(
        "--sizes",
        help="comma-separated record counts (default 10000,100000,1000000; --quick: 20000)",
    )
    ap.add_argument("--out", default=str(HERE / "results" / "latest.json"))
    ap.add_argument(
        "--data-dir",
        default=str(HERE / "data"),
        help="generated streams (cached) and run directories",
    )
    ap.add_argument("--seed", type=int, default=gen_stream.DEFAULT_SEED)
    ap.add_argument(
        "--bad-every",
        type=int,
        default=0,
        help="write a bad line after every K-th record (0: none)",
    )
    ap.add_argument("--queries", type=int, help="queries per search class (default 100)")
    ap.add_argument("--expands", type=int, help="expands per detail level (default 100)")
    ap.add_argument("--limit", type=int, default=10, help="search limit (default 10)")
    ap.add_argument("--budget-bytes", type=int, default=4096, help="expand budget_bytes")
    ap.add_argument(
        "--class-budget",
        type=float,
        help="seconds one query class may take before it stops early (default 60; --quick: 5)",
    )
    ap.add_argument("--catchup-rounds", type=int, help="append rounds (default 3)")
    ap.add_argument("--restarts", type=int, help="warm restarts (default 3; 0: none)")
    ap.add_argument(
        "--index-timeout",
        type=float,
        help="seconds the full index may take (default 300 + 1 s per 1k records)",
    )
    ap.add_argument(
        "--search-timeout",
        type=float,
        default=60.0,
        help="seconds any other single request may take",
    )
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument(
        "--reference",
        metavar="PATH",
        help="also run every size against this adapter binary (the Go recall-stream)",
    )
    ap.add_argument(
        "--daemon-log",
        metavar="LEVEL",
        help="run the daemon with STREAMD_LOG=LEVEL; the JSON keeps each process's stderr tail",
    )
    cfg = ap.parse_args(argv)

    q = cfg.quick
    sizes = (
        [int(x.replace("_", "")) for x in cfg.sizes.split(",")]
        if cfg.sizes
        else ([20_000] if q else [10_000, 100_000, 1_000_000])
    )
    cfg.queries = cfg.queries or (20 if q else 100)
    cfg.expands = cfg.expands or (10 if q else 100)
    cfg.class_budget = cfg.class_budget or (5.0 if q else 60.0)
    cfg.catchup_rounds = max(1, cfg.catchup_rounds or (2 if q else 3))
    if cfg.restarts is None:  # 0 is allowed: no restart
        cfg.restarts = 1 if q else 3
    cfg.health_calls = 10 if q else 50
    cfg.init_timeout = 60.0
    cfg.data_dir = Path(cfg.data_dir).resolve()  # the daemon runs in another cwd
    cfg.data_dir.mkdir(parents=True, exist_ok=True)

    results = {
        "machine": machine_facts(),
        "config": {
            "sizes": sizes,
            "quick": q,
            "seed": cfg.seed,
            "bad_every": cfg.bad_every,
            "queries_per_class": cfg.queries,
            "expands_per_level": cfg.expands,
            "limit": cfg.limit,
            "budget_bytes": cfg.budget_bytes,
            "class_budget_s": cfg.class_budget,
            "catchup_rounds": cfg.catchup_rounds,
            "restarts": cfg.restarts,
            "append_records": APPEND_RECORDS,
            "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        },
        "targets_at_1M": TARGETS,
        "scenarios": [],
    }
    if cfg.reference:
        results["reference"] = []
        results["config"]["reference"] = cfg.reference
    t = time.perf_counter()
    for n in sizes:
        cfg.index_timeout_n = cfg.index_timeout or (300 + n / 1000)
        c = argparse.Namespace(**vars(cfg))
        c.index_timeout = cfg.index_timeout_n
        results["scenarios"].append(scenario(n, c))
        if cfg.reference:
            results["reference"].append(scenario(n, c, argv=[cfg.reference]))
    results["wall_s"] = time.perf_counter() - t

    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    if cfg.reference:
        print()
        print(table(results, "reference", f"reference ({Path(cfg.reference).name})"))
        print()
        print(comparison(results))
    failed = False
    for s in results["scenarios"] + results.get("reference", []):
        for e in s["errors"]:
            failed = True
            print(f"\n{size_label(s['records'])} FAILED: {e}")
        for note in s["notes"]:
            print(f"{size_label(s['records'])} note: {note}")
    print(f"\nwrote {out} ({results['wall_s']:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
