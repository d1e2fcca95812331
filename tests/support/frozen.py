"""A database server that stops answering: its processes stopped (SIGSTOP),
or a PostgreSQL watch's listening connect that the server never answers."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

__all__ = ["freeze", "stopped", "unanswered_listener"]


def freeze(pid: int, timeout: float = 30.0) -> None:
    """Stop process ``pid`` (SIGSTOP) and return once every thread of it has
    stopped. ``kill`` returns before that: one thread is woken to begin the
    stop and brings the others to it when it runs, and until then a thread
    woken by a request (a server's connection thread) can still answer it.
    On a loaded machine that window lasted long enough for a frozen MariaDB
    to answer a query. A process that ends meanwhile is passed over; one that
    does not stop in time is continued before the error is raised, so that a
    caller's cleanup never waits on a process left half stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_stopped(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            raise AssertionError(f"process {pid} did not stop within {timeout} s of SIGSTOP")
        time.sleep(0.001)  # another process's state: there is no event to wait on


def _all_stopped(pid: int) -> bool:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # ended
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # the thread ended
        if state not in (b"T", b"t", b"Z", b"X"):
            return False
    return True


@contextlib.contextmanager
def stopped(pids: Sequence[int], most: float = 15.0) -> Iterator[None]:
    """The processes ``pids`` stopped (SIGSTOP) for the block, and at most
    ``most`` seconds whatever the code under test does: continued in a
    finally, so the server can always stop. One that has ended meanwhile (a
    backend whose client just left) is passed over."""

    def send(sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    watchdog = threading.Timer(most, send, (signal.SIGCONT,))
    watchdog.start()
    try:
        # Inside: a failure half way still continues them all.
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                freeze(pid)
        yield
    finally:
        watchdog.cancel()
        send(signal.SIGCONT)


def unanswered_listener(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every PostgreSQL watch's connect to listen (``PgChanges``) left
    unanswered until the event returned is set, then failed as a server
    that gave up fails it; connects left running counted afresh."""
    import psycopg

    from streamd.eventlog import handoff
    from streamd.eventlog.postgres.changes import PgChanges

    monkeypatch.setattr(handoff, "left_running", handoff.LeftRunning())
    thawed = threading.Event()

    def connect(self: PgChanges) -> Any:
        assert thawed.wait(30), "the test never thawed the server"
        raise psycopg.OperationalError("the server gave up")

    monkeypatch.setattr(PgChanges, "_connect_and_listen", connect)
    return thawed
