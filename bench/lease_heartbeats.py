"""What held leases cost the other clients of one SQLite event log.

Holds ``N`` leases (``--leases``, each a session of its own) at a short
heartbeat (``--heartbeat-ms``, 50 ms by default: the floor) on one log, and
for ``--seconds`` measures beside them:

* a concurrent appender: appends to another session sent one after the other,
  each waited for (p50 / p99 / worst latency, and how many per second);
* the heartbeats: beats per second against what the leases ask for (``N``
  per interval; in process only, from each lease's ``beats``), and the age of
  every lease's heartbeat as another connection reads the file every 100 ms
  (p50 / p99 / worst; "stale" is the share of ages past the window the
  leases promised, ``--stale-after-ms``: such a lease may be taken from its
  healthy holder);
* the CPU the log's process used (share of one core);
* in process, the heartbeats' store calls a second (``heartbeat_leases``).

``--distinct K`` gives the leases K heartbeat intervals, ``--heartbeat-ms``
plus 0 to K - 1 ms (lease ``i`` beats every ``heartbeat_ms + i % K``): nearly
equal intervals, each a cadence of its own.

In process (an ``EventLog``, the leases taken with no nursery, so they beat in
the log's own), and with ``--daemon`` also through a ``streamd serve
--socket`` daemon (one connection takes the leases, another appends; beats per
second are then not seen). Asserts nothing; uses only the public API and the
wire, so the same command runs on any version of ``src/``:

    python bench/lease_heartbeats.py --leases 0 300 1000 3000 --daemon
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import trio
from server_daemons import Conn, append_params, wait_socket

from streamd.eventlog import EventLog, Lease, SqliteStore
from streamd.eventlog.model import Event

CONTENT = {"text": "x" * 100}
PROBE_EVERY = 0.1
ACQUIRE_WINDOW = 200
"""Acquires one connection has in flight (the wire allows 256). All ``N`` are
asked for at once, so they queue on the writer ahead of the first beat: taken
in turns, each waited behind the beats of those already held, and 1,000
leases took minutes to take before the change."""


@dataclass
class Measured:
    appends: list[float] = field(default_factory=list)  # latencies, s
    ages_ms: list[float] = field(default_factory=list)
    beats: int | None = None
    calls: int | None = None  # heartbeat_leases calls (in process)
    cpu_s: float = 0.0
    seconds: float = 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probe_ages(path: str) -> list[float]:
    """Every lease's heartbeat age (ms), read from the file by a connection
    of its own (WAL: it never waits for the writer)."""
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        now_us = time.time() * 1e6
        return [(now_us - hb) / 1000 for hb, in db.execute("SELECT heartbeat_at FROM leases")]
    finally:
        db.close()


async def probe(path: str, until: trio.Event, ages: list[float]) -> None:
    while not until.is_set():
        ages.extend(await trio.to_thread.run_sync(probe_ages, path))
        with trio.move_on_after(PROBE_EVERY):
            await until.wait()


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def in_process(args: argparse.Namespace, n: int, tmp: Path) -> Measured:
    path = str(tmp / f"inproc-{n}.db")
    got = Measured()
    async with EventLog(path, synchronous=args.synchronous, retention_interval=0) as log:
        await log.append("bench", "u", "appender", Event(id="warm", author="a", content=CONTENT))
        leases: list[Lease] = []

        async def take(i: int) -> None:
            leases.append(await log.acquire_lock(
                "bench", "u", f"leased-{i}", heartbeat_ms=interval_ms(args, i),
                stale_after_ms=args.stale_after_ms))

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(take, i)
        await trio.sleep(args.warmup)
        done = trio.Event()
        real_beat, calls = SqliteStore.heartbeat_leases, [0]

        def counted(store: SqliteStore, *args: Any) -> Any:
            calls[0] += 1
            return real_beat(store, *args)

        SqliteStore.heartbeat_leases = counted  # type: ignore[method-assign]
        beats0, cpu0, t0 = sum(x.beats for x in leases), time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe, path, done, got.ages_ms)
            i = 0
            while time.perf_counter() - t0 < args.seconds:
                start = time.perf_counter()
                await log.append("bench", "u", "appender",
                                 Event(id=f"e{i}", author="a", content=CONTENT))
                got.appends.append(time.perf_counter() - start)
                i += 1
            done.set()
        got.seconds = time.perf_counter() - t0
        got.cpu_s = time.process_time() - cpu0
        got.beats = sum(x.beats for x in leases) - beats0
        got.calls = calls[0]
        SqliteStore.heartbeat_leases = real_beat  # type: ignore[method-assign]
    return got  # the close released the leases (or tried to, for half a second)


async def through_daemon(args: argparse.Namespace, n: int, tmp: Path) -> Measured:
    path, state = str(tmp / f"daemon-{n}.db"), tmp / f"state-{n}"
    state.mkdir()
    socket = state / "sock"
    env = {**os.environ, "XDG_STATE_HOME": str(state), "XDG_RUNTIME_DIR": str(state)}
    with open(state / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamd", "--db", path, "--synchronous", args.synchronous,
             "serve", "--socket", str(socket)],
            env=env, stdin=subprocess.DEVNULL, stderr=stderr)
    got = Measured()
    try:
        await wait_socket(socket)
        appender = await Conn.open(str(socket))
        holders = [await Conn.open(str(socket)) for _ in range(0, n, ACQUIRE_WINDOW)]
        for c, holder in enumerate(holders):
            for i in range(c * ACQUIRE_WINDOW, min(n, (c + 1) * ACQUIRE_WINDOW)):
                await holder.send("eventlog/lock.acquire", {
                    "app": "bench", "user": "u", "session": f"leased-{i}",
                    "heartbeat_ms": interval_ms(args, i), "stale_after_ms": args.stale_after_ms})
        for c, holder in enumerate(holders):
            for _ in range(c * ACQUIRE_WINDOW, min(n, (c + 1) * ACQUIRE_WINDOW)):
                _, msg = await holder.frame()
                if "error" in msg:
                    raise RuntimeError(msg["error"])
        await appender.call("eventlog/append", append_params("warm", "appender"))
        await trio.sleep(args.warmup)
        done = trio.Event()
        cpu0, t0 = proc_cpu(proc.pid), time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe, path, done, got.ages_ms)
            i = 0
            while time.perf_counter() - t0 < args.seconds:
                start = time.perf_counter()
                await appender.call("eventlog/append", append_params(f"e{i}", "appender"))
                got.appends.append(time.perf_counter() - start)
                i += 1
            done.set()
        got.seconds = time.perf_counter() - t0
        got.cpu_s = proc_cpu(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait()
    return got


def interval_ms(args: argparse.Namespace, i: int) -> int:
    return int(args.heartbeat_ms + i % args.distinct)


def row(where: str, n: int, args: argparse.Namespace, m: Measured) -> str:
    lat = [x * 1e3 for x in m.appends]
    asked = sum(m.seconds / (interval_ms(args, i) / 1000) for i in range(n))
    calls = "-" if m.calls is None else f"{m.calls / m.seconds:,.0f}"
    beats = "-" if m.beats is None or not n else f"{100 * m.beats / asked:.0f}%"
    if m.ages_ms:
        ages = (f"{statistics.median(m.ages_ms):.0f} / {percentile(m.ages_ms, 0.99):.0f}"
                f" / {max(m.ages_ms):.0f}")
        stale = sum(a > args.stale_after_ms for a in m.ages_ms) / len(m.ages_ms)
        stale_s = f"{100 * stale:.1f}%"
    else:
        ages, stale_s = "-", "-"
    return (f"| {where} | {n} | {len(lat) / m.seconds:,.0f} | {statistics.median(lat):.2f}"
            f" / {percentile(lat, 0.99):.2f} / {max(lat):.2f} | {beats} | {ages} | {stale_s}"
            f" | {100 * m.cpu_s / m.seconds:.0f}% | {calls} |")


async def main(args: argparse.Namespace) -> None:
    spread = f"-{args.heartbeat_ms + args.distinct - 1}" if args.distinct > 1 else ""
    print(f"leases beat every {args.heartbeat_ms}{spread} ms, promise {args.stale_after_ms} ms;"
          f" synchronous={args.synchronous}; {args.seconds} s measured per row;"
          f" load {os.getloadavg()[0]:.2f}")
    print("| where | leases | appends/s | append p50 / p99 / worst ms | beats of asked"
          " | heartbeat age p50 / p99 / worst ms | stale | CPU | beat calls/s |")
    print("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in args.leases:
            print(row("in process", n, args, await in_process(args, n, Path(tmp))), flush=True)
            if args.daemon:
                print(row("daemon", n, args, await through_daemon(args, n, Path(tmp))),
                      flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, nargs="+", default=[0, 300, 1000, 3000])
    parser.add_argument("--heartbeat-ms", type=int, default=50)
    parser.add_argument("--distinct", type=int, default=1,
                        help="heartbeat intervals in use (heartbeat_ms plus 0 to K - 1 ms)")
    parser.add_argument("--stale-after-ms", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds the leases beat before the measure starts")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--daemon", action="store_true",
                        help="also through a `streamd serve --socket` daemon")
    parser.add_argument("--dir", default=None, help="where the temporary databases go")
    # A late beat's warning, once per lease per beat: thousands a second.
    logging.getLogger("streamd").setLevel(logging.ERROR)
    trio.run(main, parser.parse_args())
