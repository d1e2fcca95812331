"""``streamd.forks.Gate``: a fork waits until no thread is inside, holds the
threads that come meanwhile, and costs a pass no lock while no fork waits.

The forks run in a subprocess of their own (a script below), their order
set by thread handshakes and a fork hook, never by sleeps; each script waits
at most 60 s for a handshake, and the subprocess is bounded too."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from streamd import forks

_LOCK = threading.Lock


class CountingLock:
    """A lock that counts how often it is taken."""

    taken = 0

    def __init__(self) -> None:
        self._lock = _LOCK()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        CountingLock.taken += 1
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_pass_through_the_gate_takes_no_lock_while_no_fork_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The gate runs around every call of an in-process log: a lock taken at
    # each enter and leave cost a read on the event loop 4 of its 33 us.
    monkeypatch.setattr(threading, "Lock", CountingLock)
    gate = forks.Gate()
    monkeypatch.undo()
    CountingLock.taken = 0
    for _ in range(100):
        gate.enter()
        gate.enter()  # a thread already inside
        gate.leave()
        gate.leave()
    assert CountingLock.taken == 0


WAITS_SCRIPT = r"""
import json, os, threading
from streamd import forks

gate = forks.Gate()
began = threading.Event()
os.register_at_fork(before=began.set)  # registered after the gate's: runs before it
marks = {"inside": [0, 0], "meanwhile": [0, 0]}  # entered, left
entered, trying = threading.Event(), threading.Event()

def inside():
    gate.enter()
    marks["inside"][0] += 1
    entered.set()
    assert began.wait(60) and trying.wait(60)  # the fork waits, another comes
    marks["inside"][1] += 1
    gate.leave()

def meanwhile():
    assert began.wait(60)
    trying.set()
    gate.enter()
    marks["meanwhile"][0] += 1
    marks["meanwhile"][1] += 1
    gate.leave()

threads = [threading.Thread(target=inside), threading.Thread(target=meanwhile)]
threads[0].start()
assert entered.wait(60)
threads[1].start()
pid = os.fork()
if pid == 0:
    # The child's copy: what was inside at the fork, and a pass of its own.
    gate.enter()
    gate.leave()
    ok = all(e == left for e, left in marks.values()) and marks["inside"] == [1, 1]
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
for t in threads:
    t.join(60)
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "marks": marks}))
"""


FROM_INSIDE_SCRIPT = r"""
import json, os
from streamd import forks

gate = forks.Gate()
gate.enter()
pid = os.fork()  # from inside: it cannot wait for itself
try:
    gate.leave()
    gate.enter()  # the gate is usable after
    gate.leave()
    code = 0
except BaseException:
    code = 1
if pid == 0:
    os._exit(code)
_, status = os.waitpid(pid, 0)
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "parent": code}))
"""


def _run(script: str) -> Any:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fork_waits_for_the_thread_inside_and_holds_the_one_that_comes_meanwhile() -> None:
    assert _run(WAITS_SCRIPT) == {
        "child": 0, "marks": {"inside": [1, 1], "meanwhile": [1, 1]}}


def test_a_thread_that_forks_from_inside_the_gate_leaves_it_in_the_child_and_the_parent(
) -> None:
    # The child's leave raised AttributeError (its count of the thread's
    # depth was made anew, empty, at the fork).
    assert _run(FROM_INSIDE_SCRIPT) == {"child": 0, "parent": 0}
