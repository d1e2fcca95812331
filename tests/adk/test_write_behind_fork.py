"""A process that forks while its write-behind service (on the resident
daemon) has events queued and a send under way on its loop's thread (a
pre-fork server, a ``multiprocessing`` worker under the fork start method).

The queue, its send task and its refusals are the parent's: the parent sends
them when its loop runs again. The child inherited the parent's send task,
which never ends in the child, and every one of its calls raised RuntimeError
(two loops at once); it starts with no queue and reads what is stored.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.adk")

from support.resident import World, make_world, point_clients_at

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import asyncio, json, os, sys, threading
from google.adk.events.event import Event
from streamd.adk import StreamdSessionService

db = sys.argv[1]
service = StreamdSessionService(daemon_args=["--db", db, "--synchronous", "NORMAL"],
                                write_behind=True)
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
holding, release = threading.Event(), threading.Event()

async def queue():
    s = await service.create_session(app_name="a", user_id="u", session_id="s")
    await service.append_event(s, Event(author="agent", invocation_id="i"))
    holding.set()
    release.wait()  # holds the parent's loop: its send task has not run yet
    return s

queued = asyncio.run_coroutine_threadsafe(queue(), loop)
holding.wait()
pid = os.fork()
if pid == 0:
    async def child():
        try:
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            return {"child": len(got.events)}
        except Exception as exc:
            return {"child": repr(exc)}
    print(json.dumps(asyncio.run(asyncio.wait_for(child(), 30))), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
release.set()
queued.result(30)
asyncio.run_coroutine_threadsafe(service.flush(), loop).result(30)
got = asyncio.run_coroutine_threadsafe(
    service.get_session(app_name="a", user_id="u", session_id="s"), loop).result(30)
asyncio.run_coroutine_threadsafe(service.close(), loop).result(30)
print(json.dumps({"parent": len(got.events)}), flush=True)
"""


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


def test_a_forked_child_of_a_write_behind_service_reads_and_leaves_the_parents_queue_to_it(
    world: World, tmp_path: Path,
) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "events.db")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child, parent = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    # The parent's queued event was not stored yet when the child read.
    assert child == {"child": 0}
    assert parent == {"parent": 1}
