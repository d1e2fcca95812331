#!/usr/bin/env python3
"""Cold spawns, the way a Recall core runs an adapter for every command.

    python bench/cold_bench.py [--sizes 12 10000 [1000000]] [--runs 20]
                               [--reference /opt/recall-build/bin/recall-stream]

Every measured query is a fresh process, started in a process group of its own
and driven in lockstep as the core drives it: ``recall/initialize``,
``recall/health`` with a 5 s deadline (the core's probe), ``recall/search``
with a 5 s deadline, ``recall/shutdown``, then stdin closed and the process
waited for. Timed from the spawn: the first answer (initialize), the search
answer, and the exit. The adapters compared:

* ``attach``: ``streamd attach`` (what the README recommends) relaying to a
  warm resident daemon. One untimed warm-up session starts the daemon and
  finishes the index (a refresh with a long deadline); the daemon then keeps
  the source open between spawns. Stopped with ``streamd stop`` at the end.
* ``stdio``: plain ``streamd`` on stdio, every spawn a whole daemon, on a warm
  workdir (built by one untimed warm-up session).
* ``reference``: the Go ``recall-stream`` given by ``--reference`` (rebuilds its
  index in memory on every spawn).

Streams come from ``gen_stream.py``, cached in ``bench/data/`` (``cold-n*``);
every run works in a fresh directory under it (its own socket directory and
state directory, so a user's real daemon is never touched), removed after.
Prints a table and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import gen_stream  # noqa: E402

PROBE_DEADLINE = 5.0  # the core's DefaultProbeTimeout
SEARCH_DEADLINE = 5.0
# How long past a request's deadline an answer is waited for before the run
# counts as hung (the process is then killed).
GRACE = 30.0
SOURCE_ID = "bench"


def streamd_command() -> list[str]:
    """The console script beside this interpreter, as a Recall config names it."""
    script = Path(sys.executable).parent / "streamd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "streamd"]


def ensure_stream(data_dir: Path, n: int, seed: int) -> Path:
    path = data_dir / f"cold-n{n}-s{seed}.jsonl"
    try:
        meta = gen_stream.load_meta(str(path))
        if (meta.get("generator_revision") == gen_stream.GENERATOR_REVISION
                and meta["base_records"] == n and meta["appended_records"] == 0
                and path.stat().st_size == meta["bytes"]):
            return path
    except (OSError, ValueError, KeyError):
        pass
    print(f"generating {n:,} records into {path}", file=sys.stderr)
    gen_stream.generate(str(path), n, seed, 0, progress=sys.stderr.isatty())
    return path


def deadline_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def frame(request_id: int, method: str, params: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                       "params": params}).encode() + b"\n"


class Spawned:
    """One adapter process on pipes, read with deadlines."""

    def __init__(self, argv: list[str], env: dict, cwd: Path) -> None:
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                                     start_new_session=True)
        self.buf = b""
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def ask(self, data: bytes, timeout: float) -> dict:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise TimeoutError(f"no answer within {timeout:g} s")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError("the adapter closed stdout")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def finish(self, timeout: float) -> float:
        """Close stdin, read to EOF, wait for exit; ms since spawn."""
        self.proc.stdin.close()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise TimeoutError("stdout never reached EOF")
            if not os.read(self.proc.stdout.fileno(), 1 << 16):
                break
        self.proc.wait(max(deadline - time.monotonic(), 0.1))
        return self.elapsed_ms()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.sel.close()
        self.proc.stdout.close()


def initialize_params(stream: Path, workdir: Path) -> dict:
    return {"protocol_version_min": 1, "protocol_version_max": 1, "workdir": str(workdir),
            "source_id": SOURCE_ID, "location": str(stream), "settings": {}}


def session(argv: list[str], env: dict, cwd: Path, stream: Path, workdir: Path, query: str,
            *, warm_up: bool = False) -> dict:
    """One spawn as the core runs it; with ``warm_up``, a refresh that may take
    as long as it needs replaces the probe (to finish the index)."""
    s = Spawned(argv, env, cwd)
    out: dict = {"ok": False}
    try:
        init = s.ask(frame(1, "recall/initialize", initialize_params(stream, workdir)), 120)
        out["first_answer_ms"] = s.elapsed_ms()
        if "error" in init:
            out["error"] = init["error"]
            return out
        if warm_up:
            refresh = s.ask(frame(2, "recall/refresh", {"deadline": deadline_in(3600)}), 3600)
            out["health"] = refresh.get("result", {}).get("status") or refresh.get("error")
        else:
            health = s.ask(frame(2, "recall/health", {"deadline": deadline_in(PROBE_DEADLINE)}),
                           PROBE_DEADLINE + GRACE)
            out["health"] = health.get("result", {}).get("status") or \
                health.get("error", {}).get("message")
            out["health_ms"] = s.elapsed_ms() - out["first_answer_ms"]
            if out["health_ms"] > PROBE_DEADLINE * 1e3:
                # The core stops waiting at its deadline whatever the adapter
                # does: this source would be unhealthy and the query abstain.
                out["health"] = f"later than the {PROBE_DEADLINE:g} s probe"
        search = s.ask(frame(3, "recall/search", {
            "query": query, "filters": {}, "limit": 10,
            "deadline": deadline_in(SEARCH_DEADLINE)}), SEARCH_DEADLINE + GRACE)
        out["search_ms"] = s.elapsed_ms()
        if "error" in search:
            out["error"] = search["error"]
        else:
            out["matched"] = search["result"]["diagnostics"]["matched"]
        s.ask(frame(4, "recall/shutdown", {}), GRACE)
        out["exit_ms"] = s.finish(GRACE)
        out["exit_code"] = s.proc.returncode
        out["ok"] = "error" not in out and out["health"] == "healthy"
    except (TimeoutError, EOFError, OSError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        s.kill()
    return out


def queries(stream: Path) -> list[str]:
    """Alternately a record id (an exact identifier) and a middling word."""
    meta = gen_stream.load_meta(str(stream))
    ids = [sample[0] for sample in meta.get("samples", [])][:50] or ["evt-0000001"]
    vocab = gen_stream.Vocabulary.build(meta["seed"], meta["vocab_size"])
    counts = meta.get("word_counts") or []
    words = [w for i, w in enumerate(vocab.words[20:400], 20) if i < len(counts) and counts[i]]
    words = words or ["the"]
    return [q for pair in zip(ids, words * (len(ids) // len(words) + 1), strict=False)
            for q in pair]


def summarize(values: list[float]) -> dict | None:
    if not values:
        return None
    values = sorted(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return {"p50": statistics.median(values), "p95": p95, "n": len(values)}


def run_mode(name: str, argv: list[str], env: dict, run: Path, stream: Path, runs: int,
             warm: bool) -> dict:
    workdir = run / f"work-{name}"
    workdir.mkdir()
    qs = queries(stream)
    warm_ups = []
    if warm:
        warm_ups.append(session(argv, env, run, stream, workdir, qs[0], warm_up=True))
    warm_ups.append(session(argv, env, run, stream, workdir, qs[0]))  # page cache, imports
    results = [session(argv, env, run, stream, workdir, qs[i % len(qs)]) for i in range(runs)]
    good = [r for r in results if r.get("search_ms") is not None]
    healths: dict[str, int] = {}
    for r in results:
        key = str(r.get("health", "no answer"))
        healths[key] = healths.get(key, 0) + 1
    return {
        "mode": name, "argv": argv, "runs": runs,
        "first_answer_ms": summarize([r["first_answer_ms"] for r in results
                                      if "first_answer_ms" in r]),
        "search_ms": summarize([r["search_ms"] for r in good]),
        "exit_ms": summarize([r["exit_ms"] for r in results if "exit_ms" in r]),
        "health": healths,
        "matched": sorted({r["matched"] for r in results if "matched" in r}),
        "failed": sum(not r["ok"] for r in results),
        "errors": sorted({str(r["error"]) for r in results if "error" in r})[:3],
        "warm_up": warm_ups,
    }


def scenario(n: int, args: argparse.Namespace) -> list[dict]:
    stream = ensure_stream(args.data_dir, n, args.seed)
    run = Path(tempfile.mkdtemp(prefix="cold-", dir=args.data_dir))
    env = {k: v for k, v in os.environ.items()
           if k not in ("STREAMD_DB", "STREAMD_LOG", "XDG_RUNTIME_DIR")}
    env["XDG_STATE_HOME"] = str(run / "state")
    # A socket directory of this run's own (and a short one: a Unix socket
    # address holds 107 bytes).
    runtime = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))
    env["STREAMD_RUNTIME_DIR"] = str(runtime / "run")
    streamd = streamd_command()
    out = []
    try:
        print(f"[{n:,} records] attach", file=sys.stderr)
        out.append(run_mode("attach", [*streamd, "attach"], env, run, stream, args.runs, True))
        subprocess.run([*streamd, "stop"], env=env, capture_output=True, timeout=60)
        print(f"[{n:,} records] stdio", file=sys.stderr)
        out.append(run_mode("stdio", streamd, env, run, stream, args.runs, True))
        if args.reference:
            print(f"[{n:,} records] reference", file=sys.stderr)
            out.append(run_mode("reference", [args.reference], env, run, stream,
                                min(args.runs, args.reference_runs), False))
    finally:
        subprocess.run([*streamd, "stop"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(runtime, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(run, ignore_errors=True)
    for row in out:
        row["records"] = n
        row["stream_bytes"] = stream.stat().st_size
    return out


def table(rows: list[dict]) -> str:
    def ms(summary: dict | None) -> str:
        if not summary:
            return "-"
        return f"{summary['p50']:,.0f} / {summary['p95']:,.0f}"

    head = ("records", "adapter", "runs", "first answer ms p50/p95",
            "search answer ms p50/p95", "exit ms p50/p95", "health probe")
    lines = [head]
    for r in rows:
        health = ", ".join(f"{k} x{v}" for k, v in r["health"].items())
        lines.append((f"{r['records']:,}", r["mode"], str(r["runs"]), ms(r["first_answer_ms"]),
                      ms(r["search_ms"]), ms(r["exit_ms"]), health))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
            for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[12, 10_000],
                   help="stream sizes in records (default 12 10000; add 1000000 for the big one)")
    p.add_argument("--runs", type=int, default=20, help="measured spawns per adapter and size")
    p.add_argument("--reference", help="the Go recall-stream binary, for comparison")
    p.add_argument("--reference-runs", type=int, default=20,
                   help="at most this many spawns of the reference per size (default 20; "
                   "it rebuilds on every spawn, 35 s at 1M records)")
    p.add_argument("--seed", type=int, default=gen_stream.DEFAULT_SEED)
    p.add_argument("--data-dir", type=Path, default=HERE / "data")
    p.add_argument("--out", type=Path, help="also write the results as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    args = p.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    rows = [row for n in args.sizes for row in scenario(n, args)]
    print(table(rows))
    for r in rows:
        if r["mode"] == "attach" and r["warm_up"] and "first_answer_ms" in r["warm_up"][0]:
            print(f"{r['records']:,} attach: the first spawn, which started the daemon, "
                  f"answered initialize at {r['warm_up'][0]['first_answer_ms']:,.0f} ms")
    for r in rows:
        if r["errors"]:
            print(f"{r['records']:,} {r['mode']}: {r['failed']} failed; e.g. {r['errors'][0]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"python": sys.version, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
