"""What clients that send and never read can make a daemon hold, in RSS.

    python bench/held_memory.py params [--connections 1] [--frames 16] [--method append]
                                       [--max-held-bytes BYTES]
                                       [--frame-bytes 8388608]
    python bench/held_memory.py watches [--connections 1] [--watches 256]
    python bench/held_memory.py answers [--connections 1] [--frames 16] [--method since]
                                        [--records 10000] [--max-candidates N]

Starts ``streamd serve --socket`` on a fresh SQLite log (``--synchronous NORMAL``:
the writer's fsyncs are not what is measured), reads its RSS once the log is open,
then:

* ``params``: each of ``--connections`` pipelines ``--frames`` requests of
  ``--frame-bytes`` (8 MiB) made of small containers and reads no answer. ``--method append``: an
  ``eventlog/append`` whose ``content`` is ``[{},{},...]`` (refused as too large
  once decoded: what it costs is the decoding); ``--method watch``: an
  ``eventlog/watch`` whose ``filter.branch_prefixes`` is ``["a","a",...]`` (held for
  the watch's life).
* ``answers``: ``--method since``: a log of ``--records`` events of 1 KiB,
  and each connection pipelines ``--frames`` ``eventlog/since`` of all of
  them (pages of 4 MiB, the reply budget) and reads nothing; ``--method
  search``: a JSONL stream of ``--records`` records of 1 KiB, each connection
  initializes it with ``--max-candidates`` (default 10,000: answers of about
  5 MiB), then pipelines ``--frames`` searches matching every record and
  reads nothing. ``--connections 1 --frames 1 --max-candidates 1000000000``
  measures one search whose answer passes the 8 MiB frame.
* ``watches``: a log of ``--history-mib`` of 4 KiB events, a writer appending
  more throughout, and ``--watches`` watches from seq 0 on each of
  ``--connections``, none of them read.

``--max-held-bytes`` is passed to the daemon (its own default otherwise).
RSS is sampled every 0.2 s for ``--seconds``; printed: the RSS before, the
highest sampled, the process's peak (``VmHWM``) and what the daemon answered the
first request of each connection with, when it did. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def status(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` size, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def request(rid: int, method: str, params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                       "params": params}).encode() + b"\n"


def padded(rid: int, method: str, params: dict[str, object], item: bytes, size: int) -> bytes:
    """A request whose ``"@"`` is replaced by a list of ``item``, ``size`` bytes long."""
    head, tail = request(rid, method, params).split(b'"@"')
    count = (size - len(head) - len(tail)) // (len(item) + 1)
    return head + b"[" + b",".join([item] * count) + b"]" + tail


def recall_stream(directory: Path, records: int) -> None:
    """A JSONL stream of ``records`` records of about 1 KiB, all matching "adapter"."""
    lines = [json.dumps({"schema": 2, "id": f"r{i}", "event_time": "2026-05-02T10:00:00Z",
                         "title": f"adapter record {i}",
                         "text": "adapter " + "lorem ipsum " * 80}).encode() + b"\n"
             for i in range(records)]
    directory.mkdir()
    (directory / "a.jsonl").write_bytes(b"".join(lines))


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    return sock


def ask(path: str, frame: bytes) -> dict[str, object]:
    with connect(path) as sock:
        sock.sendall(frame)
        got = b""
        while not got.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("the daemon closed the connection")
            got += chunk
    answer: dict[str, object] = json.loads(got.splitlines()[0])
    return answer


class Flood(threading.Thread):
    """One connection sending its frames and never reading (after the
    answer to ``first``, when given)."""

    def __init__(self, path: str, frames: list[bytes], first: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.sock = connect(path)
        self.frames = frames
        if first is not None:
            self.sock.sendall(first)
            got = b""
            while not got.endswith(b"\n"):
                got += self.sock.recv(1 << 16)
            if b'"result"' not in got:
                raise RuntimeError(got.decode(errors="replace")[:300])

    def run(self) -> None:
        try:
            for frame in self.frames:
                self.sock.sendall(frame)
        except OSError:
            pass

    def first_answer(self) -> str:
        """The start of what the daemon wrote back, without waiting for it."""
        self.sock.setblocking(False)
        try:
            return self.sock.recv(300).decode(errors="replace").split("\n")[0][:160]
        except BlockingIOError:
            return "(nothing yet)"


def sample(pid: int, seconds: float) -> int:
    top = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        top = max(top, status(pid, "VmRSS"))
        time.sleep(0.2)
    return top


class Writer(threading.Thread):
    """Appends 4 KiB events on a connection of its own until stopped."""

    def __init__(self, path: str, start: int) -> None:
        super().__init__(daemon=True)
        self.path, self.n, self.stop = path, start, threading.Event()

    def run(self) -> None:
        with connect(self.path) as sock:
            reader = sock.makefile("rb")
            try:
                while not self.stop.is_set():
                    batch = [event(self.n + i) for i in range(50)]
                    self.n += len(batch)
                    sock.sendall(request(self.n, "eventlog/append_batch", {"appends": batch}))
                    reader.readline()
            except OSError:
                pass  # the daemon stopped under it, at the end


def event(i: int, size: int = 4000) -> dict[str, object]:
    return {"app": "bench", "user": "u", "session": f"s{i % 16}",
            "event": {"id": f"e{i}", "author": "a", "content": {"text": f"{i} " + "x" * size}}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=("params", "watches", "answers"))
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--method", choices=("append", "watch", "since", "search"),
                   default=None, help="append (params), since (answers)")
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--max-held-bytes", type=int, default=0,
                   help="the daemon's --max-held-bytes (default: its own)")
    p.add_argument("--max-candidates", type=int, default=10_000)
    p.add_argument("--frame-bytes", type=int, default=8 << 20)
    p.add_argument("--watches", type=int, default=256)
    p.add_argument("--history-mib", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    args.method = args.method or ("since" if args.scenario == "answers" else "append")
    with tempfile.TemporaryDirectory(prefix="held-memory-") as work:
        path = str(Path(work) / "d.sock")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "streamd", "serve", "--socket", path, "--db",
             str(Path(work) / "log.db"), "--synchronous", "NORMAL",
             *([f"--max-held-bytes={args.max_held_bytes}"] if args.max_held_bytes else [])],
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:  # a process's start-up: there is no event to wait on
                try:
                    ask(path, request(0, "eventlog/ping", {}))
                    break
                except OSError:
                    if daemon.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("streamd serve did not start") from None
                    time.sleep(0.02)
            writer = None
            if args.scenario == "watches":
                for start in range(0, args.history_mib * 256, 200):
                    batch = [event(i) for i in range(start, start + 200)]
                    ask(path, request(1, "eventlog/append_batch", {"appends": batch}))
                writer = Writer(path, args.history_mib * 256)
            if args.scenario == "answers" and args.method == "since":
                for start in range(0, args.records, 200):
                    batch = [event(i, 1000) for i in range(start, min(start + 200, args.records))]
                    ask(path, request(1, "eventlog/append_batch", {"appends": batch}))
            if args.scenario == "answers" and args.method == "search":
                recall_stream(Path(work) / "data", args.records)
            body = b""
            if args.scenario == "params":
                item = b"{}" if args.method == "append" else b'"a"'
                # One body for every frame: building each anew took minutes at 64 connections.
                # (The envelope's bytes left out of the body, so the frame stays within size.)
                body = padded(0, "x", {"p": "@"}, item, args.frame_bytes - 1024)
                body = body[body.index(b"["):body.rindex(b"]") + 1]
            before = status(daemon.pid, "VmRSS")
            floods = []
            for c in range(args.connections):
                first = None
                if args.scenario == "watches":
                    frames = [request(i, "eventlog/watch", {"from_seq": 0})
                              for i in range(args.watches)]
                elif args.scenario == "answers" and args.method == "since":
                    frames = [request(i, "eventlog/since", {"from_seq": 0, "limit": 10_000})
                              for i in range(args.frames)]
                elif args.scenario == "answers":
                    first = request(0, "recall/initialize", {
                        "protocol_version_min": 1, "protocol_version_max": 1,
                        "workdir": work, "source_id": "bench", "location": f"{work}/data",
                        "settings": {"files": ["a.jsonl"],
                                     "max_candidates": args.max_candidates}})
                    frames = [request(i, "recall/search", {
                        "query": "adapter", "filters": {}, "limit": 0,
                        "deadline": "2999-01-01T00:00:00Z"}) for i in range(1, args.frames + 1)]
                elif args.method == "append":
                    frames = [request(i, "eventlog/append", {
                        "app": "bench", "user": "u", "session": f"c{c}",
                        "event": {"id": f"e{i}", "author": "a", "content": "@"}})
                        .replace(b'"@"', body) for i in range(args.frames)]
                else:
                    frames = [request(i, "eventlog/watch", {"filter": {"branch_prefixes": "@"}})
                              .replace(b'"@"', body) for i in range(args.frames)]
                floods.append(Flood(path, frames, first))
            if writer is not None:
                writer.start()
            for flood in floods:
                flood.start()
            top = sample(daemon.pid, args.seconds)
            if writer is not None:
                writer.stop.set()
            mib = 1 << 20
            print(f"{args.scenario} connections={args.connections} "
                  + (f"watches={args.watches}" if args.scenario == "watches"
                     else f"method={args.method} frames={args.frames}x{args.frame_bytes}"
                     if args.scenario == "params"
                     else f"method={args.method} frames={args.frames} records={args.records}"
                     f" max_candidates={args.max_candidates}"))
            print(f"RSS before {before / mib:.0f} MiB, highest sampled {top / mib:.0f} MiB,"
                  f" peak (VmHWM) {status(daemon.pid, 'VmHWM') / mib:.0f} MiB")
            print(f"first answer: {floods[0].first_answer()}")
            for flood in floods:
                flood.sock.close()
        finally:
            daemon.terminate()
            daemon.wait(30)
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
