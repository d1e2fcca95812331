"""A ``streamd serve --socket`` for a test: a process started, waited for and
ended, or :func:`streamd.daemon.serve_socket` run in the test's own process."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import trio

from streamd.daemon import Config, Daemon, serve_socket
from support.rpc_client import Client


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


@contextlib.asynccontextmanager
async def in_process(tmp_path: Path, db: str | None = None, **config: Any) -> AsyncIterator[str]:
    """``serve_socket`` running in this process on ``db`` (by default a new
    SQLite file in ``tmp_path``); yields its path."""
    path = str(tmp_path / "streamd.sock")
    daemon = Daemon(Config(db=db or str(tmp_path / "events.db"), **config))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_socket, daemon, path)
        yield path
        nursery.cancel_scope.cancel()


async def connect(path: str) -> Client:
    return Client(await trio.open_unix_socket(path))
