"""Where the time of one durable ``append_event`` goes, part by part.

``adk_bench.py`` measures the whole call; this one takes it apart, each part
measured alone (median of ``--n`` runs, microseconds), on a ``streamd serve
--socket`` of its own, as the bench runs it:

* ``fsync``: one 4 KiB write appended to a file beside the database and
  ``os.fsync``; ``fdatasync_overwrite``: the same block rewritten in place and
  ``os.fdatasync``, as SQLite syncs its WAL: the floor a durable append cannot
  go under.
* ``model_dump``, ``log_event``, ``split_state``, ``encode``: the service's
  work before anything is sent (ADK's serialization of the event; the log event
  built from it; the state delta by prefix; msgspec's encoding of the params).
* ``rpc_round_trip``: ``eventlog/latest_seq`` with a session filter: the
  client, the socket, the daemon's decode and dispatch and one indexed read,
  no write.
* ``append_normal`` / ``append_full``: ``client.append`` of a ready log event,
  with ``synchronous=NORMAL`` (a WAL commit with no fsync) and ``FULL`` (an
  fsync per commit): the daemon's write path with and without the fsync.
* ``service_append_full``: ``StreamdSessionService.append_event`` on FULL, all
  of it.
* ``sqlite_commit_2_pages`` / ``sqlite_commit_8_pages``: a bare APSW commit in
  WAL mode, ``synchronous=FULL``, of one row into each of one or four indexed
  tables (2 or 8 dirty pages, an append writes about 8.5): whether the pages an
  append dirties, rather than its one fsync, set the commit's cost.
* ``ping_warm``, ``daemon_cpu_per_ping``: ``eventlog/ping`` on the open
  connection, its wall time and the daemon's CPU for it (``/proc``): the
  cheapest round trip through the daemon.
* ``floor_append``: ``sqlite_commit_8_pages`` + ``ping_warm``, what an awaited
  durable append through the daemon would cost if everything but the commit
  and the bare round trip were free, and ``floor_append_per_s`` the rate it
  allows.

    .venv/bin/python bench/adk_append_breakdown.py [--n 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from adk_bench import make_event

from streamd.adk import StreamdSessionService, codec
from streamd.client import AsyncClient
from streamd.errors import RpcError
from streamd.eventlog.model import AppendParams, Filter


def median_us(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


async def amedian_us(fn: Callable[[int], Awaitable[Any]], n: int) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        await fn(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def fsync_us(directory: Path, n: int) -> float:
    path = directory / "fsync.probe"
    with open(path, "wb") as f:
        block = b"x" * 4096

        def once() -> None:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())

        return median_us(once, n)


def fdatasync_overwrite_us(directory: Path, n: int) -> float:
    """4 KiB written over the same block and ``fdatasync``: how SQLite's WAL is
    written once it wraps (no file growth, so no metadata to sync)."""
    path = directory / "fdatasync.probe"
    with open(path, "wb") as f:
        block = b"y" * 4096
        f.write(block)
        f.flush()
        os.fsync(f.fileno())

        def once() -> None:
            os.pwrite(f.fileno(), block, 0)
            os.fdatasync(f.fileno())

        return median_us(once, n)


def bare_commit_us(directory: Path, tables: int, n: int) -> float:
    """A bare WAL commit (FULL) of one row into each of ``tables`` indexed tables."""
    import apsw

    db = apsw.Connection(str(directory / f"bare{tables}.db"))
    db.pragma("journal_mode", "wal")
    db.pragma("synchronous", "FULL")
    for t in range(tables):
        db.execute(f"CREATE TABLE t{t} (id INTEGER PRIMARY KEY, k TEXT, v TEXT)")
        db.execute(f"CREATE INDEX t{t}_k ON t{t} (k)")
    value = "v" * 400

    def once() -> None:
        with db:
            for t in range(tables):
                db.execute(f"INSERT INTO t{t} (k, v) VALUES (?, ?)", (os.urandom(8).hex(), value))

    try:
        return median_us(once, n)
    finally:
        db.close()


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve(db: Path, synchronous: str) -> tuple[subprocess.Popen[bytes], AsyncClient]:
    sock = str(db.with_suffix(".sock"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "serve", "--socket", sock, "--db", str(db),
         "--synchronous", synchronous], stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:  # the socket's file exists a moment before it listens
        try:
            return proc, await AsyncClient.connect_socket(sock)
        except RpcError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)


async def daemon_rows(work: Path, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for mode in ("NORMAL", "FULL"):
        out.update(await one_mode(work, mode, n))
    return out


async def one_mode(work: Path, mode: str, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    proc, client = await serve(work / f"{mode}.db", mode)
    try:
        async with client:
            await client.create_session("bench", "u", "s", {})
            events = [codec.log_event(make_event(i)) for i in range(n + 20)]
            for e in events[:20]:  # warm the daemon's paths
                await client.append("bench", "u", "s", e)
            out[f"append_{mode.lower()}"] = await amedian_us(
                lambda i: client.append("bench", "u", "s", events[20 + i]), n)
            flt = Filter(app="bench", user="u", session="s")
            out[f"rpc_round_trip_{mode.lower()}"] = await amedian_us(
                lambda i: client.latest_seq(flt), n)
            if mode == "FULL":
                out["ping_warm"] = await amedian_us(lambda i: client.ping(), n)
                before = cpu_seconds(proc.pid)
                for _ in range(n * 4):  # clock ticks are 10 ms: enough pings to count
                    await client.ping()
                out["daemon_cpu_per_ping"] = (cpu_seconds(proc.pid) - before) / (n * 4) * 1e6
                svc = StreamdSessionService(client)
                session = await svc.create_session(app_name="bench", user_id="u")
                adk_events = [make_event(i) for i in range(n)]
                out["service_append_full"] = await amedian_us(
                    lambda i: svc.append_event(session, adk_events[i]), n)
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=500)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="adk-append-"))
    try:
        event = make_event(5)  # one with a state delta
        delta = event.actions.state_delta
        params = AppendParams(app="bench", user="u", session="s", event=codec.log_event(event),
                              state_delta=codec.split_state(delta))
        encode = msgspec.json.Encoder().encode
        rows = {
            "fsync": fsync_us(work, args.n),
            "fdatasync_overwrite": fdatasync_overwrite_us(work, args.n),
            "model_dump": median_us(lambda: event.model_dump(mode="json", exclude_none=True),
                                    args.n),
            "log_event": median_us(lambda: codec.log_event(event), args.n),
            "split_state": median_us(lambda: codec.split_state(delta), args.n),
            "encode": median_us(lambda: encode(params), args.n),
        }
        rows["sqlite_commit_2_pages"] = bare_commit_us(work, 1, args.n)
        rows["sqlite_commit_8_pages"] = bare_commit_us(work, 4, args.n)
        rows.update(asyncio.run(daemon_rows(work, args.n)))
        rows["floor_append"] = rows["sqlite_commit_8_pages"] + rows["ping_warm"]
        rows["floor_append_per_s"] = 1e6 / rows["floor_append"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, value in rows.items():
        unit = "/s" if name.endswith("_per_s") else " us"
        print(f"{name:22} {value:9.1f}{unit}")
    print(f"{'load':22} {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
