"""Clients of a daemon that stops reading (SIGSTOP, here; an overloaded daemon
past its in-flight limits stops reading too): a call's timeout is kept even
while its request cannot be written, closing does not wait for ever, and once
the daemon reads again the connection is whole."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.serve_socket import serving

from streamd.client import AsyncClient, Client
from streamd.client.calls import append
from streamd.errors import CLOSED, RpcError
from streamd.eventlog.model import Event

# Larger than a Unix socket's buffers, so a few of them fill the connection.
BIG = "x" * (1 << 20)


@contextlib.contextmanager
def stopped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def in_thread(fn: Callable[[], object], limit: float) -> list[BaseException | None]:
    """Run ``fn`` in a thread; what it raised (None: returned), failing the
    test when it is still running after ``limit`` seconds."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still blocked after {limit} s"
    return outcome


def test_a_blocking_call_keeps_its_timeout_while_the_daemon_does_not_read(
    tmp_path: Path,
) -> None:
    sock = str(tmp_path / "s.sock")
    with (
        serving(sock, tmp_path / "e.db", "--synchronous", "NORMAL") as proc,
        Client.connect_socket(sock) as client,
    ):
        client.ping()
        with stopped(proc):
            for i in range(6):
                started = time.monotonic()
                event = Event(id=f"big-{i}", author="a", content=BIG)
                call = append("stall", "u", "s", event)
                (raised,) = in_thread(lambda c=call: client.call(c, timeout=0.3), 10)
                assert isinstance(raised, TimeoutError), raised
                assert time.monotonic() - started < 5
        # The daemon reads again: the requests cut short went whole (or
        # not at all), every cancel reached it, and the connection serves.
        client.ping()
        deadline = time.monotonic() + 30
        while client.in_flight:
            assert time.monotonic() < deadline, client.in_flight
            client.ping()
        after = Event(id="after", author="a", content="after")
        assert client.append("stall", "u", "s", after).seq >= 1
        for entry in client.get_session("stall", "u", "s").events:
            assert entry.event.content in (BIG, "after")


def test_asyncio_aclose_ends_while_the_daemon_does_not_read(tmp_path: Path) -> None:
    sock = str(tmp_path / "s.sock")

    async def main(proc: subprocess.Popen[bytes]) -> None:
        client = await AsyncClient.connect_socket(sock)
        lease = await client.acquire_lock("stall", "u", "s")
        with stopped(proc):
            event = Event(id="big", author="a", content=BIG)
            for _ in range(4):  # fill the transport's buffer as well
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await client.call(append("stall", "u", "s", event))
            async with asyncio.timeout(20):
                await client.aclose()
            assert lease.lost.is_set()
            with pytest.raises(RpcError) as info:
                await client.ping()
            assert info.value.code == CLOSED

    with serving(sock, tmp_path / "e.db", "--synchronous", "NORMAL") as proc:
        asyncio.run(main(proc))
