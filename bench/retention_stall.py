"""How long appends wait while retention compacts one big session.

Fills an event log (SQLite, or an empty PostgreSQL one given by ``--postgres``)
with one session of ``--events`` events (written long ago), sets a policy on
its app (``--policy max_events``: keep the newest 100; ``idle_s``: drop the
session), then runs ``compact`` while one appender sends appends to another
session one after the other, each waited for, and reports their latencies
during the compaction next to a baseline taken just before.
Asserts nothing; uses only the public EventLog API, so it runs on any version.

    python bench/retention_stall.py --events 300000 --policy max_events
    python bench/retention_stall.py --postgres postgresql://u@/db?host=/tmp
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from workload import CONTENT

from streamd.eventlog import EventLog
from streamd.eventlog.model import AppendParams, Event
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore

LONG_AGO_US = 1_500_000_000 * 1_000_000  # 2017: idle for any idle_s


def fill(where: str, n: int) -> None:
    store: Any
    if where.startswith("postgresql://"):
        from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

        store = PostgresStore.open(where, PostgresOptions(synchronous="NORMAL"))
    else:
        store = SqliteStore.open(where, SqliteOptions(synchronous="NORMAL"))
    try:
        for start in range(0, n, 2000):
            store.append_batch(
                [
                    AppendParams(app="bench", user="u", session="big",
                                 event=Event(id=f"big-{i}", author="agent", content=CONTENT))
                    for i in range(start, min(n, start + 2000))
                ],
                LONG_AGO_US,
            )
        if not where.startswith("postgresql://"):
            store.checkpoint()
    finally:
        store.close()


async def appends_until(
    log: EventLog, tag: str, done: trio.Event | None, count: int
) -> list[float]:
    """Latencies (s) of appends sent one at a time, until ``done`` (or ``count`` of them)."""
    got: list[float] = []
    i = 0
    while (done is None and i < count) or (done is not None and not done.is_set()):
        start = time.perf_counter()
        await log.append("bench", "u", "small", Event(id=f"{tag}-{i}", author="agent",
                                                      content=CONTENT))
        got.append(time.perf_counter() - start)
        i += 1
    return got


def row(name: str, lat: list[float]) -> str:
    lat = sorted(lat)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return (f"{name:<22} {len(lat):>7} {statistics.median(lat) * 1e3:>9.2f}"
            f" {p99 * 1e3:>9.2f} {lat[-1] * 1e3:>10.2f}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = args.postgres or str(Path(tmp) / "events.db")
        t = time.perf_counter()
        fill(path, args.events)
        print(f"filled {args.events} events in one session in {time.perf_counter() - t:.1f} s")
        async with EventLog(path, retention_interval=0, synchronous=args.synchronous) as log:
            baseline = await appends_until(log, "base", None, 500)
            if args.policy == "max_events":
                await log.set_retention("bench", max_events=100)
            else:
                await log.set_retention("bench", idle_s=60)
            done = trio.Event()
            during: list[float] = []
            async with trio.open_nursery() as nursery:

                async def appender() -> None:
                    during.extend(await appends_until(log, "during", done, 0))

                nursery.start_soon(appender)
                await trio.sleep(0.05)  # the appender is under way
                t = time.perf_counter()
                result = await log.compact(vacuum=args.vacuum)
                took = time.perf_counter() - t
                done.set()
        print(f"compact ({args.policy}, vacuum {args.vacuum}): {took:.2f} s,"
              f" {result.events_deleted} events and {result.sessions_deleted} sessions deleted")
        print(f"{'appends':<22} {'n':>7} {'p50 ms':>9} {'p99 ms':>9} {'worst ms':>10}")
        print(row("before compact", baseline))
        print(row("during compact", during))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--policy", choices=["max_events", "idle_s"], default="max_events")
    parser.add_argument("--vacuum", choices=["incremental", "none"], default="incremental")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--dir", default=None, help="where the temporary database goes")
    parser.add_argument("--postgres", default=None, metavar="URL",
                        help="an empty PostgreSQL event log to use instead of SQLite")
    trio.run(main, parser.parse_args())
