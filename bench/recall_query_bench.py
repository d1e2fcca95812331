#!/usr/bin/env python3
"""A whole ``recall query`` on the small sample, through each adapter.

    python bench/recall_query_bench.py [--runs 9] [--recall PATH] [--reference PATH]
                                       [--query WORDS] [--out FILE]

What a person waits for: the real Recall CLI (``recall``, from the PATH or
``--recall``) answering ``recall query WORDS`` on the 12-record sample that
ships in the package, timed as a whole process from outside, with the source's
adapter being in turn:

* ``reference``: the Go ``recall-stream`` (the PATH's, or ``--reference``),
  which rebuilds its index in memory on every spawn;
* ``streamd attach``: the Python attach, relaying to a warm resident daemon;
* ``streamd-attach``: the compiled attach (when it is installed beside this
  interpreter), relaying to the same warm daemon.

Each adapter gets a config home and a state home of its own (its own Recall
workdir); the two attaches share one private socket directory, so one daemon
serves both, started and warmed by untimed queries first. The timed runs are
interleaved, one of each adapter per round in a rotating order, so a machine
whose speed drifts slows all alike. Prints the median (and min / max) wall
time of each, and each attach's median over the reference's, as a ratio of
the medians and as the median of the per-round ratios. Asserts nothing; exit
1 when a query did not answer (Recall's exit status is not 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SAMPLE = REPO / "src" / "streamd" / "data" / "sample.jsonl"
CONFORMANCE = REPO / "conformance" / "stream"


def adapters(reference: str | None) -> dict[str, tuple[str, list[str]]]:
    """name -> (command, args), as a Recall config names them."""
    bindir = Path(sys.executable).parent
    out: dict[str, tuple[str, list[str]]] = {}
    if reference:
        out["reference"] = (reference, [])
    out["streamd attach"] = (str(bindir / "streamd"), ["attach"])
    native = bindir / "streamd-attach"
    if native.is_file() and os.access(native, os.X_OK):
        out["streamd-attach"] = (str(native), [])
    return out


def config(command: str, args: list[str]) -> str:
    return "\n".join((
        "[adapters.bench]",
        f"command = {json.dumps(command)}",
        f"args = {json.dumps(args)}",
        'freshness_modes = ["indexed"]',
        f"conformance = {json.dumps(str(CONFORMANCE))}",
        "",
        "[[sources]]",
        'source_uid = "bench-sample-0001"',
        'source_id = "sample"',
        'adapter = "bench"',
        f"location = {json.dumps(str(SAMPLE))}",
        'freshness_mode = "indexed"',
        "",
    ))


def environments(root: Path, names: dict[str, tuple[str, list[str]]]) -> dict[str, dict]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("STREAMD_DB", "XDG_RUNTIME_DIR", "STREAMD_LOG")}
    runtime = root / "run"
    runtime.mkdir(mode=0o700)
    envs = {}
    for i, (name, (command, args)) in enumerate(names.items()):
        home = root / f"a{i}"
        (home / "config" / "recall").mkdir(parents=True)
        (home / "state").mkdir()
        (home / "config" / "recall" / "config.toml").write_text(config(command, args))
        envs[name] = {**base, "XDG_CONFIG_HOME": str(home / "config"),
                      "XDG_STATE_HOME": str(home / "state"),
                      "STREAMD_RUNTIME_DIR": str(runtime)}
    return envs


def query(recall: str, words: list[str], env: dict, cwd: Path) -> tuple[float, int, bytes]:
    t0 = time.perf_counter()
    done = subprocess.run([recall, "query", *words], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=120)
    return (time.perf_counter() - t0) * 1e3, done.returncode, done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="timed queries per adapter (>= 7)")
    ap.add_argument("--recall", default=shutil.which("recall"), help="the Recall CLI")
    ap.add_argument("--reference", default=shutil.which("recall-stream"),
                    help="the reference adapter (Go recall-stream)")
    ap.add_argument("--query", default="reference stream adapter", help="the query's words")
    ap.add_argument("--out", help="write the figures as JSON here too")
    args = ap.parse_args(argv)
    if not args.recall:
        print("recall_query_bench: no Recall CLI: put `recall` on the PATH or give --recall "
              "(bench/cold_bench.py times the adapters without it)", file=sys.stderr)
        return 2
    if args.runs < 7:
        ap.error("--runs: at least 7")
    names = adapters(args.reference)
    if "reference" not in names:
        print("note: no reference recall-stream (PATH or --reference): no ratios",
              file=sys.stderr)
    if "streamd-attach" not in names:
        print("note: streamd-attach is not installed beside this Python: not measured",
              file=sys.stderr)
    words = args.query.split()
    root = Path(tempfile.mkdtemp(prefix="rqb-", dir="/tmp"))  # short: a socket path
    envs = environments(root, names)
    times: dict[str, list[float]] = {name: [] for name in names}
    failed = False
    try:
        # Untimed: starts the daemon, builds each workdir's index, warms caches.
        for name, env in envs.items():
            for _ in range(2):
                _, code, said = query(args.recall, words, env, root)
                if code != 0:
                    print(f"{name}: recall exited {code}:\n{said.decode(errors='replace')}",
                          file=sys.stderr)
                    return 1
        order = list(names)
        for round_no in range(args.runs):
            shift = round_no % len(order)
            for name in order[shift:] + order[:shift]:
                ms, code, said = query(args.recall, words, envs[name], root)
                if code != 0:
                    failed = True
                    print(f"{name}: recall exited {code}: {said[-300:]!r}", file=sys.stderr)
                times[name].append(ms)
    finally:
        streamd = names["streamd attach"][0]
        subprocess.run([streamd, "stop"], env=next(iter(envs.values())),
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    report(times, args, names)
    return 1 if failed else 0


def report(times: dict[str, list[float]], args: argparse.Namespace,
           names: dict[str, tuple[str, list[str]]]) -> None:
    load = os.getloadavg()
    print(f"recall query {args.query!r} on the 12-record sample, {args.runs} runs each, "
          f"interleaved; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"load {load[0]:.1f}")
    ref = times.get("reference")
    print(f"{'adapter':<16} {'median ms':>10} {'min':>8} {'max':>8} {'x ref (medians)':>16} "
          f"{'x ref (paired)':>15}")
    figures = {}
    for name, ms in times.items():
        med = statistics.median(ms)
        row = {"median_ms": med, "min_ms": min(ms), "max_ms": max(ms), "runs": ms}
        ratio = paired = ""
        if ref and name != "reference":
            row["ratio_of_medians"] = med / statistics.median(ref)
            row["median_paired_ratio"] = statistics.median(a / b for a, b in zip(ms, ref,
                                                                                   strict=True))
            ratio = f"{row['ratio_of_medians']:.2f}"
            paired = f"{row['median_paired_ratio']:.2f}"
        figures[name] = row
        print(f"{name:<16} {med:>10.1f} {min(ms):>8.1f} {max(ms):>8.1f} {ratio:>16} "
              f"{paired:>15}")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "query": args.query, "runs": args.runs, "load": load, "cpus": os.cpu_count(),
            "machine": platform.platform(), "when": datetime.now(UTC).isoformat(),
            "adapters": {n: {"command": c, "args": a} for n, (c, a) in names.items()},
            "figures": figures,
        }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
