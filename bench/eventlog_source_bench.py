"""The event log as a Recall source: index rate, search latency and freshness.

Fills a SQLite event log with deterministic ADK-shaped events (about 500
bytes each: text parts, some tool calls and results, over many sessions),
then, through a real daemon's Recall methods in process (``streamd
--eventlog``'s method table over an in-memory JSON-RPC connection):

* **index**: a fresh source's first build of the whole log (events/s);
* **search**: p50/p95 of selective queries (an event id; a term in well
  under 1 % of events) and of a common term, each its own wire request;
* **freshness**: an event appended through the daemon's own log and queried
  50 ms after its acknowledgement, and one appended by another process
  (``streamd log append``) and queried 100 ms after that process exits:
  whether the query found it, every time.

    python bench/eventlog_source_bench.py --events 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import trio
import trio.testing
from server_daemons import machine

from streamd.daemon import Config, Daemon
from streamd.eventlog.model import AppendParams, Event
from streamd.rpc import Server

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "eventlog_source.json"
FAR = "2999-01-01T00:00:00Z"
BATCH = 1000
RARE_EVERY = 250  # a rare term in 0.4 % of events

_WORDS = [f"w{n:04d}" for n in range(4000)] + [
    "deploy", "checksum", "drill", "invoice", "rollback", "review", "latency", "cache"]


def event(rng: random.Random, i: int) -> AppendParams:
    session = f"s{rng.randrange(20_000):05d}"
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(50, 70)))
    if i % RARE_EVERY == 0:
        words += f" rare{i // RARE_EVERY % 50:02d}"
    kind = rng.random()
    if kind < 0.1:
        content: Any = {"role": "model", "parts": [{"function_call": {
            "name": rng.choice(["search", "fetch", "run_tests"]),
            "args": {"query": words[:200], "limit": rng.randint(1, 50)}}}]}
    elif kind < 0.2:
        content = {"role": "user", "parts": [{"function_response": {
            "name": "search", "response": {"hits": words[:300]}}}]}
    else:
        content = {"role": "model" if kind < 0.6 else "user", "parts": [{"text": words}]}
    return AppendParams(app="agents", user=f"u{rng.randrange(50)}", session=session,
                        event=Event(id=f"ev-{i:07d}", author="model", content=content,
                                    invocation_id=f"inv-{i // 4:07d}"))


async def fill(log: Any, n: int, seed: int) -> float:
    rng = random.Random(seed)
    started = time.perf_counter()
    for lo in range(0, n, BATCH):
        await log.append_batch([event(rng, i) for i in range(lo, min(n, lo + BATCH))])
    return time.perf_counter() - started


@asynccontextmanager
async def wire(db: Path):
    daemon = Daemon(Config(db=str(db), recall_source="eventlog", synchronous="NORMAL"))
    async with daemon.running():
        log = await daemon.eventlog()
        client, server_end = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Server(daemon.methods_for).serve, server_end, server_end)
            buf = bytearray()
            counter = iter(range(1, 1 << 30))

            async def call(method: str, **params: Any) -> dict[str, Any]:
                frame = {"jsonrpc": "2.0", "id": next(counter), "method": method,
                         "params": params}
                await client.send_all(json.dumps(frame).encode() + b"\n")
                while b"\n" not in buf:
                    buf.extend(await client.receive_some(1 << 20))
                line, _, rest = bytes(buf).partition(b"\n")
                buf[:] = rest
                answer = json.loads(line)
                if "result" not in answer:
                    raise RuntimeError(f"{method}: {answer}")
                return answer["result"]

            try:
                yield call, log
            finally:
                await client.send_stream.aclose()


def save_log(db: Path, to: Path) -> None:
    """A copy of the filled log, for later runs to start from (``--log``)."""
    con = apsw.Connection(str(db))
    try:
        con.execute("VACUUM INTO ?", (str(to),))
    finally:
        con.close()


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50_ms": round(1000 * statistics.median(xs), 2),
            "p95_ms": round(1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))], 2)}


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    db = work / "events.db"
    report: dict[str, Any] = {}
    async with wire(db) as (call, log):
        if args.prefilled:
            report["fill_s"] = 0.0
        else:
            report["fill_s"] = round(await fill(log, args.events, args.seed), 1)
            if args.log is not None:
                await trio.to_thread.run_sync(save_log, db, args.log)
        idx = work / "index-work"
        idx.mkdir()
        init = dict(protocol_version_min=1, protocol_version_max=1, workdir=str(idx),
                    source_id="log", location=str(db), settings={})
        await call("recall/initialize", **init)
        started, cpu = time.perf_counter(), time.process_time()
        h = await call("recall/refresh", deadline=FAR)
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        # The CPU time of every thread of the process over the build (the
        # daemon runs in it): what other jobs on the machine move least.
        report["index"] = {"events": h.get("indexed_count", 0), "seconds": round(took, 2),
                           "events_per_s": round(args.events / took),
                           "cpu_us_per_event": round(1e6 * cpu / args.events, 2),
                           "load_average": [round(x, 2) for x in os.getloadavg()]}

        async def timed(query: str) -> tuple[float, list[str]]:
            t = time.perf_counter()
            found = await call("recall/search", query=query, filters={}, limit=10, deadline=FAR)
            return time.perf_counter() - t, [c["source_record_id"] for c in found["candidates"]]

        rng = random.Random(1)
        shapes = {
            "event_id": [f"ev-{rng.randrange(args.events):07d}" for _ in range(args.queries)],
            "rare_term": [f"rare{rng.randrange(50):02d}" for _ in range(args.queries)],
            "common_term": ["checksum drill"] * args.queries,
        }
        report["search"] = {}
        for shape, queries in shapes.items():
            times = [(await timed(q))[0] for q in queries]
            report["search"][shape] = _ms(times)

        fresh: dict[str, Any] = {"resident_50ms": [], "other_process_100ms": []}
        for k in range(args.fresh):
            token = f"freshtoken{k:03d}"
            await log.append("agents", "u1", "fresh", Event(
                id=f"fresh-{k}", author="user", content=token))
            await trio.sleep(0.05)
            t, ids = await timed(token)
            fresh["resident_50ms"].append({"found": ids == [f"fresh-{k}"],
                                           "search_ms": round(1000 * t, 2)})
        for k in range(args.fresh_processes):
            token = f"othertoken{k:03d}"
            done = await trio.to_thread.run_sync(lambda k=k, token=token: subprocess.run(
                [sys.executable, "-m", "streamd", "log", "--db", str(db), "append", "--app",
                 "agents", "--user", "u1", "--session", "other", "--author", "user",
                 "--text", token, "--id", f"other-{k}"], capture_output=True, text=True))
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
            await trio.sleep(0.1)
            t, ids = await timed(token)
            fresh["other_process_100ms"].append({"found": ids == [f"other-{k}"],
                                                 "search_ms": round(1000 * t, 2)})
        report["freshness"] = {name: {"found": sum(r["found"] for r in runs), "of": len(runs),
                                      "search": _ms([r["search_ms"] / 1000 for r in runs])}
                               for name, runs in fresh.items() if runs}
        await call("recall/shutdown")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--fresh", type=int, default=20, help="resident freshness trials")
    p.add_argument("--fresh-processes", type=int, default=5,
                   help="freshness trials appended by another process")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log", type=Path,
                   help="a filled log to start from (copied; nothing is appended to it); "
                        "when it does not exist, the log filled is saved there")
    p.add_argument("--quick", action="store_true", help="small sizes, to check the harness")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.events, args.queries, args.fresh, args.fresh_processes = 3000, 5, 3, 1
    work = Path(tempfile.mkdtemp(prefix="eventlog-source-bench-"))
    args.prefilled = args.log is not None and args.log.exists()
    if args.prefilled:
        con = apsw.Connection(str(args.log), flags=apsw.SQLITE_OPEN_READONLY)
        held = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
        con.close()
        if held != args.events:
            p.error(f"{args.log} holds {held} events, not --events {args.events}")
        shutil.copyfile(args.log, work / "events.db")
    try:
        report = {"machine": machine(), "events": args.events,
                  **trio.run(measure, args, work)}
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
