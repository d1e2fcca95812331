"""Google ADK's session API on streamd, measured the way ADK's agent loop uses it.

Everything goes through ``streamd.adk.StreamdSessionService`` (ADK's
``BaseSessionService`` methods) to a real ``streamd serve --socket`` process (a
Unix socket, as the resident daemon serves), on a fresh database per
synchronous mode. Like the other benches this asserts
nothing: it prints a table (the issue's targets beside the numbers) and writes
JSON. Rows:

* The three targets, side by side with ADK's own ``SqliteSessionService``
  (aiosqlite) in one run, in alternating rounds (``--rounds``, medians), for
  streamd through a daemon with ``synchronous=FULL`` and for streamd in the
  bench's own process (``StreamdSessionService(database=...)``, FULL; its cold
  service joins the file the long-lived in-process service holds open, as the
  daemon's cold client joins the daemon's; the same reads on a copy of the
  file that nothing holds open, so that each cold service opens it inside the
  timed call, are printed beside them as the file's first open):

  - append_event/s: one session, events appended in order, each awaited
    before the next (as the runner does: it appends an event, yields it, goes
    on); durable: each acknowledged only after its commit. The events are
    built before the clock starts (building one costs ADK ~90 us, the same
    for every service); ~200 bytes of text each, every fifth with a state
    delta (session and ``user:`` keys). Target: at least 5x ADK's rate.
  - get_session of a 2,000-event session, cold: a newly built service with
    its own new client (ADK: a new ``SqliteSessionService``), connecting
    inside the timed call, nothing cached. Target: at most 1/4 of ADK's time.
  - get_session with ``num_recent_events=20`` on that session, cold the same
    way. Target: at most 1/4 of ADK's time.

* The floor under a durable append on this disk: ``fdatasync`` after a 4 KiB
  overwrite, and a bare one-row SQLite commit in WAL with
  ``synchronous=FULL`` (APSW, no daemon), each with the rate it allows.
* Secondary rows, streamd only: get_session warm (the service that loaded it
  before: the runner's pattern, one load per turn), ``num_recent_events=20``
  on a session ``--long`` events long (default 20,000: the bound must not
  grow with the session), ``synchronous=NORMAL``, and write-behind
  (``write_behind=True``: each append returns once queued; the time includes
  the final ``flush()``).
* Retention (``--retention-events``, default 1,000,000): a log of 1,000 kept
  sessions' events is measured, then that many more events (~500 bytes each,
  in 1,000 sessions of another app, timestamped in 2020) are written and
  measured again; a policy dropping events older than a day is applied
  through ``eventlog/compact`` on a ``streamd serve`` of the file, and the file
  (with its WAL) measured a third time. The shrink is reported against the
  space those events took.

    .venv/bin/python bench/adk_bench.py [--events 2000] [--rounds 5] [--long 20000]
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.genai import types

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient
from streamd.errors import RpcError

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


async def append_rate(svc: BaseSessionService, session: Any, events: list[Event]) -> float:
    start = time.perf_counter()
    for event in events:
        await svc.append_event(session, event)
    return len(events) / (time.perf_counter() - start)


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


async def cold_get(
    new_service: Callable[[], Awaitable[tuple[BaseSessionService, Callable[[], Awaitable[None]]]]],
    session_id: str, config: GetSessionConfig | None, expect: int,
) -> float:
    """One get_session on a service built (and connected) inside the timing."""
    t = time.perf_counter()
    svc, close = await new_service()
    got = await svc.get_session(app_name="bench", user_id="u", session_id=session_id,
                                config=config)
    ms = (time.perf_counter() - t) * 1000
    assert got is not None and len(got.events) == expect, (len(got.events), expect)
    await close()
    return ms


async def fill_fast(client: AsyncClient, session_id: str, n: int) -> None:
    """A long session, written with appends pipelined (its writing is not measured)."""
    from streamd.adk.codec import log_event

    for start in range(0, n, 500):
        await asyncio.gather(*(
            client.append("bench", "u", session_id, log_event(make_event(i)))
            for i in range(start, min(n, start + 500))
        ))


class Daemon:
    """``streamd serve --socket`` on a fresh database, for the life of a block."""

    def __init__(self, db: Path, synchronous: str) -> None:
        self.db, self.synchronous = db, synchronous
        self.sock = str(db.with_suffix(".sock"))

    async def __aenter__(self) -> Daemon:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "serve", "--socket", self.sock, "--db",
             str(self.db), "--synchronous", self.synchronous],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:  # polling a process's start-up: there is no event to wait on
            try:
                client = await AsyncClient.connect_socket(self.sock)
                await client.aclose()
                return self
            except RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("streamd serve did not start") from None
                await asyncio.sleep(0.02)

    async def __aexit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def side_by_side(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The three targets, streamd (FULL) through its daemon and in process, and
    ADK's SqliteSessionService, in alternating rounds."""
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    adk_db = str(work / "adk.db")
    local_db = str(work / "local.db")
    n, r = args.events, args.reference_appends
    first_db = str(work / "local-first.db")
    names = ("streamd", "local", "local_first", "adk_sqlite")
    got: dict[str, dict[str, list[float]]] = {
        name: {"append": [], "cold": [], "recent": []} for name in names}
    recent = GetSessionConfig(num_recent_events=20)
    async with Daemon(work / "full.db", "FULL") as daemon:
        client = await AsyncClient.connect_socket(daemon.sock)
        services: dict[str, BaseSessionService] = {
            "streamd": StreamdSessionService(client),
            "local": StreamdSessionService(database=local_db),
            "adk_sqlite": SqliteSessionService(adk_db),
        }
        sessions = {name: await svc.create_session(app_name="bench", user_id="u", session_id="s")
                    for name, svc in services.items()}
        # Rounds alternate so that the machine's load falls on all alike.
        per_round = max(1, n // args.rounds)
        for rnd in range(args.rounds):
            base = rnd * per_round
            for name, svc in services.items():
                count = min(r, per_round) if name == "adk_sqlite" else per_round
                events = [make_event(base + i) for i in range(count)]
                got[name]["append"].append(await append_rate(svc, sessions[name], events))
        # The rest of each session, unmeasured, so all read the same length.
        for name, svc in services.items():
            for i in range(len(sessions[name].events), n):
                await svc.append_event(sessions[name], make_event(i))

        async def new_streamd() -> tuple[BaseSessionService, Callable[[], Awaitable[None]]]:
            c = await AsyncClient.connect_socket(daemon.sock)
            return StreamdSessionService(c), c.aclose

        async def new_local() -> tuple[BaseSessionService, Callable[[], Awaitable[None]]]:
            s = StreamdSessionService(database=local_db)
            return s, s.close

        async def new_first() -> tuple[BaseSessionService, Callable[[], Awaitable[None]]]:
            s = StreamdSessionService(database=first_db)
            return s, s.close

        async def new_adk() -> tuple[BaseSessionService, Callable[[], Awaitable[None]]]:
            s = SqliteSessionService(adk_db)
            return s, s.close

        copy_database(local_db, first_db)
        makers = {"streamd": new_streamd, "local": new_local, "local_first": new_first,
                  "adk_sqlite": new_adk}
        for _ in range(args.rounds):
            for name, make in makers.items():
                got[name]["cold"].append(await cold_get(make, "s", None, n))
            for name, make in makers.items():
                got[name]["recent"].append(await cold_get(make, "s", recent, 20))
        warm = summary(await timed_gets(services["streamd"], "s", args.reads, None, n))
        await services["local"].close()  # type: ignore[attr-defined]
        await client.aclose()
    med = statistics.median
    result: dict[str, Any] = {"rounds": args.rounds}
    for name in names:
        result[name] = {"get_session_cold": summary(got[name]["cold"]),
                        "recent20_cold": summary(got[name]["recent"])}
        if got[name]["append"]:
            result[name]["append_events_per_s"] = round(med(got[name]["append"]), 1)
            result[name]["append_rounds"] = [round(x) for x in got[name]["append"]]
    result["streamd"]["get_session_warm"] = warm
    result["adk_sqlite"]["appends_per_round"] = min(r, per_round)
    theirs = got["adk_sqlite"]
    for name, key in (("streamd", "ratios"), ("local", "ratios_in_process"),
                      ("local_first", "ratios_first_open")):
        ours = got[name]
        result[key] = {
            "get_session_cold_time": round(med(ours["cold"]) / med(theirs["cold"]), 3),
            "recent20_cold_time": round(med(ours["recent"]) / med(theirs["recent"]), 3),
        }
        if ours["append"]:
            result[key]["append_rate"] = round(med(ours["append"]) / med(theirs["append"]), 2)
    return result


def copy_database(source: str, target: str) -> None:
    """A copy of a log file as of one commit (``streamd log backup``'s)."""
    import apsw

    from streamd.eventlog.sqlite.backup import snapshot

    live = apsw.Connection(source)
    snapshot(live, target)
    live.close()


async def secondary(db: Path, synchronous: str, args: argparse.Namespace) -> dict[str, Any]:
    """streamd alone: the append rate, write-behind, and the long session's bound."""
    async with Daemon(db, synchronous) as daemon:
        client = await AsyncClient.connect_socket(daemon.sock)
        async with client:
            svc = StreamdSessionService(client)
            session = await svc.create_session(app_name="bench", user_id="u", session_id="s")
            events = [make_event(i) for i in range(args.events)]
            result: dict[str, Any] = {
                "append_events_per_s": round(await append_rate(svc, session, events), 1)}
            behind = StreamdSessionService(client, write_behind=True)
            session = await behind.create_session(
                app_name="bench", user_id="u", session_id="behind")
            start = time.perf_counter()
            for event in [make_event(i) for i in range(args.events)]:
                await behind.append_event(session, event)
            await behind.flush()
            result["append_events_per_s_write_behind"] = round(
                args.events / (time.perf_counter() - start), 1)
            await svc.create_session(app_name="bench", user_id="u", session_id="long")
            await fill_fast(client, "long", args.long)
            cold = StreamdSessionService(client, event_cache=0)
            recent = GetSessionConfig(num_recent_events=20)
            result["recent20_of_long"] = summary(
                await timed_gets(cold, "long", args.reads, recent, 20))
            return result


def disk_floor(work: Path, n: int = 300) -> dict[str, Any]:
    """What a durable append cannot go below on this disk."""
    import apsw

    path = work / "fsync.probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    block = b"x" * 4096
    os.pwrite(fd, block * 16, 0)
    os.fsync(fd)
    syncs = []
    for i in range(n):
        os.pwrite(fd, block, (i % 16) * 4096)
        t = time.perf_counter()
        os.fdatasync(fd)
        syncs.append((time.perf_counter() - t) * 1000)
    os.close(fd)
    db = apsw.Connection(str(work / "floor.db"))
    db.pragma("journal_mode", "wal")
    db.pragma("synchronous", "FULL")
    db.execute("CREATE TABLE t (x TEXT)")
    commits = []
    for _ in range(n):
        t = time.perf_counter()
        with db:
            db.execute("INSERT INTO t VALUES (?)", (TEXT,))
        commits.append((time.perf_counter() - t) * 1000)
    db.close()
    fsync_ms, commit_ms = statistics.median(syncs), statistics.median(commits)
    return {"fdatasync": summary(syncs), "fdatasync_allows_per_s": round(1000 / fsync_ms),
            "sqlite_wal_full_commit": summary(commits),
            "sqlite_commit_allows_per_s": round(1000 / commit_ms)}


def bench_retention(root: Path, n: int) -> dict[str, Any]:
    from streamd.eventlog.model import AppendParams
    from streamd.eventlog.model import Event as LogEvent
    from streamd.eventlog.sqlite import SqliteOptions, SqliteStore

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
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--long", type=int, default=20_000)
    p.add_argument("--reads", type=int, default=20)
    p.add_argument("--reference-appends", type=int, default=200,
                   help="appends measured per round on ADK's SqliteSessionService")
    p.add_argument("--modes", default="FULL,NORMAL",
                   help="synchronous modes of the streamd-only rows")
    p.add_argument("--retention-events", type=int, default=1_000_000,
                   help="events compacted away in the retention row (0: skip it)")
    p.add_argument("--quick", action="store_true", help="small sizes, to check the harness")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.events, args.long, args.reads, args.reference_appends = 200, 1000, 5, 20
        args.rounds = 3
        args.retention_events = min(args.retention_events, 20_000)
    work = Path(tempfile.mkdtemp(prefix="adk-bench-"))
    report: dict[str, Any] = {"machine": machine(), "events": args.events, "long": args.long,
                              "streamd": {}}
    try:
        report["disk"] = disk_floor(work)
        report["side_by_side"] = asyncio.run(side_by_side(work, args))
        for mode in filter(None, args.modes.split(",")):
            report["streamd"][mode] = asyncio.run(secondary(work / f"{mode}.db", mode, args))
        if args.retention_events:
            report["retention"] = bench_retention(work, args.retention_events)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):
        return f"p50 {v['p50_ms']:.2f} ms"
    return f"{v:,.0f}/s"


def print_table(report: dict[str, Any]) -> None:
    n, long = report["events"], report["long"]
    d = report["disk"]
    print(f"disk: fdatasync p50 {d['fdatasync']['p50_ms']:.3f} ms (at most"
          f" {d['fdatasync_allows_per_s']:,}/s durable awaited appends); a bare SQLite WAL"
          f" commit, synchronous=FULL, p50 {d['sqlite_wal_full_commit']['p50_ms']:.3f} ms"
          f" ({d['sqlite_commit_allows_per_s']:,}/s)")
    sb = report["side_by_side"]
    ours, local, theirs = sb["streamd"], sb["local"], sb["adk_sqlite"]
    ratio, ratio_local = sb["ratios"], sb["ratios_in_process"]
    print(f"side by side, {sb['rounds']} alternating rounds, medians; streamd synchronous=FULL,"
          " through its daemon and in process (database=)")
    print(f"{'measure':44} {'streamd':>16} {'in process':>16} {'ADK Sqlite':>16}"
          f" {'ratio':>7} {'in proc':>7}   target")
    rows = [
        ("append_event/s, in order, each awaited", "append_events_per_s", "append_rate", "x",
         ">= 5x"),
        (f"get_session, {n} events, cold", "get_session_cold", "get_session_cold_time", "",
         "<= 0.25"),
        ("get_session, num_recent_events=20, cold", "recent20_cold", "recent20_cold_time", "",
         "<= 0.25"),
    ]
    for label, key, rkey, unit, target in rows:
        print(f"{label:44} {_cell(ours[key]):>16} {_cell(local[key]):>16}"
              f" {_cell(theirs[key]):>16} {ratio[rkey]:>6.2f}{unit or ' '}"
              f" {ratio_local[rkey]:>6.2f}{unit or ' '}   {target}")
    first, ratio_first = sb["local_first"], sb["ratios_first_open"]
    print(f"in process, the file's first open in the process (nothing holds it open):"
          f" get_session, {n} events, cold {_cell(first['get_session_cold'])}"
          f" ({ratio_first['get_session_cold_time']:.2f}); num_recent_events=20, cold"
          f" {_cell(first['recent20_cold'])} ({ratio_first['recent20_cold_time']:.2f})")
    print(f"{'get_session, ' + str(n) + ' events, warm':44} {_cell(ours['get_session_warm']):>16}")
    for mode, row in report["streamd"].items():
        print(f"streamd {mode}: append {_cell(row['append_events_per_s'])}, write-behind"
              f" {_cell(row['append_events_per_s_write_behind'])}, num_recent_events=20 of"
              f" {long}: {_cell(row['recent20_of_long'])}")
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
