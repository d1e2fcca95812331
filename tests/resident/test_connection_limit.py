"""A resident daemon serving as many connections as it takes
(``--max-connections``): a client past that is told so by name, through either
``attach``, ``streamd status`` and the typed client, and not mistaken for no
daemon at all (attach used to start another and report it dead); ``streamd
stop`` still stops it (SIGTERM, to the pid that holds the lock and listens)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from support.resident import Conn, World, make_world, req, wait_for

from streamd import is_closed
from streamd.client import AsyncClient, Client
from streamd.errors import RpcError

pytestmark = pytest.mark.subprocess

LIMIT_WORDS = "serves at most 2 connections at once"


@pytest.fixture
def world(attach_kind: str):
    yield from make_world(attach_kind)


def held(world: World, stack: contextlib.ExitStack, n: int) -> list[Conn]:
    """``n`` connections the daemon serves (each answered a hello). A
    connection another client closed counts until the daemon has read its
    end, so one made just after can be refused: it is made again."""

    def served() -> Conn | None:
        conn = world.connect()
        try:
            conn.send(req(1, "streamd/hello", client_version="0"))
            reply = conn.frame() or {}
        except OSError:
            reply = {}
        if "result" in reply:
            return stack.enter_context(conn)
        conn.sock.close()
        if reply:  # what else could it be: a refusal
            assert reply["error"]["data"]["reason"] == "too_many_connections", reply
        return None

    return [wait_for(served, 10, "a connection the daemon serves") for _ in range(n)]


def test_a_client_past_the_limit_is_told_so_and_the_daemon_serves_on(world: World) -> None:
    daemon = world.start_daemon("--max-connections", "2")
    with contextlib.ExitStack() as stack:
        conns = held(world, stack, 2)
        attach = world.run("attach", input=json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "recall/health", "params": {}}) + "\n")
        assert attach.returncode == 1, attach.stderr
        assert f"the daemon (pid {daemon.pid}) refused this client" in attach.stderr
        assert LIMIT_WORDS in attach.stderr
        assert world.daemons() == [daemon.pid]  # none other was started
        # It runs: status says so (exit 0), with why it could say no more.
        status = world.run("status")
        assert status.returncode == 0, status.stderr
        assert f"running, pid {daemon.pid}, but it refused" in status.stdout
        assert LIMIT_WORDS in status.stdout
        status = world.run("status", "--json")
        assert status.returncode == 0, status.stderr
        got = json.loads(status.stdout)
        assert got["running"] is True and got["pid"] == daemon.pid
        assert LIMIT_WORDS in got["refused"]
        conns[0].sock.close()
        # A slot freed is taken (once the daemon has seen the close).
        assert world.wait_answering()["pid"] == daemon.pid


async def latest_seq_async(socket: str) -> int:
    client = await AsyncClient.connect_socket(socket)
    try:
        return await client.latest_seq()
    finally:
        await client.aclose()


@pytest.mark.no_attach
@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_the_typed_client_says_why_the_connection_ended(world: World, kind: str) -> None:
    world.start_daemon("--max-connections", "1")
    with contextlib.ExitStack() as stack:
        held(world, stack, 1)
        # Asked again and again: whether the request is written before or
        # after the daemon's close, the client reads the refusal's words.
        for _ in range(10):
            with pytest.raises(RpcError) as caught:
                if kind == "asyncio":
                    asyncio.run(latest_seq_async(str(world.socket)))
                else:
                    with Client.connect_socket(str(world.socket)) as client:
                        client.latest_seq()
            assert "serves at most 1 connections at once" in caught.value.message
            assert caught.value.data == {"reason": "too_many_connections", "limit": 1}
            assert is_closed(caught.value)  # what a caller tests to connect again


@pytest.mark.no_attach
def test_stop_stops_a_daemon_that_takes_no_more_connections(world: World) -> None:
    daemon = world.start_daemon("--max-connections", "1")
    with contextlib.ExitStack() as stack:
        held(world, stack, 1)
        stop = world.run("stop")
        assert stop.returncode == 0, stop.stderr
        assert f"stopped (pid {daemon.pid})" in stop.stdout
        assert "sending it SIGTERM" in stop.stderr
        assert daemon.wait(10) == 0
