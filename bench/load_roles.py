"""The load processes of ``eventlog_load.py``: a writer and a watcher, each its
own OS process on a plain blocking socket to the daemon (nothing of Trio or
asyncio), talking to the parent in lines on stdin/stdout and writing what it
saw to a result file the parent joins. Run by the parent as
``python bench/load_roles.py writer|watcher ...``.
"""

from __future__ import annotations

import argparse
import array
import json
import random
import signal
import socket
import sys
import time
from typing import Any

import msgspec
from workload import append_params

# --- the load processes ----------------------------------------------------------------
# Only the standard library and msgspec: a load process must start fast and cost
# little per frame.


class Ack(msgspec.Struct):
    """An append's result (latest_seq's too: its ``duplicate`` is absent)."""

    seq: int
    duplicate: bool = False


class Reply(msgspec.Struct):
    id: int | None = None
    result: Ack | None = None
    error: Any = None


class EntrySeq(msgspec.Struct):
    seq: int


class NoteParams(msgspec.Struct):
    watch: int | str | None = None
    entry: EntrySeq | None = None


class Message(msgspec.Struct):
    """A frame on a watcher's socket: a notification (method, params) or a reply.
    Everything but the seq is skipped by the decoder, not built."""

    id: int | None = None
    method: str | None = None
    params: NoteParams | None = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: Any = None


# One recv may hold many frames: joined with commas into one array they decode in a
# single call, instead of one Python-level decode per frame.
_replies = msgspec.json.Decoder(list[Reply]).decode
_messages = msgspec.json.Decoder(list[Message]).decode
_encode = msgspec.json.Encoder().encode

def append_frames(tag: str, count: int) -> list[bytes]:
    """Every request frame of one writer, encoded before anything is timed.
    Request id i is frame i; event ids are unique over the whole run."""
    return [
        _encode(
            {"jsonrpc": "2.0", "id": i, "method": "eventlog/append",
             "params": append_params(tag, i)}
        )
        + b"\n"
        for i in range(count)
    ]


def request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return _encode(body) + b"\n"


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def pipeline(
    sock: socket.socket, frames: list[bytes], inflight: int, pause_ms: float, rng: random.Random
) -> tuple[array.array, array.array, array.array, int, Any]:
    """Send ``frames`` keeping ``inflight`` unanswered; per frame its send time, its
    reply time and its seq (-1 for an error). ``pause_ms`` > 0 waits a random
    0..2*pause_ms after each reply before sending again (the cross-process row)."""
    n = len(frames)
    sent = array.array("q", bytes(8 * n))
    acked = array.array("q", bytes(8 * n))
    seqs = array.array("q", bytes(8 * n))
    errors, first_error, duplicates = 0, None, 0
    monotonic_ns = time.monotonic_ns
    recv = sock.recv
    sendall = sock.sendall
    nxt = min(inflight, n)
    t = monotonic_ns()
    sendall(b"".join(frames[:nxt]))
    for i in range(nxt):
        sent[i] = t
    done = 0
    buf = b""
    while done < n:
        chunk = recv(1 << 18)
        now = monotonic_ns()
        if not chunk:
            raise ConnectionError(f"the daemon closed the socket after {done} of {n} replies")
        buf += chunk
        cut = buf.rfind(b"\n")
        if cut < 0:
            continue
        replies = _replies(b"[" + buf[:cut].replace(b"\n", b",") + b"]")
        buf = buf[cut + 1 :]
        for r in replies:
            i = r.id
            if i is None:  # a frame the daemon could not tie to a request
                raise RuntimeError(f"a reply without an id: {r.error}")
            acked[i] = now
            if r.result is None:
                seqs[i] = -1
                errors += 1
                if first_error is None:
                    first_error = r.error
            else:
                seqs[i] = r.result.seq
                duplicates += r.result.duplicate
        done += len(replies)
        if nxt < n:
            if pause_ms > 0:
                time.sleep(rng.uniform(0, 2 * pause_ms) / 1000)
            upto = min(nxt + len(replies), n)
            t = monotonic_ns()
            sendall(b"".join(frames[nxt:upto]))
            for i in range(nxt, upto):
                sent[i] = t
            nxt = upto
    if duplicates:  # every event id is new: the log must never call one a retry
        first_error = first_error or f"{duplicates} appends answered duplicate"
        errors += duplicates
    return sent, acked, seqs, errors, first_error


def run_writer(a: argparse.Namespace) -> int:
    rng = random.Random(a.seed)
    warm = append_frames(f"{a.tag}-warm", a.warmup)
    frames = append_frames(a.tag, a.count)
    sock = connect(a.socket)
    if warm:
        pipeline(sock, warm, a.inflight, 0, rng)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 3  # the parent went away before the start
    cpu = time.process_time()
    sent, acked, seqs, errors, first_error = pipeline(
        sock, frames, a.inflight, a.pause_ms, rng
    )
    cpu = time.process_time() - cpu
    sock.close()
    with open(a.result, "wb") as f:
        for column in (sent, acked, seqs):
            column.tofile(f)
    summary = {"count": a.count, "errors": errors, "first_error": first_error, "cpu_s": cpu}
    print(json.dumps(summary), flush=True)
    return 0


class _Stop(Exception):
    pass


def run_watcher(a: argparse.Namespace) -> int:
    sock = connect(a.socket)
    seqs = array.array("q")
    received = array.array("q")
    state = {"last": -1, "out_of_order": 0, "examples": [], "errors": [], "ended": False}
    replies: dict[int, Any] = {}
    buf = b""
    fault = [a.fault]

    def take(chunk: bytes, now: int) -> None:
        nonlocal buf
        buf += chunk
        cut = buf.rfind(b"\n")
        if cut < 0:
            return
        messages = _messages(b"[" + buf[:cut].replace(b"\n", b",") + b"]")
        buf = buf[cut + 1 :]
        if fault[0] is not None:
            inject(fault, messages)
        last = state["last"]
        for m in messages:
            p = m.params
            if p is not None and p.entry is not None:
                s = p.entry.seq
                if s <= last:
                    # A duplicate or a step back: counted, and the first few kept.
                    state["out_of_order"] += 1
                    if len(state["examples"]) < 10:
                        state["examples"].append([last, s])
                last = s
                seqs.append(s)
                received.append(now)
            elif m.id is not None:
                if m.error is not None:
                    state["errors"].append(m.error)
                    if m.id == 2:
                        state["ended"] = True  # the watch itself ended
                replies[m.id] = m.result
        state["last"] = last

    def until_reply(request_id: int) -> msgspec.Raw:
        while request_id not in replies:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the daemon closed the socket")
            take(chunk, time.monotonic_ns())
        return replies[request_id]

    sock.sendall(request(1, "eventlog/latest_seq", {}))
    tip = msgspec.json.decode(until_reply(1), type=Ack).seq
    # The watch, then one more round trip on the same socket: its reply comes after
    # the daemon has read the watch request and started serving it.
    sock.sendall(request(2, "eventlog/watch", {"from_seq": tip}))
    sock.sendall(request(3, "eventlog/latest_seq", {}))
    until_reply(3)
    # The parent's SIGUSR1 means "stop waiting, report what you have"; only while
    # the loop runs, so a late one cannot interrupt the report.
    listening = [True]

    def stop(signum: int, frame: Any) -> None:
        if listening[0]:
            raise _Stop

    signal.signal(signal.SIGUSR1, stop)
    print(f"ready {tip}", flush=True)

    # Done at the expected count, or at the last seq (so a watcher that missed an
    # entry ends when the log's end reaches it, not at the drain timeout).
    final = tip + a.expect
    cpu = time.process_time()
    stopped = False
    reads = 0
    recv = sock.recv
    monotonic_ns = time.monotonic_ns
    batch_s = a.batch_ms / 1000
    try:
        while len(seqs) < a.expect and state["last"] < final and not state["ended"]:
            chunk = recv(1 << 20)
            now = monotonic_ns()
            if not chunk:
                state["errors"].append("the daemon closed the socket")
                stopped = True
                break
            reads += 1
            take(chunk, now)
            # The daemon writes one frame per entry; woken for each, eight watchers
            # cost about as much CPU as the daemon (~40-60 us a wake on this machine).
            # A short nap after a small read lets frames gather, at the price of
            # stamping some of them up to batch_ms late.
            if batch_s and len(chunk) < 65536:
                time.sleep(batch_s)
        listening[0] = False
    except _Stop:
        stopped = True
    listening[0] = False
    cpu = time.process_time() - cpu
    # A stop can land between the two appends of one entry.
    n = min(len(seqs), len(received))
    del seqs[n:], received[n:]
    sock.close()
    with open(a.result, "wb") as f:
        seqs.tofile(f)
        received.tofile(f)
    summary = {
        "tip": tip,
        "count": len(seqs),
        "expected": a.expect,
        "out_of_order": state["out_of_order"],
        "out_of_order_examples": state["examples"],
        "errors": state["errors"][:5],
        "stopped_early": stopped or bool(state["ended"]),
        "cpu_s": cpu,
        "reads": reads,
    }
    print(json.dumps(summary), flush=True)
    return 0


def inject(fault: list[str | None], messages: list[Message]) -> None:
    """--inject-fault: lose or repeat the first entry, to show the checks catch it."""
    for i, m in enumerate(messages):
        if m.params is not None and m.params.entry is not None:
            if fault[0] == "drop":
                del messages[i]
            else:
                messages.insert(i, m)
            fault[0] = None
            return


def child_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="load_roles.py")
    p.add_argument("role", choices=("writer", "watcher"))
    p.add_argument("--socket", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--tag", default="w")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--inflight", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--pause-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--fault", choices=("drop", "dup"))
    p.add_argument("--batch-ms", type=float, default=0.0)
    a = p.parse_args(argv)
    return run_writer(a) if a.role == "writer" else run_watcher(a)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
