"""What the in-process log's tests observe of its files: descriptors the
process holds on a database, worker threads still running, and a backup to
restore over a live file; and a method held until the test lets it go on."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw

from streamd.eventlog.sqlite.backup import snapshot

T = TypeVar("T")


def descriptors_on(path: Path) -> int:
    """This process's open descriptors on ``path`` itself (not its -wal)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue  # closed while listed (the listing's own descriptor)
    return count


def local_workers() -> list[str]:
    """The in-process logs' worker threads still running once those told to
    stop have stopped (a closed file's worker ends just after the close it
    ran, holding its last work a moment)."""
    for thread in threading.enumerate():
        if thread.name.startswith("streamd-local"):
            thread.join(timeout=30)
    return [t.name for t in threading.enumerate() if t.name.startswith("streamd-local")]


def backup_of(db: Path, backup: Path) -> None:
    """A backup of the live ``db`` at ``backup`` as of now, as ``streamd log
    backup`` makes one (for the caller to rename over ``db`` later)."""
    source = apsw.Connection(str(db))
    snapshot(source, backup)
    source.close()


def held(method: Callable[..., T], started: threading.Event,
         go_on: threading.Event) -> Callable[..., T]:
    """``method``, which once called (on whatever thread) sets ``started`` and
    waits for ``go_on`` (30 s at most) before it runs."""

    def holding(*args: Any, **kwargs: Any) -> T:
        started.set()
        go_on.wait(30)
        return method(*args, **kwargs)

    return holding
