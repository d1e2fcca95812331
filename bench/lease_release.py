"""How many held leases a close releases, and how soon.

A lease left in the store after its holder is gone locks its session until
its window passes: the next acquirer waits it out. For each ``N``
(``--leases``) this takes ``N`` leases (each a session of its own) on one
SQLite log and counts the rows left:

* **log close**: an ``EventLog`` in process, the leases taken with no
  nursery, closed with ``aclose``: the close releases what is still held
  within its grace (half a second), and the rows left are counted once it
  returns;
* **connections end** (``--daemon``): the leases taken through a ``streamd
  serve --socket`` daemon by connections of ``--per-connection`` leases each,
  which then all hang up at once; the file is read every 10 ms: the rows left
  half a second after, and how long until none is;
* **daemon stop** (``--daemon``): the same leases, then the daemon is sent
  SIGTERM with every connection still open: the rows left once it has exited.

Asserts nothing; uses only the public API and the wire, so the same command
runs on any version of ``src/``:

    python bench/lease_release.py --leases 100 1000 3000 --daemon
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import apsw
import trio
from server_daemons import Conn, wait_socket

from streamd.eventlog import EventLog

GRACE = 0.5
"""The log close's grace for releasing leases (``_CLOSE_GRACE``)."""
POLL = 0.01


def rows_left(path: str) -> int:
    db = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = db.execute("SELECT count(*) FROM leases").fetchone()
        return int(row[0]) if row else 0
    finally:
        db.close()


async def log_close(args: argparse.Namespace, n: int, tmp: Path) -> str:
    path = str(tmp / f"close-{n}.db")
    log = EventLog(path, synchronous=args.synchronous, retention_interval=0)
    async with log:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(lambda i=i: log.acquire_lock(
                    "bench", "u", f"s{i}", heartbeat_ms=args.heartbeat_ms,
                    stale_after_ms=args.stale_after_ms))
        held = rows_left(path)
        t0 = time.perf_counter()
        await log.aclose()
        took = time.perf_counter() - t0
    left = rows_left(path)
    return f"| log close | {n} | {held - left:,} of {held:,} | {left:,} | {took * 1e3:.0f} ms |"


def start(args: argparse.Namespace, path: str, state: Path) -> subprocess.Popen[bytes]:
    state.mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(state), "XDG_RUNTIME_DIR": str(state)}
    with open(state / "stderr.log", "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "streamd", "--db", path, "--synchronous", args.synchronous,
             "serve", "--socket", str(state / "sock")],
            env=env, stdin=subprocess.DEVNULL, stderr=stderr)


async def hold(args: argparse.Namespace, n: int, socket: Path) -> list[Conn]:
    """``n`` leases, taken by connections of ``--per-connection`` each."""
    per = args.per_connection
    holders = [await Conn.open(str(socket)) for _ in range(0, n, per)]
    for c, holder in enumerate(holders):
        for i in range(c * per, min(n, (c + 1) * per)):
            await holder.send("eventlog/lock.acquire", {
                "app": "bench", "user": "u", "session": f"s{i}",
                "heartbeat_ms": args.heartbeat_ms, "stale_after_ms": args.stale_after_ms})
    for c, holder in enumerate(holders):
        for _ in range(c * per, min(n, (c + 1) * per)):
            _, msg = await holder.frame()
            if "error" in msg:
                raise RuntimeError(msg["error"])
    return holders


async def connections_end(args: argparse.Namespace, n: int, tmp: Path) -> str:
    path, state = str(tmp / f"hangup-{n}.db"), tmp / f"hangup-{n}"
    proc = start(args, path, state)
    try:
        await wait_socket(state / "sock")
        holders = await hold(args, n, state / "sock")
        held = rows_left(path)
        t0 = time.perf_counter()
        for holder in holders:
            await holder.stream.aclose()
        at_grace, left = None, held
        while left and time.perf_counter() - t0 < args.wait:
            await trio.sleep(POLL)
            left = rows_left(path)
            if at_grace is None and time.perf_counter() - t0 >= GRACE:
                at_grace = left
        took = time.perf_counter() - t0
        at_grace = left if at_grace is None else at_grace
    finally:
        proc.terminate()
        proc.wait()
    all_gone = f"{took * 1e3:.0f} ms" if not left else f"{left:,} left after {args.wait:.0f} s"
    return (f"| connections end | {n} | {held - at_grace:,} of {held:,} in {GRACE} s"
            f" | {at_grace:,} | all released: {all_gone} |")


async def daemon_stop(args: argparse.Namespace, n: int, tmp: Path) -> str:
    path, state = str(tmp / f"stop-{n}.db"), tmp / f"stop-{n}"
    proc = start(args, path, state)
    try:
        await wait_socket(state / "sock")
        holders = await hold(args, n, state / "sock")
        held = rows_left(path)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        await trio.to_thread.run_sync(proc.wait)
        took = time.perf_counter() - t0
        del holders  # open until the daemon has gone
    finally:
        proc.kill()
        proc.wait()
    left = rows_left(path)
    return f"| daemon stop | {n} | {held - left:,} of {held:,} | {left:,} | {took * 1e3:.0f} ms |"


async def main(args: argparse.Namespace) -> None:
    print(f"synchronous={args.synchronous}; {args.per_connection} leases a connection;"
          f" load {os.getloadavg()[0]:.2f}")
    print("| close | leases | released | rows left | took |")
    print("| --- | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in args.leases:
            print(await log_close(args, n, Path(tmp)), flush=True)
            if args.daemon:
                print(await connections_end(args, n, Path(tmp)), flush=True)
                print(await daemon_stop(args, n, Path(tmp)), flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--per-connection", type=int, default=200)
    parser.add_argument("--heartbeat-ms", type=int, default=1000)
    parser.add_argument("--stale-after-ms", type=int, default=30_000)
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds to wait for the rows of connections that ended")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--daemon", action="store_true",
                        help="also through a `streamd serve --socket` daemon")
    parser.add_argument("--dir", default=None, help="where the temporary databases go")
    logging.getLogger("streamd").setLevel(logging.ERROR)
    trio.run(main, parser.parse_args())
