"""Claims that need real processes sharing one database file.

Each child is a small Python program using :class:`EventLog` directly (the same
code the daemon runs), printing one line per acknowledged append. The parent
treats a printed line as the acknowledgement a client would have received.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from streamd.eventlog import EventLog
from streamd.eventlog.model import SinceParams
from streamd.eventlog.sqlite import SqliteStore

pytestmark = pytest.mark.subprocess

CHILD = textwrap.dedent(
    """
    import sys, time, trio
    from streamd.eventlog import Event, EventLog

    path, mode, tag = sys.argv[1:4]
    count, tasks = int(sys.argv[4]), int(sys.argv[5])

    async def appender(log, k, i=0, stop=count):
        while stop == 0 or i < stop:
            event_id = f"{tag}-{k}-{i}"
            event = Event(id=event_id, author=tag, content=i)
            result = await log.append("app", "u", f"s-{tag}", event)
            print(result.seq, event_id, flush=True)
            i += 1

    async def appenders(log, start, stop):
        async with trio.open_nursery() as nursery:
            for k in range(tasks):
                nursery.start_soon(appender, log, k, start, stop)

    async def on_cue(log):
        # One append per line on stdin; report the monotonic time of the ack.
        stdin = trio.wrap_file(sys.stdin)
        i = 0
        async for _ in stdin:
            event = Event(id=f"{tag}-{i}", author=tag, content=i)
            result = await log.append("app", "u", "cue", event)
            print(result.seq, f"{tag}-{i}", time.monotonic(), flush=True)
            i += 1

    async def main():
        async with EventLog(path) as log:  # synchronous=FULL, the default
            await log.ping()
            print("ready", flush=True)
            if mode == "cue":
                await on_cue(log)
                return
            if mode == "append-on-go":
                # Half, then wait for the cue that the other writer is halfway
                # too: its first half and ours then both precede both second
                # halves, so the two interleave however the machine schedules.
                stdin = trio.wrap_file(sys.stdin)
                await stdin.readline()
                await appenders(log, 0, count // 2)
                print("half", flush=True)
                await stdin.readline()
                await appenders(log, count // 2, count)
                return
            await appenders(log, 0, count)

    trio.run(main)
    """
)


class Child:
    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self._buffer = b""

    async def line(self) -> str:
        assert self.proc.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.proc.stdout.receive_some(65536)
            if not chunk:
                raise EOFError(f"child exited ({self.proc.returncode})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


async def spawn(tmp_path: Path, *args: str | int) -> Child:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(script), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    child = Child(proc)
    assert await child.line() == "ready"
    return child


async def test_appends_acknowledged_before_kill_9_all_survive(tmp_path: Path) -> None:
    path = str(tmp_path / "events.db")
    acknowledged: dict[str, int] = {}
    with trio.fail_after(60):
        # Eight concurrent appenders, so acknowledgements come out of group commits.
        child = await spawn(tmp_path, path, "append", "t", 0, 8)
        while len(acknowledged) < 400:
            seq, event_id = (await child.line()).split()
            acknowledged[event_id] = int(seq)
        child.proc.kill()  # SIGKILL, mid-stream: the child is still appending
        await child.proc.wait()
    assert child.proc.returncode == -9
    store = SqliteStore.open(path)
    stored = {e.event.id: e.seq for e in store.since(SinceParams(from_seq=0, limit=10_000)).entries}
    store.close()
    missing = {k: v for k, v in acknowledged.items() if stored.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged appends lost after kill -9"
    assert len(stored) >= len(acknowledged)


async def test_two_processes_appending_at_once_lose_nothing_and_seqs_increase(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    per_child, tasks = 300, 3
    lines: dict[str, list[tuple[int, str]]] = {"a": [], "b": []}
    halfway = {"a": trio.Event(), "b": trio.Event()}

    async def collect(child: Child, tag: str) -> None:
        while len(lines[tag]) < per_child * tasks:
            line = await child.line()
            if line == "half":
                halfway[tag].set()
                continue
            seq, event_id = line.split()
            lines[tag].append((int(seq), event_id))
        assert await child.proc.wait() == 0

    async def second_halves(*children: Child) -> None:
        for tag in halfway:
            await halfway[tag].wait()
        for child in children:
            assert child.proc.stdin is not None
            await child.proc.stdin.send_all(b"go\n")

    with trio.fail_after(120):
        # A watcher in this process follows both writers from seq 0.
        async with EventLog(path, synchronous="NORMAL", watch_interval=0.05) as log:
            await log.ping()
            a = await spawn(tmp_path, str(path), "append-on-go", "a", per_child, tasks)
            b = await spawn(tmp_path, str(path), "append-on-go", "b", per_child, tasks)
            for child in (a, b):  # both start together
                assert child.proc.stdin is not None
                await child.proc.stdin.send_all(b"go\n")
            watched = []
            async with log.watch(0) as w, trio.open_nursery() as nursery:
                nursery.start_soon(collect, a, "a")
                nursery.start_soon(collect, b, "b")
                nursery.start_soon(second_halves, a, b)
                async for entry in w:
                    watched.append((entry.seq, entry.event.id))
                    if len(watched) == 2 * per_child * tasks:
                        break
    everything = lines["a"] + lines["b"]
    assert len({seq for seq, _ in everything}) == len(everything) == 2 * per_child * tasks
    # Each appender's acknowledged seqs increase in the order it appended.
    for tag in "ab":
        for k in range(tasks):
            mine = [seq for seq, eid in lines[tag] if eid.startswith(f"{tag}-{k}-")]
            assert mine == sorted(mine) and len(mine) == per_child
    # Both writers really interleaved (otherwise the test proves little): each
    # half of the log (in seq order) holds both writers' appends.
    order = [eid[0] for _, eid in sorted(everything)]
    assert sum(1 for x, y in itertools.pairwise(order) if x != y) >= 2
    half = len(order) // 2
    assert set(order[:half]) == set(order[half:]) == {"a", "b"}
    # The watcher saw every entry once, in seq order: it never saw seq N+k
    # before seq N, or its cursor would have skipped N.
    assert watched == sorted(everything)
    store = SqliteStore.open(str(path))
    assert [
        (e.seq, e.event.id) for e in store.since(SinceParams(from_seq=0, limit=10_000)).entries
    ] == sorted(everything)
    store.close()


async def test_a_watcher_sees_another_process_append_within_the_poll_interval(
    tmp_path: Path,
) -> None:
    interval = 0.2
    path = tmp_path / "events.db"
    latencies = []
    with trio.fail_after(60):
        async with EventLog(path, synchronous="NORMAL", watch_interval=interval) as log:
            await log.ping()
            child = await spawn(tmp_path, str(path), "cue", "x", 0, 1)
            assert child.proc.stdin is not None
            async with log.watch(0) as w:
                for i in range(5):
                    await child.proc.stdin.send_all(b"go\n")
                    entry = await w.__anext__()
                    seen = time.monotonic()
                    seq, event_id, acked = (await child.line()).split()
                    assert (
                        (entry.seq, entry.event.id) == (int(seq), event_id) == (entry.seq, f"x-{i}")
                    )
                    latencies.append(seen - float(acked))
            await child.proc.stdin.aclose()
            assert await child.proc.wait() == 0
    # Noticed by the wake (inotify, else the poll every interval): without one, only
    # the 5 s safety recheck would find each entry. The bound leaves a loaded machine
    # ten intervals of scheduling slack and stays well below that 5 s.
    assert max(latencies) <= 10 * interval, latencies
