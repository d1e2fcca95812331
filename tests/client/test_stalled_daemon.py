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
import trio
from support.frozen import freeze
from support.serve_socket import serving

from streamd.client import AsyncClient, Client, TrioClient
from streamd.client.calls import append
from streamd.errors import CLOSED, RpcError
from streamd.eventlog.model import Event

# Larger than a Unix socket's buffers, so a few of them fill the connection.
BIG = "x" * (1 << 20)


@contextlib.contextmanager
def stopped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    freeze(proc.pid)
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


def test_a_spawned_clients_pipe_closed_under_a_waiting_writer_is_never_written_elsewhere(
    tmp_path: Path,
) -> None:
    # A thread writes a request while the daemon does not read; another closes
    # the client, and the pipe's descriptor number goes to a file opened
    # next. Once the daemon read again, the waiting writer wrote the rest of
    # its request into that file.
    client = Client.spawn(["--db", str(tmp_path / "e.db"), "--synchronous", "NORMAL"])
    assert client.process is not None and client.process.stdin is not None
    client.ping()
    number = client.process.stdin.fileno()
    victim = tmp_path / "victim"
    held: list[int] = []
    try:
        with stopped(client.process):
            def write() -> None:
                with contextlib.suppress(RpcError):  # closed, as it is meant to be
                    for i in range(3):
                        event = Event(id=f"big-{i}", author="a", content=BIG)
                        client.append("stall", "u", "s", event)

            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            time.sleep(0.5)  # waiting for room in the pipe
            closer = threading.Thread(target=client.close, daemon=True)
            closer.start()
            time.sleep(0.5)  # the pipe closed under it
            while True:  # the next files opened take the lowest free numbers
                fd = os.open(victim, os.O_WRONLY | os.O_CREAT, 0o600)
                held.append(fd)
                if fd >= number:
                    break
        writer.join(30)
        closer.join(30)
        assert not writer.is_alive() and not closer.is_alive()
    finally:
        for fd in held:
            os.close(fd)
        client.close()
    assert victim.stat().st_size == 0


# --- a spawned daemon that does not exit -------------------------------------------
#
# Closing a client that spawned its own streamd ends the child's input and waits
# for it to exit; a stopped child waited on for ever held the close for ever
# (every client). Now it is given ``exit_grace`` and then killed: nothing
# acknowledged is lost, every answered append was committed.

GRACE = 0.5
# A healthy child may take longer than GRACE to exit on a loaded machine (its
# interpreter's shutdown alone); the claim that it is waited for, not killed,
# must not depend on the machine's load.
CALM_GRACE = 30.0


def test_closing_a_blocking_client_kills_its_child_that_does_not_exit(tmp_path: Path) -> None:
    client = Client.spawn(["--db", str(tmp_path / "e.db")], exit_grace=GRACE)
    assert client.process is not None
    client.append("a", "u", "s", Event(id="kept", author="a", content="kept"))
    freeze(client.process.pid)
    (raised,) = in_thread(client.close, 60)
    assert raised is None
    assert client.process.returncode == -signal.SIGKILL
    with Client.spawn(["--db", str(tmp_path / "e.db")], exit_grace=CALM_GRACE) as again:
        assert [e.event.id for e in again.get_session("a", "u", "s").events] == ["kept"]
    # A child that exits on its own is waited for, not killed.
    assert again.process is not None and again.process.returncode == 0


def test_closing_an_asyncio_client_kills_its_child_that_does_not_exit(tmp_path: Path) -> None:
    async def main() -> tuple[int | None, int | None]:
        client = await AsyncClient.spawn(["--db", str(tmp_path / "e.db")], exit_grace=GRACE)
        assert client.process is not None
        await client.ping()
        freeze(client.process.pid)
        async with asyncio.timeout(60):
            await client.aclose()
        calm = await AsyncClient.spawn(["--db", str(tmp_path / "e.db")], exit_grace=CALM_GRACE)
        await calm.ping()
        await calm.aclose()
        assert calm.process is not None
        return client.process.returncode, calm.process.returncode

    assert asyncio.run(main()) == (-signal.SIGKILL, 0)


def test_leaving_a_trio_clients_block_kills_its_child_that_does_not_exit(tmp_path: Path) -> None:
    async def main() -> tuple[int | None, int | None]:
        with trio.fail_after(60):
            async with TrioClient.spawn(
                ["--db", str(tmp_path / "e.db")], exit_grace=GRACE
            ) as client:
                assert client.process is not None
                await client.ping()
                freeze(client.process.pid)
            async with TrioClient.spawn(
                ["--db", str(tmp_path / "e.db")], exit_grace=CALM_GRACE
            ) as calm:
                await calm.ping()
        assert calm.process is not None
        return client.process.returncode, calm.process.returncode

    assert trio.run(main) == (-signal.SIGKILL, 0)
