"""Google ADK's session API on streamd, measured the way ADK's agent loop uses it.

Everything goes through ``streamd.adk.StreamdSessionService`` (ADK's
``BaseSessionService`` methods) to a real ``streamd serve --socket`` process (a
Unix socket, as the resident daemon serves), on a fresh database per
synchronous mode. Like the other benches this asserts
nothing: it prints a table (the issue's targets beside the numbers) and writes
JSON. Rows:

* append_event/s: one session, events appended in order, each awaited before
  the next (as the runner does: it appends an event, yields it, goes on).
  Durable: each acknowledged only after its commit. Write-behind
  (``write_behind=True``): each returns once queued, and the time includes the
  final ``flush()`` that stores them all. Events are ADK events with ~200 bytes
  of text; every fifth carries a state delta (session and ``user:`` keys).
* get_session of a 2,000-event session, whole: cold (a new service, nothing
  decoded yet: ``event_cache=0``) and warm (the service that loaded it before:
  the runner's pattern, one load per turn).
* get_session with ``num_recent_events=20``, on that session and on a session
  ``--long`` events long (default 20,000): the bound must not grow with the
  session.
* The same rows for ADK's own ``SqliteSessionService`` (aiosqlite) on this
  machine, as the reference (fewer appends: it is slow).
* Retention (``--retention-events``, default 1,000,000): a log of 1,000 kept
  sessions' events is measured, then that many more events (~500 bytes each,
  in 1,000 sessions of another app, timestamped in 2020) are written and
  measured again; a policy dropping events older than a day is applied
  through ``eventlog/compact`` on a ``streamd serve`` of the file, and the file
  (with its WAL) measured a third time. The shrink is reported against the
  space those events took.

    .venv/bin/python bench/adk_bench.py [--events 2000] [--long 20000] [--reads 50]
                                        [--out bench/results/adk.json] [--quick]

Clock: ``time.perf_counter`` around each awaited call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.genai import types

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "adk.json"
TEXT = ("The agent considered the request, called a tool, and wrote this reply. " * 3)[:200]


def make_event(i: int) -> Event:
    author, role = ("user", "user") if i % 2 == 0 else ("helper", "model")
    actions = EventActions(state_delta={"turn": i, "user:last": i}) if i % 5 == 0 else None
    fields: dict[str, Any] = {
        "invocation_id": f"inv-{i // 4}",
        "author": author,
        "content": types.Content(role=role, parts=[types.Part(text=f"{i}: {TEXT}")]),
    }
    if actions is not None:
        fields["actions"] = actions
    return Event(**fields)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(ms), 3), "p95_ms": round(pct(ms, 0.95), 3),
            "runs": len(ms)}


async def append_rate(svc: BaseSessionService, session_id: str, n: int) -> tuple[float, Any]:
    session = await svc.get_session(app_name="bench", user_id="u", session_id=session_id)
    start = time.perf_counter()
    for i in range(n):
        await svc.append_event(session, make_event(i))
    elapsed = time.perf_counter() - start
    return n / elapsed, session


async def timed_gets(
    svc: BaseSessionService, session_id: str, reads: int, config: GetSessionConfig | None,
    expect: int,
) -> list[float]:
    out = []
    for _ in range(reads):
        t = time.perf_counter()
        got = await svc.get_session(app_name="bench", user_id="u", session_id=session_id,
                                    config=config)
        out.append((time.perf_counter() - t) * 1000)
        assert got is not None and len(got.events) == expect, (len(got.events), expect)
    return out


async def fill_fast(client: AsyncClient, session_id: str, n: int) -> None:
    """A long session, written with appends pipelined (its writing is not measured)."""
    from streamd.adk.codec import log_event

    for start in range(0, n, 500):
        await asyncio.gather(*(
            client.append("bench", "u", session_id, log_event(make_event(i)))
            for i in range(start, min(n, start + 500))
        ))


async def bench_streamd(db: Path, synchronous: str, args: argparse.Namespace) -> dict[str, Any]:
    sock = str(db.with_suffix(".sock"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "serve", "--socket", sock, "--db", str(db),
         "--synchronous", synchronous],
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("streamd serve did not start")
            await asyncio.sleep(0.01)
        client = await AsyncClient.connect_socket(sock)
        async with client:
            return await _measure(client, args)
    finally:
        proc.terminate()
        proc.wait(30)


async def _measure(client: AsyncClient, args: argparse.Namespace) -> dict[str, Any]:
    svc = StreamdSessionService(client)
    await svc.create_session(app_name="bench", user_id="u", session_id="s")
    rate, _ = await append_rate(svc, "s", args.events)
    result: dict[str, Any] = {"append_events_per_s": round(rate, 1)}
    behind = StreamdSessionService(client, write_behind=True)
    await behind.create_session(app_name="bench", user_id="u", session_id="behind")
    session = await behind.get_session(app_name="bench", user_id="u", session_id="behind")
    start = time.perf_counter()
    for i in range(args.events):
        await behind.append_event(session, make_event(i))
    await behind.flush()
    result["append_events_per_s_write_behind"] = round(
        args.events / (time.perf_counter() - start), 1)
    cold = StreamdSessionService(client, event_cache=0)
    result["get_session_cold"] = summary(
        await timed_gets(cold, "s", args.reads, None, args.events))
    await svc.get_session(app_name="bench", user_id="u", session_id="s")  # warm it
    result["get_session_warm"] = summary(
        await timed_gets(svc, "s", args.reads, None, args.events))
    recent = GetSessionConfig(num_recent_events=20)
    result["recent20_cold"] = summary(await timed_gets(cold, "s", args.reads, recent, 20))
    await svc.create_session(app_name="bench", user_id="u", session_id="long")
    await fill_fast(client, "long", args.long)
    result["recent20_of_long_cold"] = summary(
        await timed_gets(cold, "long", args.reads, recent, 20))
    return result


async def bench_adk_sqlite(db: Path, args: argparse.Namespace) -> dict[str, Any]:
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    svc = SqliteSessionService(str(db))
    await svc.create_session(app_name="bench", user_id="u", session_id="s")
    n = min(args.events, args.reference_appends)
    rate, session = await append_rate(svc, "s", n)
    result: dict[str, Any] = {"append_events_per_s": round(rate, 1), "appends_measured": n}
    # The rest of the 2,000 events, so the reads read the same length.
    for i in range(n, args.events):
        await svc.append_event(session, make_event(i))
    reads = max(3, args.reads // 5)
    result["get_session_cold"] = summary(await timed_gets(svc, "s", reads, None, args.events))
    recent = GetSessionConfig(num_recent_events=20)
    result["recent20_cold"] = summary(await timed_gets(svc, "s", reads, recent, 20))
    return result


def bench_retention(root: Path, n: int) -> dict[str, Any]:
    from streamd.eventlog.model import AppendParams
    from streamd.eventlog.model import Event as LogEvent
    from streamd.eventlog.store import SqliteOptions, SqliteStore

    db = root / "retention.db"

    def size() -> int:
        return sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())

    def fill(app: str, count: int, sessions: int, when: Any = None) -> None:
        store = SqliteStore.open(str(db), SqliteOptions(synchronous="NORMAL"))
        body = {"role": "model", "parts": [{"text": TEXT * 2}]}
        for start in range(0, count, 5000):
            store.append_batch([
                AppendParams(app=app, user="u", session=f"s{i % sessions}",
                             event=LogEvent(id=f"{app}-{i}", author="helper", content=body,
                                            timestamp=when))
                for i in range(start, min(count, start + 5000))
            ], int(time.time() * 1e6))
        store.checkpoint()
        store.close()

    fill("kept", 10_000, 1000)
    base = size()
    t = time.perf_counter()
    import datetime as dt

    fill("compacted", n, 1000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    filled = size()
    fill_s = time.perf_counter() - t

    async def compact() -> Any:
        sock = str(root / "retention.sock")
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "serve", "--socket", sock, "--db", str(db),
             "--synchronous", "NORMAL"], stdin=subprocess.DEVNULL)
        try:
            while not os.path.exists(sock):
                await asyncio.sleep(0.01)
            async with await AsyncClient.connect_socket(sock) as c:
                await c.set_retention("compacted", max_age_s=86_400)  # all of them
                start = time.perf_counter()
                result = await c.compact("compacted")
                return result, time.perf_counter() - start
        finally:
            proc.terminate()
            proc.wait(60)

    result, seconds = asyncio.run(compact())
    after = size()
    took = filled - base
    return {
        "events": n, "events_deleted": result.events_deleted, "bytes_base": base,
        "bytes_filled": filled, "bytes_after": after, "bytes_the_events_took": took,
        "shrink_fraction_of_their_space": round((filled - after) / took, 4),
        "compact_s": round(seconds, 2), "fill_s": round(fill_s, 1),
        "checkpointed": result.checkpointed,
    }


def machine() -> dict[str, Any]:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "load": os.getloadavg(), "platform": platform.platform(), "commit": commit}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--long", type=int, default=20_000)
    p.add_argument("--reads", type=int, default=50)
    p.add_argument("--reference-appends", type=int, default=300,
                   help="appends measured on ADK's SqliteSessionService")
    p.add_argument("--modes", default="FULL,NORMAL")
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--retention-events", type=int, default=1_000_000,
                   help="events compacted away in the retention row (0: skip it)")
    p.add_argument("--quick", action="store_true", help="small sizes, to check the harness")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.events, args.long, args.reads, args.reference_appends = 200, 1000, 5, 50
        args.retention_events = min(args.retention_events, 20_000)
    work = Path(tempfile.mkdtemp(prefix="adk-bench-"))
    report: dict[str, Any] = {"machine": machine(), "events": args.events, "long": args.long,
                              "streamd": {}, "adk_sqlite": None}
    try:
        for mode in args.modes.split(","):
            report["streamd"][mode] = asyncio.run(bench_streamd(work / f"{mode}.db", mode, args))
        if not args.no_reference:
            report["adk_sqlite"] = asyncio.run(bench_adk_sqlite(work / "adk.db", args))
        if args.retention_events:
            report["retention"] = bench_retention(work, args.retention_events)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0


def print_table(report: dict[str, Any]) -> None:
    n, long = report["events"], report["long"]
    rows = [
        ("append_event/s, in order, durable", "append_events_per_s", ">= 2,000"),
        ("append_event/s, in order, write-behind", "append_events_per_s_write_behind",
         ">= 2,000"),
        (f"get_session, {n} events, cold", "get_session_cold", "<= 20 ms"),
        (f"get_session, {n} events, warm", "get_session_warm", "<= 20 ms"),
        (f"num_recent_events=20 of {n}", "recent20_cold", "<= 2 ms"),
        (f"num_recent_events=20 of {long}", "recent20_of_long_cold", "<= 2 ms"),
    ]
    columns = [f"streamd {m}" for m in report["streamd"]] + (
        ["ADK SqliteSessionService"] if report["adk_sqlite"] else [])
    sources = list(report["streamd"].values()) + (
        [report["adk_sqlite"]] if report["adk_sqlite"] else [])
    print(f"{'measure':40} " + " ".join(f"{c:>26}" for c in columns) + "   target")
    for label, key, target in rows:
        cells = []
        for src in sources:
            v = src.get(key)
            if v is None:
                cells.append("-")
            elif isinstance(v, dict):
                cells.append(f"p50 {v['p50_ms']:.2f} / p95 {v['p95_ms']:.2f} ms")
            else:
                cells.append(f"{v:,.0f}/s")
        print(f"{label:40} " + " ".join(f"{c:>26}" for c in cells) + f"   {target}")
    r = report.get("retention")
    if r:
        print(f"compacting away {r['events']:,} events: the file went from"
              f" {r['bytes_filled'] / 1e6:.1f} MB to {r['bytes_after'] / 1e6:.1f} MB"
              f" (they took {r['bytes_the_events_took'] / 1e6:.1f} MB;"
              f" {100 * r['shrink_fraction_of_their_space']:.1f} % of it given back,"
              f" target >= 80 %) in {r['compact_s']:.1f} s")
    print(json.dumps(report["machine"]))


if __name__ == "__main__":
    sys.exit(main())
