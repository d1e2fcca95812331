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
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import gen_stream  # noqa: E402

try:
    import psutil
except ImportError:  # psutil is optional: /proc gives RSS too
    psutil = None

SOURCE_ID = "bench"
UPSTREAM = {"tasks": "tasks", "jira": "jira-work", "github": "github"}
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
APPEND_RECORDS = 1000

# Targets from issues 4 and 11, at 1,000,000 records on the 2-core bench machine.
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


class BenchError(Exception):
    pass


# -- machine facts -----------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine_facts() -> dict:
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dirty = _git("status", "--porcelain", "--", "src")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False) if psutil else None,
        "cpu_model": cpu_model or platform.processor() or None,
        "memory_total_gib": round(psutil.virtual_memory().total / 2**30, 1) if psutil else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "versions": {
            d: _version(d) for d in ("recall-streamd", "trio", "msgspec", "numpy", "apsw", "psutil")
        },
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_src_dirty": bool(dirty) if dirty is not None else None,
    }


# -- the daemon on pipes -----------------------------------------------------------


def rfc3339(ns: int) -> str:
    s = np.datetime_as_string(
        np.array(ns, dtype="datetime64[ns]").astype("datetime64[s]"), unit="s"
    )
    return f"{s}Z"


def deadline_in(seconds: float) -> str:
    return rfc3339(time.time_ns() + int(seconds * 1e9) + 10**9)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_of(pid: int) -> int | None:
    """Resident bytes of one process (/proc statm: cheap enough to sample often)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        if psutil is None:
            return None
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return None


def _pss_of(pid: int) -> int:
    """Proportional set size: shared pages split among the processes sharing them,
    so forked workers are not counted twice for pages they share with the parent."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return _rss_of(pid) or 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


class Daemon:
    """One ``python -m streamd`` process in lockstep: one request, then its answer.

    The answer is read on the calling thread (select + os.read), so a latency
    is request write to answer line with no thread hand-off in between.
    """

    def __init__(self, cwd: Path, env: dict, sample_interval: float = 0.05,
                 argv: list[str] | None = None) -> None:
        self.t_spawn = time.perf_counter()
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "streamd"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.fd = self.proc.stdout.fileno()
        self.buf = bytearray()
        self.next_id = 1
        self.stderr_tail: deque[str] = deque(maxlen=200)
        # Peaks of the daemon process alone and of its whole process tree
        # (worker processes included): RSS sums double-count pages a forked
        # worker shares with its parent, PSS sums do not.
        self.peak_rss = 0
        self.phase_peak = 0
        self.peak_tree_rss = 0
        self.peak_tree_pss = 0
        self.phase_peak_tree = 0
        self.max_children = 0
        self._stop = threading.Event()
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()
        self._sampler = threading.Thread(target=self._sample, args=(sample_interval,), daemon=True)
        self._sampler.start()

    def _drain_stderr(self) -> None:
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def _sample(self, interval: float) -> None:
        while not self._stop.is_set():
            rss = _rss_of(self.pid)
            if rss is None:
                return
            self.peak_rss = max(self.peak_rss, rss)
            self.phase_peak = max(self.phase_peak, rss)
            kids = _descendants(self.pid)
            tree_rss, tree_pss = rss, rss
            if kids:
                self.max_children = max(self.max_children, len(kids))
                tree_rss += sum(_rss_of(k) or 0 for k in kids)
                tree_pss = _pss_of(self.pid) + sum(_pss_of(k) for k in kids)
            self.peak_tree_rss = max(self.peak_tree_rss, tree_rss)
            self.peak_tree_pss = max(self.peak_tree_pss, tree_pss)
            self.phase_peak_tree = max(self.phase_peak_tree, tree_pss)
            self._stop.wait(interval)

    def new_phase(self) -> None:
        self.phase_peak = self.phase_peak_tree = _rss_of(self.pid) or 0

    def memory(self, st: dict) -> dict:
        """Peak figures in MB; ``st`` is a fresh ``status()``."""
        main = max(self.peak_rss, st.get("VmHWM", 0))
        return {
            "peak_rss_mb": main / 2**20,
            "peak_tree_rss_mb": max(main, self.peak_tree_rss) / 2**20,
            "peak_tree_pss_mb": max(self.peak_tree_pss, main if not self.max_children else 0)
            / 2**20,
            "max_worker_processes": self.max_children,
        }

    def status(self) -> dict:
        """VmHWM (peak resident set), VmRSS in bytes, and CPU seconds used."""
        out = {}
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) * 1024
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            tick = os.sysconf("SC_CLK_TCK")
            out["cpu_s"] = (int(fields[11]) + int(fields[12])) / tick
            # CPU of worker processes the daemon has already waited for
            out["children_cpu_s"] = (int(fields[13]) + int(fields[14])) / tick
        except (OSError, IndexError, ValueError):
            pass
        return out

    def _fail(self, what: str) -> BenchError:
        code = self.proc.poll()
        tail = "\n".join(list(self.stderr_tail)[-15:])
        state = f"exited with {code}" if code is not None else "still running"
        return BenchError(f"{what} (daemon {state}); stderr tail:\n{tail}")

    def _read_line(self, deadline: float) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                return line
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 1 << 20)
                if not chunk:
                    raise EOFError
                self.buf += chunk

    def call(self, method: str, params: dict, timeout: float) -> tuple[dict, float]:
        """Send one request; return (the response frame, seconds until it arrived)."""
        rid = self.next_id
        self.next_id += 1
        frame = (
            json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
            + b"\n"
        )
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._fail(f"{method}: cannot write request ({exc})") from None
        deadline = t0 + timeout
        while True:
            try:
                line = self._read_line(deadline)
            except TimeoutError:
                raise self._fail(f"{method}: no answer within {timeout:.0f} s") from None
            except EOFError:
                raise self._fail(f"{method}: daemon closed stdout") from None
            t1 = time.perf_counter()
            try:
                msg = json.loads(line)
            except ValueError:
                raise self._fail(
                    f"{method}: stdout carried a non-JSON line: {line[:200]!r}"
                ) from None
            if isinstance(msg, dict) and msg.get("id") == rid:
                return msg, t1 - t0
            # Anything else (a stray frame) is noted and skipped.
            self.stderr_tail.append(f"[bench] unexpected frame: {line[:200]!r}")

    def result(self, method: str, params: dict, timeout: float) -> tuple[dict, float]:
        msg, dt = self.call(method, params, timeout)
        if "error" in msg:
            raise self._fail(f"{method} failed: {json.dumps(msg['error'])[:300]}")
        return msg["result"], dt

    def shutdown(self, timeout: float) -> dict:
        """recall/shutdown, then EOF; the process must exit 0 by itself."""
        out: dict = {}
        try:
            msg, dt = self.call("recall/shutdown", {}, timeout)
            out["shutdown_ms"] = dt * 1e3
            if msg.get("result") != {}:
                out["shutdown_answer"] = msg
            self.proc.stdin.close()
            code = self.proc.wait(timeout=timeout)
            out["exit_code"] = code
            rest = self.proc.stdout.read()
            if rest:
                out["bytes_after_shutdown"] = len(rest)
            self._stderr_reader.join(timeout=5)
            if self.stderr_tail:
                out["stderr_tail"] = list(self.stderr_tail)[-20:]
            # Workers that outlive the daemon could still be writing its workdir.
            # Give helpers that exit on their own (a resource tracker) a moment.
            grace = time.perf_counter() + 3
            left = self.group_members()
            while left and time.perf_counter() < grace:
                time.sleep(0.05)
                left = self.group_members()
            if left:
                out["left_running"] = len(left)
                out["left_running_cmdlines"] = [_cmdline(p) for p in left]
        except subprocess.TimeoutExpired:
            out["error"] = f"did not exit within {timeout:.0f} s after shutdown"
        except BenchError as exc:
            out["error"] = str(exc)
        finally:
            self.kill()
        return out

    def group_members(self) -> list[int]:
        """Processes still in the daemon's process group (it leads a new session)."""
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pid and fields[0] != b"Z":
                out.append(int(name))
        return out

    def kill(self) -> None:
        self._stop.set()
        if self.proc.poll() is None or self.group_members():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


# -- what to ask -------------------------------------------------------------------


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


def _size_label(n: int) -> str:
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

    head = ["", *[_size_label(s["records"]) for s in scen], "target @1M"]
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
                cells.append(f"{_size_label(s['records'])}: {a:,.1f} / {b:,.1f} ({ratio:,.1f}x)")
            except (TypeError, KeyError, ValueError, ZeroDivisionError):
                cells.append(f"{_size_label(s['records'])}: -")
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
            print(f"\n{_size_label(s['records'])} FAILED: {e}")
        for note in s["notes"]:
            print(f"{_size_label(s['records'])} note: {note}")
    print(f"\nwrote {out} ({results['wall_s']:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
