"""A process that forks while another of its threads holds a lock of its
blocking client: the reader thread taking an answer, a thread writing a
frame to a spawned daemon's pipe.

The child inherits the lock held, by a thread that does not exist in it, and
its close of the inherited client (what a child that lets go of what it
inherited does first) waited for ever. Each case holds one lock in a helper
thread at the fork (a handshake, no sleeps); the child is bounded by an
alarm, and its close must return, its calls still refused (``forked``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.serve_socket import serving

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import json, os, signal, sys, threading
from streamd.client import Client
from streamd.errors import RpcError
from streamd.eventlog.model import Event

case = sys.argv[1]
client = Client.spawn(sys.argv[2:]) if case == "pipe" else Client.connect_socket(sys.argv[2])
client.append("app", "u", "s", Event(id="p0", author="agent", content=None))
watch = client.watch(0)

def pipe_lock():
    # The lock of the spawned daemon's pipe, in its outlet's closure: reached
    # here only to hold it.
    send = client._writer._send
    return send.__closure__[send.__code__.co_freevars.index("lock")].cell_contents

lock = pipe_lock() if case == "pipe" else client._lock
holding, release = threading.Event(), threading.Event()

def helper():
    lock.acquire()
    holding.set()
    release.wait()
    lock.release()

threading.Thread(target=helper, daemon=True).start()
holding.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child that waits on the inherited lock ends here
    out = {}
    try:
        client.append("app", "u", "child", Event(id="c0", author="agent", content=None))
        out["call"] = "served"
    except RpcError as exc:
        out["call"] = (exc.data or {}).get("reason")
    try:
        watch.next(timeout=5)
        out["watch"] = "served"
    except RpcError as exc:
        out["watch"] = (exc.data or {}).get("reason")
    watch.close()
    out["in_flight"] = client.in_flight
    client.close()
    out["close"] = "returned"
    print(json.dumps(out), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
client.append("app", "u", "s", Event(id="p1", author="agent", content=None))
ids = [e.event.id for e in client.get_session("app", "u", "s").events]
watch.close()
client.close()
print(json.dumps({"child_exit": os.waitstatus_to_exitcode(status), "parent": ids}), flush=True)
"""


def _run(*args: str) -> tuple[dict[str, object], dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert lines[-1]["child_exit"] == 0, "the child hung (ended by its alarm)"
    return lines[-2], lines[-1]


def test_a_child_forked_while_the_reader_holds_the_clients_lock_closes_it_and_is_refused(
    tmp_path: Path,
) -> None:
    sock = str(tmp_path / "s.sock")
    with serving(sock, tmp_path / "e.db", "--synchronous", "NORMAL"):
        child, parent = _run("socket", sock)
    assert child == {"call": "forked", "watch": "forked", "in_flight": 0, "close": "returned"}
    assert parent == {"child_exit": 0, "parent": ["p0", "p1"]}


def test_a_child_forked_while_a_write_holds_the_pipes_lock_closes_the_client(
    tmp_path: Path,
) -> None:
    child, parent = _run("pipe", "--db", str(tmp_path / "e.db"), "--synchronous", "NORMAL")
    assert child == {"call": "forked", "watch": "forked", "in_flight": 0, "close": "returned"}
    assert parent == {"child_exit": 0, "parent": ["p0", "p1"]}
