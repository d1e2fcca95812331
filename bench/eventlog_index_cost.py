"""What indexing an event log costs per event, without the database or the daemon.

Fills a SQLite log with ``eventlog_source_bench``'s deterministic ADK-shaped
events (kept at ``--db`` and reused when it already holds ``--events``),
reads every row into memory once, then builds the index the way a source's
first build does (``LogIndex.consume`` a page of ``PAGE`` rows at a time,
then ``publish``), ``--rounds`` times. Prints the CPU time per event of the
process (every thread of the build; the figure to compare, since other jobs
on the machine move the wall clock far more than this) and of the calling
thread (the build's critical path), the wall clock and the rate.

    python bench/eventlog_index_cost.py --events 300000 --rounds 3

For ``perf record``, ``--rounds 1 --pause`` waits for a newline after the
rows are read, so the profile can be started on the indexing alone.
``--pages`` holds the rows as the SQLite store's reader hands them to a
source (``SqliteStore.event_page``: pages the compiled core read, where it
can) instead of APSW's tuples.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import apsw
import trio
from eventlog_source_bench import BATCH, event

from streamd.daemon import Config, Daemon
from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store import EventRows
from streamd.eventlog.store.reads import EVENT_ROW_COLUMNS
from streamd.recall.eventlog.build import LogIndex
from streamd.recall.eventlog.settings import LogSettings
from streamd.recall.eventlog.source import PAGE
from streamd.recall.index import native


def stored(db: Path) -> int:
    if not db.exists():
        return 0
    con = apsw.Connection(str(db))
    try:
        return int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])
    finally:
        con.close()


async def fill(db: Path, n: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    daemon = Daemon(Config(db=str(db), synchronous="NORMAL"))
    async with daemon.running():
        log = await daemon.eventlog()
        for lo in range(0, n, BATCH):
            await log.append_batch([event(rng, i) for i in range(lo, min(n, lo + BATCH))])


def rows_of(db: Path) -> list[tuple]:
    con = apsw.Connection(str(db))
    try:
        return list(con.execute(f"SELECT {EVENT_ROW_COLUMNS} FROM events ORDER BY seq"))
    finally:
        con.close()


def pages_of(db: Path) -> list[EventRows]:
    """Every row, in the pages a source's reader gets from the SQLite store."""
    store = SqliteStore.open(str(db))
    try:
        pages: list[EventRows] = []
        while page := store.event_page(pages[-1][len(pages[-1]) - 1][0] if pages else 0, PAGE):
            pages.append(page)
        return pages
    finally:
        store.close()


def build(pages: list[EventRows]) -> tuple[float, float, float, int]:
    """(CPU seconds of the process and of the calling thread, wall seconds,
    records) of one first build."""
    index = LogIndex(LogSettings(), time.time_ns)
    cpu, own, wall = time.process_time(), time.thread_time(), time.perf_counter()
    for page in pages:
        index.consume(page)
    generation = index.publish()
    return (time.process_time() - cpu, time.thread_time() - own, time.perf_counter() - wall,
            generation.indexed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=300_000)
    p.add_argument("--db", type=Path, default=Path("/tmp/eventlog-index-cost.db"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--pause", action="store_true", help="wait for a newline before building")
    p.add_argument("--pages", action="store_true",
                   help="rows as the SQLite store's event_page reads them, not APSW's tuples")
    args = p.parse_args(argv)
    if not native.enabled():
        print("the compiled core is not in use", file=sys.stderr)
    if stored(args.db) != args.events:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{args.db}{suffix}").unlink(missing_ok=True)
        trio.run(fill, args.db, args.events, args.seed)
    if args.pages:
        pages = pages_of(args.db)
    else:
        rows = rows_of(args.db)
        pages = [rows[lo:lo + PAGE] for lo in range(0, len(rows), PAGE)]
    n = sum(len(page) for page in pages)
    if args.pause:
        print(f"{n} rows read; press enter", file=sys.stderr)
        sys.stdin.readline()
    runs = []
    for _ in range(args.rounds):
        cpu, own, wall, records = build(pages)
        runs.append({"cpu_us_per_event": round(1e6 * cpu / n, 3),
                     "calling_thread_cpu_us_per_event": round(1e6 * own / n, 3),
                     "wall_s": round(wall, 3), "events_per_s": round(n / wall),
                     "records": records})
        print(json.dumps(runs[-1]), file=sys.stderr)
    print(json.dumps({
        "events": n,
        "cpu_us_per_event_median": statistics.median(r["cpu_us_per_event"] for r in runs),
        "events_per_s_median": statistics.median(r["events_per_s"] for r in runs),
        "runs": runs,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
