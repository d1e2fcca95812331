"""A process that forks after its blocking client was opened (a pre-fork
server, a ``multiprocessing`` worker under the fork start method).

The child inherits the connection but not the reader thread: its call went
to the parent's connection, the parent's reader took the answer (dropped it,
or gave it to a parent's call of the same id), and the child waited for ever;
the child's close shut the parent's connection down. A child is refused, with
nothing sent, and its close leaves the parent's connection alone.
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
import json, os, sys, threading
from streamd.client import Client
from streamd.errors import RpcError, is_session_not_found
from streamd.eventlog.model import Event

def ev(event_id):
    return Event(id=event_id, author="agent", content=None)

client = Client.spawn(sys.argv[2:]) if sys.argv[1] == "spawn" else Client.connect_socket(
    sys.argv[2])
client.append("app", "u", "s", ev("p0"))

pid = os.fork()
if pid == 0:
    out = {}
    def call():
        try:
            client.append("app", "u", "child", ev("c0"))
            out["call"] = "served"
        except RpcError as exc:
            out["call"] = (exc.data or {}).get("reason")
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(20)  # bounds the fault's wait for ever (its answer went to the parent)
    out.setdefault("call", "no answer")
    client.close()
    print(json.dumps(out), flush=True)
    os._exit(0)

_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
try:
    for i in range(1, 21):
        client.append("app", "u", "s", ev(f"p{i}"))
    ids = [e.event.id for e in client.get_session("app", "u", "s").events]
    try:
        client.get_session("app", "u", "child")
        child = "stored"
    except RpcError as exc:
        child = "none" if is_session_not_found(exc) else exc.message
    print(json.dumps({"parent": ids, "child_session": child}), flush=True)
except RpcError as exc:
    print(json.dumps({"parent": exc.message}), flush=True)
client.close()
"""


def _run(*args: str) -> tuple[dict[str, object], dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child, parent = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    return child, parent


def test_a_forked_childs_call_on_the_parents_socket_client_is_refused_and_sends_nothing(
    tmp_path: Path,
) -> None:
    sock = str(tmp_path / "s.sock")
    with serving(sock, tmp_path / "e.db", "--synchronous", "NORMAL"):
        child, parent = _run("socket", sock)
    assert child == {"call": "forked"}
    # The child's close left the parent's connection serving, and nothing of
    # the child's reached the log.
    assert parent == {"parent": [f"p{i}" for i in range(21)], "child_session": "none"}


def test_a_forked_childs_call_on_the_parents_spawned_client_is_refused_and_sends_nothing(
    tmp_path: Path,
) -> None:
    child, parent = _run("spawn", "--db", str(tmp_path / "e.db"), "--synchronous", "NORMAL")
    assert child == {"call": "forked"}
    assert parent == {"parent": [f"p{i}" for i in range(21)], "child_session": "none"}
