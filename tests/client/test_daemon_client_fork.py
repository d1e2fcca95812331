"""A process that forks after its daemon client was opened (a pre-fork
server, a ``multiprocessing`` worker under the fork start method).

The child inherits the connection but not the blocking client's reader
thread, nor the asyncio client's running loop: the blocking client's call went
to the parent's connection, the parent's reader took the answer (dropped it,
or gave it to a parent's call of the same id), and the child waited for ever;
the child's close, of either client, shut the parent's connection down. A
child is refused, with nothing sent, and its close leaves the parent's
connection alone.
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


ASYNC_SCRIPT = r"""
import asyncio, json, os, sys
from streamd.client import AsyncClient
from streamd.errors import RpcError, is_session_not_found
from streamd.eventlog.model import Event

def ev(event_id):
    return Event(id=event_id, author="agent", content=None)

async def opened():
    client = await AsyncClient.connect_socket(sys.argv[1])
    await client.append("app", "u", "s", ev("p0"))
    return client

loop = asyncio.new_event_loop()  # the parent's, kept for after the fork
client = loop.run_until_complete(opened())

pid = os.fork()
if pid == 0:
    async def child():
        out = {}
        try:
            await client.append("app", "u", "child", ev("c0"))
            out["call"] = "served"
        except RpcError as exc:
            out["call"] = (exc.data or {}).get("reason")
        except RuntimeError as exc:
            out["call"] = str(exc)
        try:
            await client.aclose()
            out["close"] = "returned"
        except Exception as exc:
            out["close"] = repr(exc)
        return out
    print(json.dumps(asyncio.run(child())), flush=True)
    os._exit(0)  # the parent's loop is no child's to close

_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0

async def parent():
    try:
        for i in range(1, 21):
            await asyncio.wait_for(client.append("app", "u", "s", ev(f"p{i}")), 30)
        ids = [e.event.id for e in (await client.get_session("app", "u", "s")).events]
        try:
            await client.get_session("app", "u", "child")
            child = "stored"
        except RpcError as exc:
            child = "none" if is_session_not_found(exc) else exc.message
        return {"parent": ids, "child_session": child}
    except RpcError as exc:
        return {"parent": exc.message}
    finally:
        await client.aclose()

print(json.dumps(loop.run_until_complete(parent())), flush=True)
"""


def _run(*args: str, script: str = SCRIPT) -> tuple[dict[str, object], dict[str, object]]:
    done = subprocess.run([sys.executable, "-c", script, *args],
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


def test_a_forked_childs_close_of_the_parents_asyncio_client_leaves_its_connection_serving(
    tmp_path: Path,
) -> None:
    sock = str(tmp_path / "s.sock")
    with serving(sock, tmp_path / "e.db", "--synchronous", "NORMAL"):
        child, parent = _run(sock, script=ASYNC_SCRIPT)
    assert child == {"call": "forked", "close": "returned"}
    assert parent == {"parent": [f"p{i}" for i in range(21)], "child_session": "none"}


WATCH_SCRIPT = r"""
import asyncio, json, os, sys
from streamd.client import AsyncClient
from streamd.eventlog.model import Event

def ev(event_id):
    return Event(id=event_id, author="agent", content=None)

async def opened():
    client = await AsyncClient.connect_socket(sys.argv[1])
    await client.append("app", "u", "s", ev("p0"))
    return client, await client.watch(0)

loop = asyncio.new_event_loop()  # the parent's, kept for after the fork
client, watch = loop.run_until_complete(opened())

pid = os.fork()
if pid == 0:
    watch.close()  # the child lets go of what it inherited
    print(json.dumps({"child": "closed"}), flush=True)
    os._exit(0)

_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0

async def parent():
    try:
        # A round trip: the daemon has read whatever the child wrote before it.
        await client.get_session("app", "u", "s")
        await client.append("app", "u", "s", ev("p1"))
        seen = []
        async def two():
            async for entry in watch:
                seen.append(entry.event.id)
                if len(seen) == 2:
                    return
        await asyncio.wait_for(two(), 30)
        return {"watched": seen, "result": None if watch.result is None else "ended"}
    finally:
        await client.aclose()

print(json.dumps(loop.run_until_complete(parent())), flush=True)
"""


def test_a_forked_childs_close_of_the_parents_asyncio_watch_leaves_the_parents_watch_running(
    tmp_path: Path,
) -> None:
    # The child's close wrote a cancel of the watch's id on the connection it
    # shares with its parent: the daemon ended the parent's watch.
    sock = str(tmp_path / "s.sock")
    with serving(sock, tmp_path / "e.db", "--synchronous", "NORMAL"):
        child, parent = _run(sock, script=WATCH_SCRIPT)
    assert child == {"child": "closed"}
    assert parent == {"watched": ["p0", "p1"], "result": None}
