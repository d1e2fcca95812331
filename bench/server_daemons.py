"""Clients of ``streamd serve --socket`` daemons on one server-backed log, for
the PostgreSQL and MySQL benches: appends from many clients, ``since`` pages,
watch latency across daemons. Asserts nothing; each returns its measurement."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

__all__ = [
    "INFLIGHT", "Conn", "append_params", "append_rows", "appenders", "daemon", "machine",
    "since_rate", "two_daemons", "wait_socket", "watch_latency",
]

INFLIGHT = 200


class Conn:
    """One client of a daemon's socket: newline-delimited JSON-RPC."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.next_id = 0

    @classmethod
    async def open(cls, path: str) -> Conn:
        return cls(await trio.open_unix_socket(path))

    async def send(self, method: str, params: dict[str, Any]) -> int:
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        await self.stream.send_all(json.dumps(frame).encode() + b"\n")
        return self.next_id

    async def frame(self) -> tuple[float, dict[str, Any]]:
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(1 << 20)
            if not chunk:
                raise EOFError("daemon closed the connection")
            self.buf += chunk
        at = time.perf_counter()
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return at, msgspec.json.decode(line)  # as bench/eventlog_bench.py decodes

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        want = await self.send(method, params)
        while True:
            _, msg = await self.frame()
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]


def daemon(url: str, socket: Path, state: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "XDG_STATE_HOME": str(state), "XDG_RUNTIME_DIR": str(state)}
    return subprocess.Popen(
        [sys.executable, "-m", "streamd", "--db", url, "serve", "--socket", str(socket)],
        env=env, stdin=subprocess.DEVNULL, stderr=open(state / "stderr.log", "wb"),
    )


async def wait_socket(path: Path) -> None:
    with trio.fail_after(30):
        while True:
            try:
                c = await Conn.open(str(path))
            except OSError:
                await trio.sleep(0.05)
                continue
            await c.call("eventlog/ping", {})
            await c.stream.aclose()
            return


def append_params(i: str, session: str = "s") -> dict[str, Any]:
    return {"app": "bench", "user": "u", "session": session,
            "event": {"id": i, "author": "agent", "content": {"text": "x" * 100, "i": i}}}


async def appenders(sockets: list[Path], clients: int, per_client: int) -> float:
    conns = [await Conn.open(str(sockets[c % len(sockets)])) for c in range(clients)]
    prefix = f"a{clients}-{time.monotonic_ns()}"

    async def run(c: int, conn: Conn) -> None:
        sent = got = 0
        while got < per_client:
            while sent < per_client and sent - got < INFLIGHT:
                await conn.send("eventlog/append", append_params(f"{prefix}-{c}-{sent}", f"s{c}"))
                sent += 1
            _, msg = await conn.frame()
            if "error" in msg:
                raise RuntimeError(msg["error"])
            got += 1

    t = time.perf_counter()
    async with trio.open_nursery() as n:
        for c, conn in enumerate(conns):
            n.start_soon(run, c, conn)
    elapsed = time.perf_counter() - t
    for conn in conns:
        await conn.stream.aclose()
    return clients * per_client / elapsed


async def since_rate(socket: Path, total: int) -> float:
    conn = await Conn.open(str(socket))
    # Fill in batches of 500 (append_batch: one transaction each).
    for start in range(0, total, 500):
        await conn.call("eventlog/append_batch", {
            "appends": [append_params(f"since-{i}", f"s{i % 8}") for i in range(start, start + 500)]
        })
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        cursor, seen = 0, 0
        while True:
            page = await conn.call("eventlog/since", {"from_seq": cursor, "limit": 10_000})
            seen += len(page["entries"])
            cursor = page["next_seq"]
            if page["caught_up"]:
                break
        rates.append(seen / (time.perf_counter() - t))
    await conn.stream.aclose()
    return statistics.median(rates)


def _listener_phases(i: int) -> float:
    return 0.01 + (i % 7) * 0.003  # spread over a listener's idle phases


async def watch_latency(
    sockets: list[Path], samples: int, gap: Callable[[int], float] = _listener_phases
) -> dict[str, float]:
    """Time from sending an append to daemon B until daemon A's watcher gets
    its entry, ``samples`` times, ``gap(i)`` seconds apart."""
    watcher = await Conn.open(str(sockets[0]))
    appender = await Conn.open(str(sockets[1]))
    start = (await watcher.call("eventlog/latest_seq", {}))["seq"]
    await watcher.send("eventlog/watch", {"from_seq": start})
    lat = []
    for i in range(samples):
        t = time.perf_counter()
        await appender.send("eventlog/append", append_params(f"watch-{time.monotonic_ns()}-{i}"))
        while True:
            at, msg = await watcher.frame()
            if msg.get("method") == "eventlog/entry":
                lat.append((at - t) * 1000)
                break
        await appender.frame()  # its ack
        await trio.sleep(gap(i))
    return {"p50_ms": statistics.median(lat), "p95_ms": statistics.quantiles(lat, n=20)[18],
            "max_ms": max(lat)}


Daemons = tuple[list[Path], list[subprocess.Popen[bytes]]]


def two_daemons(root: Path, fresh: Callable[[str], str], name: str) -> Daemons:
    """Two ``streamd serve --socket`` daemons on ``fresh(name)`` (a new
    database's URL), each with a state directory of its own under ``root``."""
    db = fresh(name)
    sockets, procs = [], []
    for d in range(2):
        state = root / f"{name}-{d}"
        state.mkdir()
        sockets.append(state / "sock")
        procs.append(daemon(db, sockets[-1], state))
    return sockets, procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
        p.wait()


async def append_rows(start: Callable[[str], Daemons], quick: bool) -> dict[str, float]:
    """Appends/s from 1, 4 and 16 clients spread over two new daemons each time."""
    out: dict[str, float] = {}
    for clients in (1, 4, 16):
        sockets, procs = start(f"append{clients}")
        try:
            for s in sockets:
                await wait_socket(s)
            per = (2000 if quick else 10_000) // clients * (2 if clients == 1 else 1)
            await appenders(sockets, clients, 200)  # warm up
            out[f"append_{clients}_clients_2_daemons"] = await appenders(sockets, clients, per)
        finally:
            stop(procs)
    return out


def machine() -> dict[str, Any]:
    """Where and when a bench ran: Python, cores, platform, commit, load, date."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short",
             "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "commit": commit, "load": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d")}
