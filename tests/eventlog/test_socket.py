"""``streamd serve --socket``: many clients, one event log.

Most tests run :func:`streamd.daemon.serve_socket` in this process on a
temporary path and talk to it over real Unix-socket connections; the stale
socket is left by a real ``streamd serve --socket`` killed with SIGKILL.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from support.faulty_disk import FaultyVFS
from support.rpc_client import Client
from support.serve_socket import connect
from support.serve_socket import in_process as socket_server

from streamd.daemon import Config, Daemon, serve_socket
from streamd.eventlog import EventLog
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, MethodTable, Server

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
# Long enough that anything a watcher sees inside the test's bound came from
# the in-process wake-up, never from the data_version poll.
NO_POLL = 10.0


def append(event_id: str, session: str = "s") -> dict[str, Any]:
    return {
        "app": "app",
        "user": "u",
        "session": session,
        "event": {"id": event_id, "author": "agent", "content": event_id},
    }


async def test_two_clients_at_once_append_into_one_log(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with socket_server(tmp_path, synchronous="NORMAL") as path:
            a, b = await connect(path), await connect(path)

            async def appends(client: Client, tag: str) -> None:
                # Pipelined: every request is sent before the first answer is read.
                ids = [
                    await client.start("eventlog/append", append(f"{tag}{i}")) for i in range(50)
                ]
                for request_id in ids:
                    assert (await client.response(request_id))["result"]["duplicate"] is False

            async with trio.open_nursery() as nursery:
                nursery.start_soon(appends, a, "a")
                nursery.start_soon(appends, b, "b")
            for client in (a, b):
                page = await client.result("eventlog/since", {"from_seq": 0})
                seqs = [e["seq"] for e in page["entries"]]
                assert len(seqs) == 100 and seqs == sorted(set(seqs))
                assert {e["event"]["id"][0] for e in page["entries"]} == {"a", "b"}


async def test_one_clients_append_wakes_another_clients_watch_at_once(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with socket_server(tmp_path, watch_interval=NO_POLL) as path:
            writer, watcher = await connect(path), await connect(path)
            await writer.result("eventlog/append", append("before"))
            watch_id = await watcher.start("eventlog/watch", {"from_seq": 0})
            # History first: once it has arrived the watch is caught up and
            # asleep, so each append below must wake it; a poll would take 10 s.
            assert (await watcher.notification())["params"]["entry"]["event"]["id"] == "before"
            for i in range(3):
                with trio.fail_after(NO_POLL / 4):
                    started = trio.current_time()
                    seq = (await writer.result("eventlog/append", append(f"live{i}")))["seq"]
                    note = await watcher.notification()
                    waited = trio.current_time() - started
                assert note["params"]["watch"] == watch_id
                assert note["params"]["entry"]["seq"] == seq
                assert note["params"]["entry"]["event"]["id"] == f"live{i}"
                assert waited < 1.0, waited


async def test_the_socket_file_is_private_to_its_user(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with socket_server(tmp_path) as path:
            st = os.stat(path)
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600
        assert not os.path.exists(path)  # removed when the server ends


async def test_a_socket_left_by_a_killed_server_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "streamd.sock"
    with trio.fail_after(30):
        proc = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "streamd",
                "serve",
                "--socket",
                str(path),
                "--db",
                str(tmp_path / "events.db"),
                "-v",
            ],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        assert proc.stderr is not None
        logged = b""
        while b"listening on" not in logged:  # its log says when it listens
            chunk = await proc.stderr.receive_some(65536)
            assert chunk, f"the server exited before listening: {logged!r}"
            logged += chunk
        client = await connect(str(path))
        assert await client.result("eventlog/append", append("from-the-dead")) == {
            "seq": 1,
            "duplicate": False,
        }
        proc.kill()
        await proc.wait()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)  # left behind, nobody listening
        async with socket_server(tmp_path) as served:
            again = await connect(served)
            page = await again.result("eventlog/since", {"from_seq": 0})
            assert [e["event"]["id"] for e in page["entries"]] == ["from-the-dead"]


async def test_a_live_servers_socket_is_refused_and_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with socket_server(tmp_path) as path:
            second = Daemon(Config(db=str(tmp_path / "other.db")))
            with pytest.raises(SystemExit, match="another server is listening"):
                await serve_socket(second, path)
            client = await connect(path)
            assert await client.result("eventlog/ping", {}) == {}
        assert not (tmp_path / "other.db").exists()


async def test_a_path_that_is_not_a_socket_is_never_removed(tmp_path: Path) -> None:
    path = tmp_path / "precious"
    path.write_text("keep me")
    with pytest.raises(SystemExit, match="exists and is not a socket"):
        await serve_socket(Daemon(Config(db=str(tmp_path / "events.db"))), str(path))
    assert path.read_text() == "keep me"


async def test_a_clients_leases_are_released_when_its_connection_closes(tmp_path: Path) -> None:
    key = {"app": "app", "user": "u", "session": "s"}
    with trio.fail_after(20):
        async with socket_server(tmp_path) as path:
            holder, other = await connect(path), await connect(path)
            held = await holder.result("eventlog/lock.acquire", key)
            refused = await other.call("eventlog/lock.acquire", key)
            assert refused["error"]["code"] == -32011
            assert refused["error"]["data"]["holder"] == held["holder"]
            await holder.stream.aclose()  # gone without lock.release
            # The release runs when the server notices the hang-up: ask until it
            # has (each ask is a round trip), far sooner than the 30 s a stale
            # lease would take.
            with trio.fail_after(5):
                while True:
                    reply = await other.call("eventlog/lock.acquire", key)
                    if "result" in reply:
                        break
                    assert reply["error"]["code"] == -32011
            assert reply["result"]["holder"] != held["holder"]


async def test_ending_the_socket_server_closes_the_shared_log(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(10):
        async with socket_server(tmp_path) as path:
            client = await connect(path)
            await client.result("eventlog/append", append("e1"))
            watch_id = await client.start("eventlog/watch", {"from_seq": 0})
            assert (await client.notification())["params"]["watch"] == watch_id
            assert Path(f"{db}-wal").exists()
        assert not Path(f"{db}-wal").exists()  # checkpointed and closed, not abandoned
        assert not os.path.exists(path)


@asynccontextmanager
async def log_socket_server(tmp_path: Path, methods: MethodTable) -> AsyncIterator[str]:
    """A Unix-socket server of ``methods`` (for a test that needs its own
    EventLog settings or to observe a handler); yields its path."""
    path = str(tmp_path / "log.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(16)
    server = Server(lambda conn: methods)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await server.serve(stream, stream)
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, [trio.SocketListener(sock)])
        yield path
        nursery.cancel_scope.cancel()


def big(event_id: str, size: int) -> dict[str, Any]:
    params = append(event_id)
    params["event"]["content"] = "x" * size
    return params


async def test_a_watch_whose_client_stops_reading_is_bounded_in_bytes_and_says_where_to_resume(
    tmp_path: Path,
) -> None:
    budget, size, count = 64 * 1024, 16 * 1024, 200
    ended = trio.Event()
    with trio.fail_after(30):
        async with EventLog(
            tmp_path / "events.db",
            synchronous="NORMAL",
            watch_interval=NO_POLL,
            watch_buffer_bytes=budget,
            watch_stall_timeout=0.5,
        ) as log:
            methods = {m.name: m for m in eventlog_methods(lambda: log)}
            watch = methods["eventlog/watch"]

            async def observed(params: Any, request: Any) -> Any:
                try:
                    return await watch.handler(params, request)
                finally:
                    ended.set()

            methods[watch.name] = Method(watch.name, watch.params, observed, watch.deadline)
            async with log_socket_server(tmp_path, methods) as path:
                watcher, writer = await connect(path), await connect(path)
                watch_id = await watcher.start("eventlog/watch", {"from_seq": 0})
                # From here the watcher reads nothing while another client appends
                # 200 entries of 16 KB (3.2 MB), pipelined; none of it waits on
                # the stalled client.
                ids = [
                    await writer.start("eventlog/append", big(f"e{i}", size)) for i in range(count)
                ]
                for request_id in ids:
                    assert "result" in await writer.response(request_id)
                await ended.wait()  # the stall timeout passed with no room
                assert await writer.result("eventlog/latest_seq", {}) == {"seq": count}
                late = await writer.result("eventlog/append", big("late", size))
                assert late["seq"] == count + 1

                # The client reads again: what was queued, then the error, then nothing.
                delivered = []
                while "method" in (frame := await watcher.frame()):
                    delivered.append(frame["params"]["entry"]["seq"])
                last = delivered[-1]
                assert delivered == list(range(1, last + 1))
                assert frame["id"] == watch_id
                assert frame["error"]["code"] == -32006
                assert frame["error"]["data"]["last_seq"] == last
                assert f"resume with from_seq={last}" in frame["error"]["message"]
                assert await watcher.result("eventlog/ping", {}) == {}
                assert watcher.notifications == []
                # Held for it: the budget plus what the kernel buffers on a Unix
                # socket, and one entry over (a notification is never split):
                # far from all 200 (3.2 MB).
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    kernel = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                assert len(delivered) * size <= budget + kernel + 2 * size, len(delivered)

                # Resuming from the seq it named delivers the rest exactly once.
                again = await watcher.start("eventlog/watch", {"from_seq": last})
                rest = [
                    (await watcher.notification())["params"]["entry"]["seq"]
                    for _ in range(count + 1 - last)
                ]
                assert rest == list(range(last + 1, count + 2))
                await watcher.send(
                    {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": again}}
                )
                assert (await watcher.response(again))["error"]["code"] == -32007


async def test_a_full_disk_fails_the_appends_that_meet_it_and_the_daemon_goes_on(
    tmp_path: Path, faulty_disk: FaultyVFS
) -> None:
    """Every client hears its append refused while the disk is full, reads go
    on, nothing acknowledged is lost, and appends succeed once space is back."""
    with trio.fail_after(30):
        async with socket_server(tmp_path) as path:
            writer, reader = await connect(path), await connect(path)
            assert (await writer.result("eventlog/append", append("kept")))["seq"] == 1
            faulty_disk.full = True
            try:
                for i in range(3):
                    answer = await writer.response(
                        await writer.start("eventlog/append", append(f"full{i}"))
                    )
                    assert answer["error"]["code"] == -32000, answer
                    assert "database or disk is full" in answer["error"]["message"], answer
                    page = await reader.result("eventlog/since", {"from_seq": 0})
                    assert [e["event"]["id"] for e in page["entries"]] == ["kept"]
            finally:
                faulty_disk.full = False
            assert (await writer.result("eventlog/append", append("after")))["seq"] == 2
            page = await reader.result("eventlog/since", {"from_seq": 0})
            assert [e["event"]["id"] for e in page["entries"]] == ["kept", "after"]
