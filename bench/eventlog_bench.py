"""The event log over JSON-RPC, measured the way a client sees it.

Every number comes from a real ``python -m streamd`` subprocess: on stdio for one
client, on a Unix socket (``streamd serve --socket``) for four. Like the Recall
bench, this asserts nothing; it prints a table (with the issue's targets beside
the numbers) and writes JSON. It imports streamd only for ``--dispatch``.

    .venv/bin/python bench/eventlog_bench.py [--out bench/results/eventlog.json] [--quick]
    .venv/bin/python bench/eventlog_bench.py --dispatch [--rounds 5]

Rows:

* append, one client: requests pipelined with 200 in flight on stdio, each answered
  only after its commit; synchronous=FULL and NORMAL, each on a fresh database.
* append, four clients: four socket connections, 200 in flight each, one daemon.
* since: pages of 10,000 over a 100,000-entry log, unfiltered and with a session
  filter (one session in eight), entries/s end to end (the client reads every frame).
* sessions.get of a 2,000-event session: round trip until the whole answer arrived.
* watch latency, in-process: one stdio connection watches while the same connection
  appends; time from sending the append to the entry notification arriving.
* watch latency, cross-process: daemon A watches, daemon B (another process on the
  same file) appends at random moments; time from sending the append to B until A's
  notification arrives. A sees B's commits through inotify (its poll interval is
  only the fallback; ``STREAMD_NO_INOTIFY=1`` in the environment measures the poll).

Clock: ``time.perf_counter`` in this process, taken when a frame's line arrives,
before it is decoded.

``--dispatch`` measures instead how each ``EventLog`` dispatch moves store calls
off the event loop, in this process (the daemon offers only ``worker``), and prints
JSON: per dispatch, the median over ``--rounds`` rounds (rounds interleave the
dispatches so drift in disk or CPU load hits all of them alike) of a trivial read
(``ping``), one ``since`` page of 100 entries, one append waited for alone (one
transaction and one fsync each), and the append rate of 64 concurrent appenders
(group commit). The table in ``streamd.eventlog.log`` comes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio
from eventlog_wire import Conn, Daemon, EntryNote, Page, SessionEvents, kill_leftovers
from workload import append_params

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "eventlog.json"
INFLIGHT = 200
PAGE = 10_000

TARGETS = {
    "append_1_full": ("appends/s", ">=", 2_000),
    "append_4_full": ("appends/s", ">=", 10_000),
    "since": ("entries/s", ">=", 100_000),
    "sessions_get_p50": ("ms", "<=", 20),
    "watch_in_process_p50": ("ms", "<=", 5),
}


# --- workloads ------------------------------------------------------------------------


def appends(tag: str, sessions: int = 8, start: int = 0) -> Iterator[dict[str, Any]]:
    i = start
    while True:
        yield append_params(tag, i, sessions)
        i += 1


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of a process (Linux /proc; empty elsewhere)."""
    out: dict[str, float] = {}
    try:
        tick = os.sysconf("SC_CLK_TCK")
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / tick
    except (OSError, AttributeError, ValueError):
        pass
    return out


class CpuMeter:
    """The daemon's CPU per operation over a measured span, in total and for its
    busiest thread: what the daemon costs whatever else the machine is doing. The
    busiest thread bounds the rate at 1e6 / its microseconds per operation."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = thread_cpu(pid)

    def per_op(self, ops: int) -> dict[str, float]:
        after = thread_cpu(self.pid)
        spent = {t: after[t] - self.before.get(t, 0.0) for t in after}
        if not spent:
            return {}
        return {
            "daemon_cpu_us": 1e6 * sum(spent.values()) / ops,
            "busiest_thread_us": 1e6 * max(spent.values()) / ops,
        }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def append_one_client(work: Path, synchronous: str, count: int) -> dict[str, Any]:
    db = work / f"append1-{synchronous}.db"
    async with trio.open_nursery() as nursery:
        d = await Daemon(db, synchronous=synchronous, log=work / "daemon.log").start(nursery)
        assert d.conn is not None
        await d.conn.pipeline("eventlog/append", appends("warm"), 500, INFLIGHT)
        assert d.proc is not None
        meter = CpuMeter(d.proc.pid)
        elapsed = await d.conn.pipeline("eventlog/append", appends("a"), count, INFLIGHT)
        cpu = meter.per_op(count)
        await d.stop()
        nursery.cancel_scope.cancel()
    return {"appends": count, "seconds": elapsed, "per_s": count / elapsed, **cpu}


async def append_four_clients(work: Path, synchronous: str, count: int) -> dict[str, Any]:
    db = work / f"append4-{synchronous}.db"
    sock = work / f"append4-{synchronous}.sock"
    async with trio.open_nursery() as nursery:
        d = await Daemon(db, synchronous=synchronous, socket=sock, log=work / "daemon.log").start(
            nursery
        )
        conns = [await d.connect(nursery) for _ in range(4)]
        for k, conn in enumerate(conns):
            await conn.pipeline("eventlog/append", appends(f"warm{k}"), 200, INFLIGHT)
        assert d.proc is not None
        meter = CpuMeter(d.proc.pid)
        started = time.perf_counter()
        async with trio.open_nursery() as clients:
            for k, conn in enumerate(conns):
                clients.start_soon(
                    conn.pipeline, "eventlog/append", appends(f"c{k}"), count, INFLIGHT
                )
        elapsed = time.perf_counter() - started
        cpu = meter.per_op(4 * count)
        await d.stop()
        nursery.cancel_scope.cancel()
    total = 4 * count
    return {"appends": total, "seconds": elapsed, "per_s": total / elapsed, **cpu}


async def reads(work: Path, entries: int, rounds: int, gets: int) -> dict[str, Any]:
    """since pages and sessions.get on one log (NORMAL: only the fill is faster)."""
    db = work / "reads.db"
    sock = work / "reads.sock"
    out: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        d = await Daemon(db, synchronous="NORMAL", socket=sock, log=work / "daemon.log").start(
            nursery
        )
        conns = [await d.connect(nursery) for _ in range(4)]
        per = entries // 4
        async with trio.open_nursery() as fill:
            for k, conn in enumerate(conns):
                fill.start_soon(
                    conn.pipeline, "eventlog/append", appends(f"f{k}", start=k * per), per, INFLIGHT
                )
        # One session of exactly 2,000 events for sessions.get.
        big = ({**p, "session": "big"} for p in appends("big"))
        await conns[0].pipeline("eventlog/append", big, 2_000, INFLIGHT)
        conn = conns[0]

        async def read_all(flt: dict[str, Any] | None) -> tuple[int, float]:
            seq, n = 0, 0
            started = time.perf_counter()
            while True:
                params: dict[str, Any] = {"from_seq": seq, "limit": PAGE}
                if flt:
                    params["filter"] = flt
                page, _, _ = await conn.call("eventlog/since", params, Page)
                n += len(page.entries)
                seq = page.next_seq
                if page.caught_up:
                    return n, time.perf_counter() - started

        for name, flt in (
            ("since", None),
            ("since_session", {"app": "bench", "user": "u", "session": "s3"}),
        ):
            best = []
            assert d.proc is not None
            meter = CpuMeter(d.proc.pid)
            for _ in range(rounds):
                n, seconds = await read_all(flt)
                best.append((n / seconds, n, seconds))
            rate, n, seconds = statistics.median(best)
            out[name] = {
                "entries": n,
                "seconds": seconds,
                "per_s": rate,
                "rounds": [round(r) for r, _, _ in best],
                **meter.per_op(sum(n for _, n, _ in best)),
            }

        ms = []
        key = {"app": "bench", "user": "u", "session": "big"}
        for _ in range(gets + 3):
            got, sent, at = await conn.call("eventlog/sessions.get", key, SessionEvents)
            assert len(got.events) == 2_000
            ms.append((at - sent) * 1000)
        ms = ms[3:]  # the first calls warm the page cache and the decoder
        out["sessions_get"] = {
            "events": 2_000,
            "calls": len(ms),
            "p50_ms": pct(ms, 50),
            "p95_ms": pct(ms, 95),
            "max_ms": max(ms),
        }
        await d.stop()
        nursery.cancel_scope.cancel()
    return out


async def next_entry(conn: Conn, watch_id: int, event_id: str) -> float:
    with trio.fail_after(30):
        while True:
            at, frame = await conn.notes_rx.receive()
            if frame.method != "eventlog/entry":
                continue
            note = msgspec.json.decode(frame.params, type=EntryNote)
            if note.watch == watch_id and note.entry.event.id == event_id:
                return at


async def watch_in_process(work: Path, samples: int) -> dict[str, Any]:
    db = work / "watch-in.db"
    async with trio.open_nursery() as nursery:
        d = await Daemon(db, log=work / "daemon.log").start(nursery)
        conn = d.conn
        assert conn is not None
        latest, _, _ = await conn.call("eventlog/latest_seq", {})
        watch_id = await conn.begin("eventlog/watch", {"from_seq": latest["seq"]})
        source = appends("w")
        ms, acks = [], []
        for i in range(samples + 5):
            params = next(source)
            _, sent, acked = await conn.call("eventlog/append", params)
            seen = await next_entry(conn, watch_id, params["event"]["id"])
            if i >= 5:
                ms.append((seen - sent) * 1000)
                acks.append((acked - sent) * 1000)
        await d.stop()
        nursery.cancel_scope.cancel()
    return {
        "samples": len(ms),
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "max_ms": max(ms),
        "append_ack_p50_ms": pct(acks, 50),
    }


async def watch_cross_process(work: Path, samples: int, interval_ms: int) -> dict[str, Any]:
    db = work / "watch-cross.db"
    rng = random.Random(7)
    async with trio.open_nursery() as nursery:
        a = await Daemon(db, interval_ms=interval_ms, log=work / "daemon.log").start(nursery)
        b = await Daemon(db, interval_ms=interval_ms, log=work / "daemon.log").start(nursery)
        assert a.conn is not None and b.conn is not None
        await b.conn.call("eventlog/ping", {})
        latest, _, _ = await a.conn.call("eventlog/latest_seq", {})
        watch_id = await a.conn.begin("eventlog/watch", {"from_seq": latest["seq"]})
        source = appends("x")
        ms = []
        for i in range(samples + 2):
            # A random phase against A's poll, so the samples cover the interval.
            await trio.sleep(rng.uniform(0, interval_ms / 1000))
            params = next(source)
            _, sent, _ = await b.conn.call("eventlog/append", params)
            seen = await next_entry(a.conn, watch_id, params["event"]["id"])
            if i >= 2:
                ms.append((seen - sent) * 1000)
        await b.stop()
        await a.stop()
        nursery.cancel_scope.cancel()
    return {
        "samples": len(ms),
        "interval_ms": interval_ms,
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "max_ms": max(ms),
    }


# --- report ------------------------------------------------------------------------------


def verdict(key: str, value: float) -> str:
    if key not in TARGETS:
        return ""
    _, op, bound = TARGETS[key]
    ok = value >= bound if op == ">=" else value <= bound
    return f"{op} {bound:,} {'met' if ok else 'MISSED'}"


def table(results: dict[str, Any]) -> str:
    def cpu(r: dict[str, Any]) -> str:
        if "daemon_cpu_us" not in r:
            return ""
        return f"{r['daemon_cpu_us']:.1f} us, busiest thread {r['busiest_thread_us']:.1f} us"

    rows: list[tuple[str, str, str, str]] = []
    for clients, key, target in (
        (1, "append_1", "append_1_full"),
        (4, "append_4", "append_4_full"),
    ):
        for sync in ("FULL", "NORMAL"):
            r = results[key][sync]
            how = (
                f"{INFLIGHT} in flight, stdio"
                if clients == 1
                else f"{INFLIGHT} in flight each, socket"
            )
            rows.append(
                (
                    f"append, {clients} client{'s' if clients > 1 else ''} ({how}), {sync}",
                    f"{r['per_s']:,.0f} /s",
                    verdict(target, r["per_s"]) if sync == "FULL" else "",
                    cpu(r),
                )
            )
    s = results["reads"]
    for key, what in (("since", "all"), ("since_session", "one session of 8")):
        r = s[key]
        rows.append(
            (
                f"since, pages of {PAGE:,}, {what} ({r['entries']:,} entries)",
                f"{r['per_s']:,.0f} entries/s",
                verdict("since", r["per_s"]),
                cpu(r),
            )
        )
    g = s["sessions_get"]
    rows.append(
        (
            "sessions.get, 2,000 events",
            f"p50 {g['p50_ms']:.1f} ms, p95 {g['p95_ms']:.1f} ms",
            verdict("sessions_get_p50", g["p50_ms"]),
            "",
        )
    )
    w = results["watch_in_process"]
    rows.append(
        (
            "watch, append -> entry, same daemon (FULL)",
            f"p50 {w['p50_ms']:.2f} ms, p95 {w['p95_ms']:.2f} ms",
            verdict("watch_in_process_p50", w["p50_ms"]),
            "",
        )
    )
    x = results["watch_cross_process"]
    bound = x["interval_ms"] + 5
    rows.append(
        (
            f"watch, other process appends (inotify; poll fallback {x['interval_ms']} ms)",
            f"p50 {x['p50_ms']:.0f} ms, p95 {x['p95_ms']:.0f} ms, max {x['max_ms']:.0f} ms",
            f"p95 <= {bound} {'met' if x['p95_ms'] <= bound else 'MISSED'}",
            "",
        )
    )
    head = ("measure", "result", "target", "daemon CPU per op")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": git("rev-parse", "HEAD"),
        "src_dirty": bool(git("status", "--porcelain", "--", "src")),
    }


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    n = 2_000 if args.quick else 10_000
    results: dict[str, Any] = {"append_1": {}, "append_4": {}}
    for sync in ("FULL", "NORMAL"):
        print(f"append, one client, {sync} ...", file=sys.stderr)
        results["append_1"][sync] = await append_one_client(work, sync, n)
        print(f"append, four clients, {sync} ...", file=sys.stderr)
        results["append_4"][sync] = await append_four_clients(work, sync, n)
    print("since and sessions.get ...", file=sys.stderr)
    results["reads"] = await reads(
        work, 20_000 if args.quick else 100_000, rounds=3, gets=20 if args.quick else 100
    )
    print("watch, in process ...", file=sys.stderr)
    results["watch_in_process"] = await watch_in_process(work, 50 if args.quick else 300)
    print("watch, across processes ...", file=sys.stderr)
    results["watch_cross_process"] = await watch_cross_process(
        work, 15 if args.quick else 60, args.interval_ms
    )
    return results


# --- --dispatch: the EventLog's ways of calling the store, in process -----------

DISPATCHES = ("inline", "thread", "worker")


async def _dispatch_once(path: str, dispatch: str) -> dict[str, float]:
    from streamd.eventlog import Event, EventLog

    def event(tag: str, i: int) -> Event:
        return Event(id=f"{tag}-{i}", author="bench", content={"i": i, "text": "x" * 100})

    async def client(log: EventLog, tag: str, each: int) -> None:
        for i in range(each):
            await log.append("bench", "u", "s", event(tag, i))

    for suffix in ("", "-wal", "-shm"):
        Path(path + suffix).unlink(missing_ok=True)
    row: dict[str, float] = {}
    async with EventLog(path, dispatch=dispatch) as log:  # type: ignore[arg-type]
        await log.ping()
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            await log.ping()
        row["ping_us"] = (time.perf_counter() - t) / n * 1e6

        n = 500
        t = time.perf_counter()
        for i in range(n):
            await log.append("bench", "u", "s", event("one", i))
        row["append_alone_us"] = (time.perf_counter() - t) / n * 1e6

        n = 500
        t = time.perf_counter()
        for _ in range(n):
            await log.since(0, None, 100)
        row["since_100_us"] = (time.perf_counter() - t) / n * 1e6

        clients, each = 64, 100
        t = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k in range(clients):
                nursery.start_soon(client, log, f"c{k}", each)
        row["group_commit_appends_per_s"] = clients * each / (time.perf_counter() - t)
    return row


async def measure_dispatch(work: Path, rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[dict[str, float]]] = {d: [] for d in DISPATCHES}
    for r in range(rounds):
        order = DISPATCHES[r % 3 :] + DISPATCHES[: r % 3]
        for dispatch in order:
            samples[dispatch].append(await _dispatch_once(str(work / "dispatch.db"), dispatch))
    return {
        d: {k: round(statistics.median(s[k] for s in rows), 1) for k in rows[0]}
        for d, rows in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="smaller counts (CI smoke)")
    parser.add_argument(
        "--dispatch",
        action="store_true",
        help="measure the EventLog's store dispatches in process instead (prints JSON)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--dispatch rounds (default 5)")
    parser.add_argument(
        "--interval-ms",
        type=int,
        default=200,
        help="the watching daemon's poll interval (default 200, the default)",
    )
    parser.add_argument("--workdir", type=Path, help="where the databases go (default: a temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="streamd-eventlog-bench-", dir=args.workdir))
    if args.dispatch:
        try:
            print(json.dumps(trio.run(measure_dispatch, work, args.rounds), indent=2))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    try:
        results = trio.run(main_async, args, work)
    finally:
        kill_leftovers()
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "machine": machine(),
        "targets": TARGETS,
        "results": results,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
