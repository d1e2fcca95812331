"""Measure how each dispatch moves store calls off the event loop.

``python -m streamd.eventlog.measure [--rounds N]`` prints, per dispatch, the
median over N rounds (rounds interleave the dispatches so drift in disk or CPU
load hits all of them alike) of: a trivial read (``ping``), one ``since`` page of
100 entries, one append waited for alone (so one transaction and one fsync each),
and the append rate of 64 concurrent appenders (group commit). The numbers quoted
in :mod:`streamd.eventlog.log` come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio

from streamd.eventlog.log import EventLog
from streamd.eventlog.model import Event

DISPATCHES = ("inline", "thread", "aio")


def _event(tag: str, i: int) -> Event:
    return Event(id=f"{tag}-{i}", author="bench", content={"i": i, "text": "x" * 100})


async def _client(log: EventLog, tag: str, each: int) -> None:
    for i in range(each):
        await log.append("bench", "u", "s", _event(tag, i))


async def measure_once(path: str, dispatch: str) -> dict[str, float]:
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
            await log.append("bench", "u", "s", _event("one", i))
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
                nursery.start_soon(_client, log, f"c{k}", each)
        row["group_commit_appends_per_s"] = clients * each / (time.perf_counter() - t)
    return row


async def measure(directory: str, rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[dict[str, float]]] = {d: [] for d in DISPATCHES}
    for r in range(rounds):
        order = DISPATCHES[r % 3 :] + DISPATCHES[: r % 3]
        for dispatch in order:
            samples[dispatch].append(
                await measure_once(os.path.join(directory, "measure.db"), dispatch)
            )
    return {
        d: {k: round(statistics.median(s[k] for s in rows), 1) for k in rows[0]}
        for d, rows in samples.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="directory for the scratch database")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        print(json.dumps(trio.run(measure, d, args.rounds), indent=2))


if __name__ == "__main__":
    main()
