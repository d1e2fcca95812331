"""Hostile input against the real process on pipes, and over the socket with two clients:
one bad frame costs its sender one error answer, never the process (helpers:
test_rpc_hostile).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.hostile import (
    DEEP,
    FAR,
    HEALTH,
    INVALID_UTF8,
    Peer,
    answer,
    frames_of,
    request,
)
from support.rpc_client import Client

from streamd.daemon import Config, Daemon, serve_socket

pytestmark = pytest.mark.subprocess

# --- the real process on pipes ------------------------------------------------------------


@asynccontextmanager
async def spawn(tmp_path: Path, *, stderr: Any = None, env: dict[str, str] | None = None,
                argv: list[str] | None = None) -> AsyncIterator[trio.Process]:
    log = (tmp_path / "stderr.log").open("wb") if stderr is None else None
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "streamd", "--db", str(tmp_path / "events.db"), *(argv or [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=log if stderr is None else stderr, cwd=tmp_path, env={**os.environ, **(env or {})},
    )
    if log is not None:
        log.close()
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# write(2)'s number, for reading /proc/PID/task/TID/syscall.
WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}.get(platform.machine())


async def blocked_writing_to(pid: int, reader: int) -> None:
    """Until a thread of ``pid`` sits in write(2) on the pipe whose read end
    this process holds as ``reader``: its peer (this test) is not reading."""
    if WRITE_SYSCALL is None:
        pytest.skip(f"write(2)'s syscall number on {platform.machine()} is not known here")
    pipe = os.fstat(reader).st_ino
    while True:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                fields = Path(f"/proc/{pid}/task/{task}/syscall").read_text().split()
                if (
                    fields[0] == str(WRITE_SYSCALL)
                    and os.stat(f"/proc/{pid}/fd/{int(fields[1], 16)}").st_ino == pipe
                ):
                    return
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended, or one not in a system call
        await trio.sleep(0.01)


async def unread_at_least(sock: int, amount: int) -> None:
    """Until ``amount`` bytes wait unread on this end of a socket."""
    while struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0] < amount:
        await trio.sleep(0.01)


async def test_the_process_answers_every_hostile_frame_and_exits_zero_at_eof(tmp_path):
    hostile = [frame for frame, _ in INVALID_UTF8.values()]
    hostile += list(DEEP.values())
    hostile += [b'{"jsonrpc":"2.0","id":9223372036854775808,"method":"x"}', b"[]", b"[1]"]
    with trio.fail_after(60):
        async with spawn(tmp_path) as process:
            peer = Peer(trio.StapledStream(process.stdin, process.stdout))
            await peer.raw(frames_of(*hostile))
            # Every frame but the cancel notification is answered, then the ping.
            answers = [await peer.recv() for _ in range(len(hostile) - 1)]
            assert all("error" in a for a in answers), answers
            await peer.pinged()
            await process.stdin.aclose()
            assert await process.wait() == 0, (tmp_path / "stderr.log").read_text()


async def test_sigterm_ends_the_process_soon_though_its_peer_never_reads_stdout(tmp_path):
    with trio.fail_after(60):
        async with spawn(tmp_path) as process:
            many = frames_of(*(  # ~1 MB of answers, far more than a pipe holds
                json.dumps(request(i, "recall/health", deadline=FAR)).encode() for i in range(5000)
            ))

            async def feed() -> None:
                try:
                    await process.stdin.send_all(many)
                except trio.BrokenResourceError:
                    pass  # it exited first

            async with trio.open_nursery() as nursery:
                nursery.start_soon(feed)
                # The first answers prove it is serving; from then on nobody reads.
                first = await process.stdout.receive_some(100)
                assert first.startswith(b'{"jsonrpc":"2.0","id":')
                await blocked_writing_to(process.pid, process.stdout.fileno())
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    code = await process.wait()
                took = time.monotonic() - started
                nursery.cancel_scope.cancel()
    assert code == 0, (tmp_path / "stderr.log").read_text()
    assert took < 10


async def test_an_undrained_stderr_never_stops_the_daemon_answering(tmp_path):
    # Every bad frame is a debug line here: far more than a pipe holds.
    with trio.fail_after(60):
        async with spawn(tmp_path, stderr=subprocess.PIPE, env={"STREAMD_LOG": "debug"}) as process:
            peer = Peer(trio.StapledStream(process.stdin, process.stdout))
            await peer.raw(b"{not json\n" * 5000)
            for _ in range(5000):
                assert answer(await peer.recv()) == (None, -32700)
            await peer.pinged()
            await process.stdin.aclose()
            log = b""
            while chunk := await process.stderr.receive_some(1 << 16):
                log += chunk
            assert await process.wait() == 0
    assert b"log lines were dropped while stderr was not being read" in log


async def test_client_errors_are_not_warnings(tmp_path):
    with trio.fail_after(30):
        async with spawn(tmp_path) as process:
            peer = Peer(trio.StapledStream(process.stdin, process.stdout))
            await peer.raw(frames_of(b"{not json", b"[]", b'{"jsonrpc":"2.0","id":1,"method":"x"}'))
            for _ in range(3):
                await peer.recv()
            await process.stdin.aclose()
            assert await process.wait() == 0
    assert (tmp_path / "stderr.log").read_text() == ""


# --- the socket: another client is still served -------------------------------------------------


@asynccontextmanager
async def socket_server(tmp_path: Path) -> AsyncIterator[str]:
    path = str(tmp_path / "streamd.sock")
    daemon = Daemon(Config(db=str(tmp_path / "events.db")))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_socket, daemon, path)
        yield path
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "frame",
    [frame for frame, _ in INVALID_UTF8.values()] + list(DEEP.values()),
    ids=[*(f"utf8-{name}" for name in INVALID_UTF8), *(f"deep-{name}" for name in DEEP)],
)
async def test_a_hostile_frame_on_the_socket_costs_only_its_answer(tmp_path, frame):
    with trio.fail_after(30):
        async with socket_server(tmp_path) as path:
            bystander = Client(await trio.open_unix_socket(path))
            await bystander.result("eventlog/ping", {})
            hostile = Peer(await trio.open_unix_socket(path))
            await hostile.raw(frame + b"\n")
            if b"recall/cancel" not in frame:
                assert "error" in await hostile.recv()
            await hostile.pinged()
            assert await bystander.result("eventlog/ping", {}) == {}


async def test_a_client_that_pipelines_and_never_reads_does_not_stall_another(tmp_path):
    with trio.fail_after(30):
        async with socket_server(tmp_path) as path:
            flooder = await trio.open_unix_socket(path)
            frame = json.dumps(request(1, "eventlog/ping")).encode() + b"\n"

            async def flood() -> None:
                while True:
                    await flooder.send_all(frame * 1000)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                bystander = Client(await trio.open_unix_socket(path))
                for _ in range(20):
                    assert await bystander.result("eventlog/ping", {}) == {}
                nursery.cancel_scope.cancel()


async def test_sigterm_ends_the_socket_server_soon_though_a_client_never_reads(tmp_path):
    path = tmp_path / "s.sock"
    with trio.fail_after(60):
        async with spawn(tmp_path, argv=["serve", "--socket", str(path)]) as process:
            while True:  # until it listens
                try:
                    stuck = await trio.open_unix_socket(str(path))
                    break
                except OSError:
                    await trio.sleep(0.02)
            async with trio.open_nursery() as nursery:

                async def flood() -> None:
                    frame = HEALTH * 1000
                    try:
                        while True:
                            await stuck.send_all(frame)
                    except (trio.BrokenResourceError, OSError):
                        pass

                nursery.start_soon(flood)
                await unread_at_least(stuck.socket.fileno(), 1 << 16)
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    code = await process.wait()
                took = time.monotonic() - started
                nursery.cancel_scope.cancel()
    assert code == 0
    assert took < 10
