"""A process that forks while its in-process log is open (a pre-fork server
whose parent used the service at start-up, say).

SQLite's connections, and its table of the process's open files with the
locks the parent holds, come across a fork; a child that used the parent's
connection, or opened the file anew (its new connection believing it holds
the parent's locks), corrupted the parent's file. The child is refused that
file, clearly; other files are its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

pytestmark = pytest.mark.subprocess

SCRIPT = r"""
import asyncio, gc, json, os, sys
from streamd.client.local import LocalClient
from streamd.errors import RpcError
from streamd.eventlog.model import Event

db, other = sys.argv[1], sys.argv[2]

def ev(event_id):
    return Event(id=event_id, author="agent", content=None)

async def reason(call):
    try:
        await call
        return "served"
    except RpcError as exc:
        return exc.data["reason"]

loop = asyncio.new_event_loop()
client = loop.run_until_complete(LocalClient.open(db))  # used, and left open
loop.run_until_complete(client.append("app", "u", "s", ev("p0")))

pid = os.fork()
if pid == 0:
    async def child():
        out = {"inherited": await reason(client.append("app", "u", "s", ev("c0")))}
        out["reopened"] = await reason(LocalClient.open(db))
        own = await LocalClient.open(other)
        await own.append("app", "u", "s", ev("o1"))
        out["other"] = [e.event.id for e in (await own.since(0)).entries]
        await own.aclose()
        return out
    print(json.dumps(asyncio.run(child())), flush=True)
    # The child lets go of the parent's client, as a child's end collects it
    # (its release hands nothing to the parent's worker, which did not come
    # across). Then os._exit: an ordinary exit would also close the parent's
    # asyncio loop, whose epoll the child shares (asyncio's own hazard across
    # a fork, whatever the loop runs).
    del client
    gc.collect()
    os._exit(0)

_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0

async def parent():
    for i in range(1, 101):
        await client.append("app", "u", "s", ev(f"p{i}"))
    await client.aclose()

loop.run_until_complete(parent())
"""


def test_a_forked_child_is_refused_the_parents_open_file_and_the_file_stays_whole(
    tmp_path: Path,
) -> None:
    db, other = tmp_path / "events.db", tmp_path / "child.db"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(db), str(other)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child == {"inherited": "forked", "reopened": "forked", "other": ["o1"]}
    # The parent's appends before and after the child's life are all there.
    conn = apsw.Connection(str(db))
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    ids = [row[0] for row in conn.execute("SELECT event_id FROM events ORDER BY seq")]
    assert ids == [f"p{i}" for i in range(101)]


STALE_SCRIPT = r"""
import asyncio, os, signal, sys, threading, apsw
from streamd.client import local_log
from streamd.client.local import LocalClient
from streamd.errors import RpcError
from streamd.eventlog.model import Event
from streamd.eventlog.sqlite.backup import snapshot

db = sys.argv[1]

def ev(event_id):
    return Event(id=event_id, author="agent", content=None)

async def restore_with_a_reader():
    old = await LocalClient.open(db)
    await old.append("app", "u", "s", ev("e1"))
    source = apsw.Connection(db)
    snapshot(source, db + ".backup")
    source.close()
    reader = apsw.Connection(db)  # another process reading: the old -wal stays
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchall()
    await old.append("app", "u", "s", ev("e2"))
    os.rename(db, db + ".before-restore")
    os.rename(db + ".backup", db)
    await old.aclose()  # cannot empty its -wal past the reader
    return reader

async def reason():
    try:
        await LocalClient.open(db)
        return "opened"
    except RpcError as exc:
        return exc.data["reason"]

reader = asyncio.run(restore_with_a_reader())
holding, release = threading.Event(), threading.Event()

def hold_the_old_files_guard():
    # Another thread of the parent asking whether the old -wal is still at
    # the path (an open on another loop) holds its guard's lock; reached here
    # only to hold it.
    lock = local_log._files[os.path.realpath(db)].stale._lock
    lock.acquire()
    holding.set()
    release.wait()
    lock.release()

if sys.argv[2:] == ["held"]:
    threading.Thread(target=hold_the_old_files_guard, daemon=True).start()
    holding.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child that waits on the inherited lock ends here
    print(asyncio.run(reason()), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
assert os.waitstatus_to_exitcode(status) == 0, "the child hung (ended by its alarm)"
reader.execute("COMMIT")
reader.close()
"""


@pytest.mark.parametrize("guard", ["free", "held"])
def test_a_forked_child_keeps_refusing_a_path_with_the_old_wal_beside_it(
    tmp_path: Path, guard: str
) -> None:
    # A restore whose old -wal could not be emptied (another process was
    # reading it): opening the path would apply that -wal to the restored
    # file, in the child as in the parent. "held": another thread held the
    # old file's guard at the fork, and the child's open waited for ever.
    db = tmp_path / "events.db"
    done = subprocess.run([sys.executable, "-c", STALE_SCRIPT, str(db), guard],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "old_wal_left"


BUSY_SCRIPT = r"""
import asyncio, json, os, signal, sys, threading
from streamd.client.local import LocalClient
from streamd.eventlog.model import Event

folder, forks = sys.argv[1], int(sys.argv[2])
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
stop, appending = threading.Event(), threading.Event()

async def busy():
    # The parent's own log, appended to on a loop in a thread all along the
    # forks: its worker and its loop's inline calls are in SQLite most of
    # the time.
    client = await LocalClient.open(os.path.join(folder, "parent.db"), synchronous="NORMAL")
    i = 0
    while not stop.is_set():
        await client.append("app", "u", "s", Event(id=f"p{i}", author="a", content=None))
        if i % 50 == 0:
            await client.get_session("app", "u", "s", recent=20)
        i += 1
        appending.set()
        await asyncio.sleep(0)
    await client.aclose()
    return i

running = asyncio.run_coroutine_threadsafe(busy(), loop)
assert appending.wait(60)
served = 0
for k in range(forks):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a child that waits on a lock SQLite came across with ends here
        async def child():
            own = await LocalClient.open(os.path.join(folder, f"child{k}.db"),
                                         synchronous="NORMAL")
            await own.append("app", "u", "s", Event(id="c0", author="a", content=None))
            await own.aclose()
        asyncio.run(child())
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        break  # hung: one is enough
    served += 1
stop.set()
appended = running.result(60)
print(json.dumps({"served": served, "parent_appended": appended > 0}), flush=True)
"""


def test_children_forked_while_the_parent_appends_in_process_each_open_a_log_of_their_own(
    tmp_path: Path,
) -> None:
    # A thread of the parent inside SQLite at the fork held SQLite's own
    # locks (its allocator's, its table of open files'), and the child's
    # first open waited for ever: 21 of 300 children. A fork now waits until
    # no call of an in-process log is inside SQLite.
    done = subprocess.run([sys.executable, "-c", BUSY_SCRIPT, str(tmp_path), "200"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "served": 200, "parent_appended": True}
