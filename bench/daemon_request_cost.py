"""What one request costs the daemon, on a connection of its own or on one kept open.

    python bench/daemon_request_cost.py [--events 2000] [--requests 1000]

A ``streamd serve --socket`` on a fresh database holds one session of
``--events`` ADK-shaped events (``adk_bench.py``'s). A blocking client, no
event loop of its own, sends each request and reads its answer; the daemon's CPU
(user and system, ``/proc/PID/stat``) and the wall time are divided by the
number of requests. Rows:

* ``connect``: connect and close, no request (what accepting and ending a
  connection costs the daemon);
* ``ping``: ``eventlog/ping``;
* ``recent20``: ``eventlog/sessions.get`` of the session's newest 20 events, as
  ``StreamdSessionService`` asks for ``num_recent_events=20``;
* ``whole``: the whole session (every tenth request count, it is large);
* ``append``: ``eventlog/append`` of one ADK-shaped event, written by the first
  request and a duplicate for the rest: the path every append takes (its frame
  weighed, decoded, queued to the writer, checked against the log) without an
  fsync a request.

each on a new connection per request and on one connection kept open. It says
what a cold ``get_session`` pays the daemon beyond the read itself. Below them,
the floor: the same connect and ping against a bare Trio server
(``trio_floor.py``: a fixed answer to every line, nothing parsed, no task per
request), what Trio and the kernel alone cost on this machine. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
from adk_append_breakdown import cpu_seconds
from adk_bench import Daemon, fill_fast, make_event

from streamd.adk import StreamdSessionService
from streamd.adk.codec import log_event
from streamd.client import AsyncClient


def frame(method: str, params: dict[str, object]) -> bytes:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return json.dumps(body).encode() + b"\n"


def ask(sock: socket.socket, request: bytes) -> None:
    sock.sendall(request)
    got = bytearray()
    while not got.endswith(b"\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("the daemon closed the connection")
        got += chunk
    if b'"error"' in got[:200]:
        raise RuntimeError(got[:200].decode())


def measure(pid: int, path: str, request: bytes | None, fresh: bool, n: int) -> tuple[float, float]:
    """Daemon CPU and wall time per request, in microseconds."""
    kept: socket.socket | None = None
    cpu, wall = cpu_seconds(pid), time.perf_counter()
    for _ in range(n):
        if fresh or kept is None:
            if kept is not None:
                kept.close()
            kept = socket.socket(socket.AF_UNIX)
            kept.connect(path)
        if request is not None:
            ask(kept, request)
    if kept is not None:
        kept.close()
    wall = time.perf_counter() - wall
    time.sleep(0.2)  # the daemon finishes closing the last connection
    return (cpu_seconds(pid) - cpu) / n * 1e6, wall / n * 1e6


async def fill(path: str, events: int) -> None:
    client = await AsyncClient.connect_socket(path)
    try:
        svc = StreamdSessionService(client)
        await svc.create_session(app_name="bench", user_id="u", session_id="s")
        await fill_fast(client, "s", events)
    finally:
        await client.aclose()


def floor(path: Path, n: int) -> None:
    """The rows of a bare Trio server (``trio_floor.py``) on ``path``."""
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("trio_floor.py")),
                               str(path)])
    try:
        deadline = time.monotonic() + 30
        while not path.exists():  # a process's start-up: there is no event to wait on
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("trio_floor.py did not start")
            time.sleep(0.02)
        for name, request, fresh in (("connect", None, True),
                                     ("ping", frame("eventlog/ping", {}), True),
                                     ("ping", frame("eventlog/ping", {}), False)):
            cpu, wall = measure(server.pid, str(path), request, fresh, n)
            kind = "new" if fresh else "kept open"
            print(f"{'floor ' + name:10} {kind:10} {cpu:14.0f} {wall:10.0f}")
    finally:
        server.terminate()
        server.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--requests", type=int, default=1000)
    args = p.parse_args(argv)
    session = {"app": "bench", "user": "u", "session": "s", "scoped_state": True,
               "content": True, "event_time": True}
    requests: list[tuple[str, bytes | None, int]] = [
        ("connect", None, args.requests),
        ("ping", frame("eventlog/ping", {}), args.requests),
        ("recent20", frame("eventlog/sessions.get", {**session, "recent": 20}), args.requests),
        ("whole", frame("eventlog/sessions.get", session), max(1, args.requests // 10)),
        ("append", frame("eventlog/append", {
            "app": "bench", "user": "u", "session": "s",
            "event": msgspec.json.decode(msgspec.json.encode(log_event(make_event(0))))}),
         args.requests),
    ]
    with tempfile.TemporaryDirectory(prefix="request-cost-") as work:
        daemon = Daemon(Path(work) / "log.db", "FULL")

        async def start() -> None:
            await daemon.__aenter__()
            await fill(daemon.sock, args.events)

        asyncio.run(start())
        try:
            print(f"{'request':10} {'connection':10} {'daemon CPU us':>14} {'wall us':>10}")
            for name, request, n in requests:
                for fresh in (True, False):
                    if name == "connect" and not fresh:
                        continue
                    cpu, wall = measure(daemon.proc.pid, daemon.sock, request, fresh, n)
                    kind = "new" if fresh else "kept open"
                    print(f"{name:10} {kind:10} {cpu:14.0f} {wall:10.0f}")
        finally:
            asyncio.run(daemon.__aexit__())
        floor(Path(work) / "floor.sock", args.requests)
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
