"""A ``streamd serve --socket`` process for a test: started, waited for, ended."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def wait_connectable(path: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until ``path`` accepts a connection; fails if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"streamd serve did not listen on {path}") from None
            time.sleep(0.01)  # polling a process's start-up: there is no event to wait on
        finally:
            s.close()


@contextlib.contextmanager
def serving(sock: str, db: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``streamd serve --socket SOCK --db DB ARGS`` while the block runs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "serve", "--socket", sock, "--db", str(db), *args],
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_connectable(sock, proc)
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)
