"""A process that forks while another of its threads holds one of the ADK
service's locks (a pre-fork server forking while an agent's turn runs on a
loop in a thread).

The child inherits the lock held, by a thread that does not exist in it: its
first use of the service waited for ever. Each case holds one lock in a
helper thread at the fork (a handshake, no sleeps); the child's first use is
bounded by an alarm, and must be served.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("google.adk")

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import asyncio, gc, json, os, signal, sys, threading
from google.adk.events.event import Event
from streamd import collector
from streamd.adk import StreamdSessionService

case, db = sys.argv[1], sys.argv[2]
service = StreamdSessionService(database=db, synchronous="NORMAL",
                                write_behind=case == "copy_index")

async def use():
    s = await service.create_session(app_name="a", user_id="u")
    await service.append_event(s, Event(author="agent", invocation_id="i"))
    got = await service.get_session(app_name="a", user_id="u", session_id=s.id)
    await service.close()
    return len(got.events)

kept = []
if case == "copy_index":
    # The parent's copy, indexed by id (write-behind), then its file closed:
    # the child drops the copy, which forgets its index under that lock.
    async def parent_copy():
        s = await service.create_session(app_name="a", user_id="u")
        await service.append_event(s, Event(author="agent", invocation_id="i"))
        await service.flush()
        await service.close()
        return s
    kept.append(asyncio.run(parent_copy()))

# The lock the helper holds (or the pause it sits in) at the fork: the
# service's own, reached here only to hold it.
held = {
    "clients": lambda: service._clients._lock,
    "loader": lambda: service._loader._lock,
    "collector": lambda: collector._lock,
    "copy_index": lambda: service._held._lock,
}.get(case)
holding, release = threading.Event(), threading.Event()

def helper():
    if held is None:  # "paused": inside a pause of the collector
        with collector.paused():
            holding.set()
            release.wait()
        return
    lock = held()
    lock.acquire()
    holding.set()
    release.wait()
    lock.release()

threading.Thread(target=helper, daemon=True).start()
holding.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child that waits on the inherited lock ends here
    if case == "copy_index":
        kept.clear()
        gc.collect()
        out = {"dropped": True}
    else:
        out = {"events": asyncio.run(use())}
        out["gc_enabled"] = gc.isenabled()
    print(json.dumps(out), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
print(json.dumps({"child_exit": os.waitstatus_to_exitcode(status)}), flush=True)
"""


@pytest.mark.parametrize("case", ["clients", "loader", "collector", "paused", "copy_index"])
def test_a_child_forked_while_another_thread_holds_a_lock_of_the_service_is_served(
    tmp_path: Path, case: str
) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, case, str(tmp_path / "events.db")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert lines[-1] == {"child_exit": 0}, "the child hung (ended by its alarm)"
    child = lines[-2]
    if case == "copy_index":
        assert child == {"dropped": True}
    else:
        # "paused": a pause of a thread the child does not have would have
        # kept the child's collector off for good.
        assert child == {"events": 1, "gc_enabled": True}
