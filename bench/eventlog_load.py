"""The event log under load: N writers and M watchers on one daemon's Unix socket.

What it measures, each scenario on a fresh ``python -m streamd serve
--socket S --db D --synchronous FULL`` daemon and a fresh database:

* ``table``: ``--writers`` writers (default 4), each appending ``--events`` events
  (5,000) with ``--inflight`` requests in flight (50), beside 0, 1, 2 and 8
  whole-log watchers (``--watchers``).
* ``p99``: 32 writers x 5 in flight beside 8 watchers (target append p99 <= 50 ms).
* ``burst``: 32 writers x 50 in flight beside 8 watchers.
  Both spread the table's total (writers x events) over the 32 writers
  (``--many-events``), so they run as long as a table row.
* ``cross``: daemons A and B, two processes on the same database file (SQLite WAL;
  each has its own socket). One writer appends to A one event at a time (ack,
  then a random pause of ``--pause-ms`` on average, so appends land at random
  phases of B's poll); a watcher on B records when each entry arrives. Latency =
  watcher receive - writer send, ``--samples`` of them. ``--watch-interval-ms``
  is passed to the daemons only when given (default: the daemon's own, 200 ms), so
  the number's dependence on polling can be seen.

Per load row it prints appends/s (total appends / (last ack - first send), over all
writers), append latency p50/p99/max (send -> reply), watcher lag p50/p99 (the
watcher's receive time of a seq - the writer's ack time of that seq, pooled over
watchers; it may be slightly negative, since the daemon can write the notification
before the reply), the daemon's peak memory (VmHWM of ``/proc/<pid>/status`` before
it stops), daemon and client CPU per append, how long after the last ack the
last watcher had the last entry (a daemon can keep its append rate by letting its
watchers fall behind), and whether every watcher got every acknowledged seq
exactly once and in increasing order (a miss, a repeat or a step back is named in
the summary and makes the exit status 1). The targets are printed with met/missed
beside them; nothing is asserted. JSON goes to ``--out``.

How: the machine has two cores shared by the daemon and the load, so the load must
cost as little per request as possible or the bench measures itself. Every writer
and watcher is its own OS process (``load_roles.py``)
on a plain blocking socket: writers send request frames encoded before the clock
starts (only the request id, the event id and its session vary) and keep
``--inflight`` of them unanswered; replies are decoded a whole ``recv`` at a time as
one JSON array of small Structs (id, seq, error). Watchers decode notifications down
to the seq, and after a small read nap ``--watcher-batch-ms`` (2 ms) so frames
gather: the daemon writes one frame per entry, and eight watchers woken for each
(~40-60 us a wake here) spent nearly as much CPU as the daemon (8 watchers x 20,000
entries: 5.3 s of watcher CPU in a 6.1 s run with no nap, 1.8 s in 11.9 s with 1 ms,
1.0 s in 12.9 s with 2 ms), at the price of lags read up to that much high (the
cross watcher never naps). Nothing of Trio or asyncio runs in a load process. The
parent starts writers (each warms up with ``--warmup`` untimed appends, which also
create the database), then watchers (each reads ``latest_seq``, sends its
``eventlog/watch`` from that seq and completes one more round trip on the same
socket, then says ready), then tells every writer "go" at once. A run ends when
every writer has had every reply and every watcher has received every entry, or
after ``--timeout`` / ``--drain-timeout``, which is reported rather than waited out
(late watchers get SIGUSR1 and report what they saw). Records go to files and are
joined in the parent. Every process started is killed at the end of its scenario, on
failure and on SIGTERM too, and dies with the bench even on kill -9
(PR_SET_PDEATHSIG). ``--src DIR`` runs the daemons from another source tree (an
unpacked ``git archive`` of a commit), to compare commits with the same load.

Clock: ``time.monotonic_ns`` in each process, taken right after ``recv`` returns
(one stamp for every frame of that read) and right before ``sendall``. It is
CLOCK_MONOTONIC, system-wide on Linux, so stamps of different processes compare.

    .venv/bin/python bench/eventlog_load.py                  # everything (about a minute)
    .venv/bin/python bench/eventlog_load.py --quick          # smoke run, seconds
    .venv/bin/python bench/eventlog_load.py --scenarios table --watchers 0 8
    .venv/bin/python bench/eventlog_load.py --scenarios cross --watch-interval-ms 20
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from load_report import report, targets
from load_roles import connect

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "eventlog_load.json"
SCENARIOS = ("table", "p99", "burst", "cross")


# --- the parent: daemons, children, joins ----------------------------------------------

# Every process started, so whatever happens they are all killed at the end.
_STARTED: list[subprocess.Popen] = []


_prctl: Any = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the bench dies, even by kill -9.
    prctl is looked up in the parent: a forked child of a process with threads
    (numpy's) must not take the loader's locks."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# The source tree the daemons run (--src); load processes never import streamd.
SRC = ROOT / "src"


def spawn(args: list[str], stderr_path: Path, **kw: Any) -> subprocess.Popen:
    global _prctl
    if _prctl is None and sys.platform == "linux":
        import ctypes

        _prctl = ctypes.CDLL(None).prctl
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    with open(stderr_path, "ab") as stderr:
        proc = subprocess.Popen(
            args, stderr=stderr, env=env, preexec_fn=_die_with_parent, **kw
        )
    _STARTED.append(proc)
    return proc


def kill_all() -> None:
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()
    for proc in _STARTED:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


class Daemon:
    def __init__(self, name: str, db: Path, sock: Path, work: Path, a: argparse.Namespace):
        self.name = name
        self.sock = sock
        self.log = work / f"{name}.log"
        self.args = [sys.executable, "-m", "streamd", "serve", "--socket", str(sock)]
        self.args += ["--db", str(db), "--synchronous", a.synchronous]
        if a.watch_interval_ms is not None:
            self.args += ["--watch-interval-ms", str(a.watch_interval_ms)]
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        self.proc = spawn(self.args, self.log, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:  # ready when it accepts a connection, not when the file appears
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon {self.name} exited {self.proc.returncode} at start: "
                                   f"{tail(self.log)}")
            try:
                connect(str(self.sock)).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {self.name} did not listen in 30 s") from None
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon {self.name} died with {self.proc.returncode} under load: "
                               f"{tail(self.log)}")

    def peak_mib(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def stop(self) -> int | None:
        """SIGTERM and its exit status (None if it had to be killed)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


class Child:
    """One load process, talking to the parent in lines on its stdin/stdout."""

    def __init__(self, role: str, work: Path, name: str, *args: str) -> None:
        self.name = name
        self.result = work / f"{name}.bin"
        self.log = work / f"{name}.log"
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "load_roles.py"), role]
        cmd += [*args, "--result", str(self.result)]
        self.proc = spawn(cmd, self.log, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._buf = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
        except BrokenPipeError:
            pass  # it exited already; collect() reports why


def collect(children: list[Child], timeout: float) -> dict[str, str]:
    """One line from each child (its "ready" or its JSON summary); a child that
    exits first or a timeout is an error naming who and why."""
    got: dict[str, str] = {}
    sel = selectors.DefaultSelector()
    for c in children:
        if b"\n" in c._buf:
            line, c._buf = c._buf.split(b"\n", 1)
            got[c.name] = line.decode()
        else:
            assert c.proc.stdout is not None
            sel.register(c.proc.stdout, selectors.EVENT_READ, c)
    deadline = time.monotonic() + timeout
    while len(got) < len(children):
        left = deadline - time.monotonic()
        if left <= 0:
            waiting = [c.name for c in children if c.name not in got]
            raise TimeoutError(f"no answer in {timeout:g} s from {', '.join(waiting)}")
        for key, _ in sel.select(min(left, 1.0)):
            c = key.data
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fileobj)
                c.proc.wait(5)
                raise RuntimeError(
                    f"{c.name} exited {c.proc.returncode} early: {tail(c.log)}"
                )
            c._buf += data
            if b"\n" in c._buf:
                line, c._buf = c._buf.split(b"\n", 1)
                got[c.name] = line.decode()
                sel.unregister(key.fileobj)
    sel.close()
    return got


def socket_path(work: Path, name: str) -> Path:
    """A Unix socket path must fit in 108 bytes; a deep workdir gets a short one."""
    path = work / f"{name}.sock"
    if len(str(path)) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="sdl-")) / f"{name}.sock"


def process_cpu_s(pid: int) -> float:
    from eventlog_bench import thread_cpu  # imports trio: the parent only

    return sum(thread_cpu(pid).values())


def ms_stats(ns: Any, *qs: float) -> dict[str, float | None]:
    import numpy as np

    if len(ns) == 0:
        return {f"p{q:g}_ms": None for q in qs} | {"max_ms": None}
    v = np.asarray(ns, dtype=np.float64) / 1e6
    out = {f"p{q:g}_ms": float(np.percentile(v, q)) for q in qs}
    out["max_ms"] = float(v.max())
    return out


def load_writer(path: Path, count: int) -> tuple[Any, Any, Any]:
    import numpy as np

    data = np.fromfile(path, dtype=np.int64)
    return data[:count], data[count : 2 * count], data[2 * count : 3 * count]


def load_watcher(path: Path, count: int) -> tuple[Any, Any]:
    import numpy as np

    data = np.fromfile(path, dtype=np.int64)
    return data[:count], data[count : 2 * count]


def run_scenario(
    name: str,
    work: Path,
    a: argparse.Namespace,
    *,
    writers: int,
    inflight: int,
    events: int,
    watchers: int,
    warmup: int,
    cross: bool = False,
) -> dict[str, Any]:
    """One run on a fresh daemon (two for ``cross``) and a fresh database."""
    import numpy as np

    run = work / name
    k = 1
    while run.exists():  # the same row asked for twice (--watchers 8 8)
        k += 1
        run = work / f"{name}-{k}"
    run.mkdir()
    db = run / "events.db"
    daemons = [Daemon(f"daemon-{name}", db, socket_path(run, "a"), run, a).start()]
    if cross:
        daemons.append(Daemon(f"daemon-{name}-b", db, socket_path(run, "b"), run, a).start())
    write_to, watch_on = daemons[0], daemons[-1]
    row: dict[str, Any] = {
        "scenario": name,
        "writers": writers,
        "inflight": inflight,
        "events_per_writer": events,
        "watchers": watchers,
    }
    try:
        ws = [
            Child("writer", run, f"writer{k}", "--socket", str(write_to.sock),
                  "--tag", f"w{k}", "--count", str(events), "--inflight", str(inflight),
                  "--warmup", str(warmup), "--seed", str(a.seed + k),
                  "--pause-ms", str(a.pause_ms if cross else 0))
            for k in range(writers)
        ]
        collect(ws, 120)  # connected and warmed up: the database exists
        total = writers * events
        rs = [
            Child("watcher", run, f"watcher{k}", "--socket", str(watch_on.sock),
                  "--expect", str(total), "--batch-ms", str(0 if cross else a.watcher_batch_ms),
                  *(["--fault", a.inject_fault] if a.inject_fault and k == 0 else []))
            for k in range(watchers)
        ]
        tips = collect(rs, 120)
        cpu0 = {d.name: process_cpu_s(d.pid) for d in daemons}
        for w in ws:
            w.send("go")
        wsum = {k: json.loads(v) for k, v in collect(ws, a.timeout).items()}
        cpu1 = {d.name: process_cpu_s(d.pid) for d in daemons}
        for d in daemons:
            d.check_alive()
        try:
            rsum = {k: json.loads(v) for k, v in collect(rs, a.drain_timeout).items()}
        except TimeoutError as exc:
            # Someone is still short of entries: stop them all and report what they saw.
            row.setdefault("notes", []).append(f"watchers did not finish: {exc}")
            for r in rs:
                if r.proc.poll() is None:
                    r.proc.send_signal(signal.SIGUSR1)
            rsum = {k: json.loads(v) for k, v in collect(rs, 30).items()}
        row["daemon_peak_mib"] = max((d.peak_mib() or 0.0) for d in daemons)
        if cross:
            row["daemon_peak_mib_each"] = [d.peak_mib() for d in daemons]
    finally:
        for d in daemons:
            status = d.stop()
            if status != 0:
                row.setdefault("notes", []).append(
                    f"{d.name} exit status {status}: {tail(d.log, 600)}"
                )

    # Join: one array per column over all writers; seq -> ack time.
    cols = [load_writer(w.result, events) for w in ws]
    sent = np.concatenate([c[0] for c in cols])
    acked = np.concatenate([c[1] for c in cols])
    seqs = np.concatenate([c[2] for c in cols])
    ok = seqs > 0
    errors = sum(s["errors"] for s in wsum.values())
    if errors:
        first = next(s["first_error"] for s in wsum.values() if s["errors"])
        row.setdefault("notes", []).append(f"{errors} appends failed, first: {first}")
    good = seqs[ok]
    unique = np.unique(good)
    if len(unique) != len(good):
        row.setdefault("notes", []).append(f"{len(good) - len(unique)} seqs acknowledged twice")
    span_s = (acked.max() - sent.min()) / 1e9
    row.update(
        appends=int(total),
        failed_appends=int(errors),
        seconds=float(span_s),
        appends_per_s=float(total / span_s),
        append=ms_stats(acked - sent, 50, 99),
        daemon_cpu_us_per_append=1e6 * sum(cpu1[k] - cpu0[k] for k in cpu0) / total,
        clients_cpu_us_per_append=1e6 * sum(s["cpu_s"] for s in wsum.values()) / total,
    )
    lo = int(good.min()) if len(good) else 0
    hi = int(good.max()) if len(good) else 0
    ack_by_seq = np.full(hi - lo + 1, -1, dtype=np.int64)
    sent_by_seq = np.full(hi - lo + 1, -1, dtype=np.int64)
    ack_by_seq[good - lo] = acked[ok]
    sent_by_seq[good - lo] = sent[ok]

    detail, lags, watcher_cpu, last_seen = [], [], 0.0, []
    for r in rs:
        s = rsum[r.name]
        wseq, wrecv = load_watcher(r.result, s["count"])
        missing = np.setdiff1d(unique, wseq, assume_unique=True)
        extra = np.setdiff1d(wseq, unique)
        exactly_once = (
            s["out_of_order"] == 0
            and len(missing) == 0
            and len(extra) == 0
            and s["count"] == len(unique)
            and not s["errors"]
        )
        known = (wseq >= lo) & (wseq <= hi)
        idx = wseq[known] - lo
        has = ack_by_seq[idx] >= 0
        base = sent_by_seq if cross else ack_by_seq
        lags.append(wrecv[known][has] - base[idx][has])
        watcher_cpu += s["cpu_s"]
        if len(wrecv):
            last_seen.append(int(wrecv.max()))
        detail.append(
            {
                "watcher": r.name,
                "tip": int(tips[r.name].split()[1]),
                "received": s["count"],
                "expected": len(unique),
                "missing": len(missing),
                "missing_first": [int(x) for x in missing[:10]],
                "extra": len(extra),
                "out_of_order": s["out_of_order"],
                "out_of_order_examples": s["out_of_order_examples"],
                "errors": s["errors"],
                "stopped_early": s["stopped_early"],
                "reads": s["reads"],
                "cpu_s": s["cpu_s"],
                "exactly_once": bool(exactly_once),
            }
        )
    lag_ns = np.concatenate(lags) if lags else np.array([], dtype=np.int64)
    # How far behind the watchers were when the writers were done: a daemon can
    # keep its append rate by letting its watchers fall behind.
    row["watchers_done_after_last_ack_s"] = (
        (max(last_seen) - int(acked.max())) / 1e9 if last_seen else None
    )
    row["watcher_detail"] = detail
    row["watcher_lag"] = ms_stats(lag_ns, 50, 99) if rs else None
    row["watcher_lag_from"] = "the writer's send" if cross else "the writer's ack"
    row["watchers_cpu_us_per_append"] = 1e6 * watcher_cpu / total
    row["exactly_once_ok"] = all(d["exactly_once"] for d in detail)
    if not row["exactly_once_ok"]:
        bad = [d for d in detail if not d["exactly_once"]]
        row.setdefault("notes", []).append(
            "EXACTLY-ONCE VIOLATED: "
            + "; ".join(
                f"{d['watcher']} got {d['received']} of {d['expected']}, missing {d['missing']}"
                f" (first {d['missing_first']}), extra {d['extra']}, out of order"
                f" {d['out_of_order']} {d['out_of_order_examples']}, errors {d['errors']}"
                + (" (stopped at the drain timeout: late, maybe not lost)"
                   if d["stopped_early"] else "")
                for d in bad
            )
        )
    return row


def machine() -> dict[str, Any]:
    from eventlog_bench import machine as base  # commit, cpus, python, platform, load

    facts = {**base(), "kernel": platform.release(), "machine": platform.machine()}
    # commit and src_dirty describe this checkout; say so when the daemons ran another tree.
    facts["daemon_src"] = str(SRC)
    facts["daemon_src_is_checkout"] = (ROOT / "src").resolve() == SRC
    return facts


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=int, default=4, help="writers in the table (default 4)")
    p.add_argument("--inflight", type=int, default=50, help="in flight per writer (default 50)")
    p.add_argument("--events", type=int, default=5_000, help="events per writer (default 5000)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the table's rows this many times, alternating; the watcher"
                        " targets are judged on the median of the rounds' pairs (default 1)")
    p.add_argument("--watchers", type=int, nargs="+", default=[0, 1, 2, 8],
                   help="watcher counts of the table rows (default 0 1 2 8)")
    p.add_argument("--many-writers", type=int, default=32, help="writers of p99/burst (32)")
    p.add_argument("--many-watchers", type=int, default=8, help="watchers of p99/burst (8)")
    p.add_argument("--many-events", type=int,
                   help="events per writer of p99/burst (default: the table's total / writers)")
    p.add_argument("--p99-inflight", type=int, default=5, help="in flight, p99 row (5)")
    p.add_argument("--burst-inflight", type=int, default=50, help="in flight, burst row (50)")
    p.add_argument("--samples", type=int, default=200, help="cross-process samples (200)")
    p.add_argument("--pause-ms", type=float, default=5.0,
                   help="cross: mean random pause after each ack (uniform 0..2x; default 5)")
    p.add_argument("--watch-interval-ms", type=int,
                   help="passed to every daemon (default: not passed, the daemon's 200 ms)")
    p.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL",
                   help="passed to every daemon (default FULL, the daemon's own default)")
    p.add_argument("--warmup", type=int, default=200,
                   help="untimed appends per writer before the start (default 200)")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--quick", action="store_true",
                   help="smoke-test counts: 2 writers x 300, watchers 0 1, p99/burst 4 x 150"
                   " beside 1 watcher, 20 cross samples")
    p.add_argument("--watcher-batch-ms", type=float, default=2.0,
                   help="load watchers nap this long after a small read so frames gather"
                   " (their CPU per entry drops; lags may read up to this much high); the"
                   " cross watcher never naps (default 2)")
    p.add_argument("--timeout", type=float, default=600, help="writers' time limit, s (600)")
    p.add_argument("--drain-timeout", type=float, default=60,
                   help="how long watchers may lag after the last ack, s (60)")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--workdir", type=Path, help="where the run's temp dir goes (default: /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the run dir (logs, databases)")
    p.add_argument("--src", type=Path, default=SRC,
                   help="the source tree the daemons import streamd from (default: this"
                   " checkout's src/; e.g. an unpacked `git archive` of another commit)")
    # Not for measuring: the first watcher loses (drop) or repeats (dup) an entry, so
    # a test can see the exactly-once check fail loudly.
    p.add_argument("--inject-fault", choices=("drop", "dup"), help=argparse.SUPPRESS)
    if "--quick" in argv:  # smaller defaults; flags given explicitly still win
        p.set_defaults(writers=2, events=300, watchers=[0, 1], warmup=20, many_writers=4,
                       many_watchers=1, many_events=150, samples=20, drain_timeout=30)
    a = p.parse_args(argv)
    if a.many_events is None:
        a.many_events = max(1, a.writers * a.events // a.many_writers)
    return a


def main() -> int:
    a = parse_args(sys.argv[1:])
    global SRC
    SRC = a.src.resolve()

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # so the finally below kills what was started

    signal.signal(signal.SIGTERM, terminated)
    if a.workdir is not None:
        a.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="streamd-load-", dir=a.workdir))
    results: dict[str, Any] = {}
    failed = False
    load_before = os.getloadavg()

    def attempt(key: str, name: str, **kw: Any) -> dict[str, Any]:
        nonlocal failed
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            row = run_scenario(name, work, a, **kw)
        except Exception as exc:  # one scenario failing must not hide the others
            failed = True
            row = {"scenario": name, "writers": kw["writers"], "inflight": kw["inflight"],
                   "watchers": kw["watchers"], "error": f"{type(exc).__name__}: {exc}"}
            print(f"  FAILED: {row['error']}", file=sys.stderr)
        finally:
            kill_all()  # nothing of one scenario may load the next
        if not row.get("exactly_once_ok", True):
            failed = True
        return row

    try:
        if "table" in a.scenarios:
            # Rounds alternate the rows (0, 8, 0, 8, ...), so a change in the
            # machine's load falls on both sides of each pair alike.
            results["table"] = [
                {**attempt("table", f"table-{m}w", writers=a.writers, inflight=a.inflight,
                           events=a.events, watchers=m, warmup=a.warmup), "round": n}
                for n in range(a.rounds)
                for m in a.watchers
            ]
        for key, inflight in (("p99", a.p99_inflight), ("burst", a.burst_inflight)):
            if key in a.scenarios:
                results[key] = attempt(key, key, writers=a.many_writers, inflight=inflight,
                                       events=a.many_events, watchers=a.many_watchers,
                                       warmup=max(1, a.warmup // 4))
        if "cross" in a.scenarios:
            results["cross"] = attempt("cross", "cross", writers=1, inflight=1,
                                       events=a.samples, watchers=1, warmup=5, cross=True)
    finally:
        kill_all()
        if a.keep:
            print(f"run dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    tgs = targets(results)
    doc = {
        "machine": {**machine(), "load_average_before": load_before},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "results": results,
        "targets": tgs,
        "ok": not failed,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(report(results, tgs, a))
    print(f"\nwritten to {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
