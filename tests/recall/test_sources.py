"""Sources shared by the connections of a resident daemon.

Each test serves connections from one :class:`Daemon` with a
:class:`SourceRegistry`, over in-memory streams, as the socket server would.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from support.recall import Peer, health, init, inline, req, search
from support.recall_clock import in_seconds

from streamd.daemon import Daemon
from streamd.recall.sources import SourceRegistry
from streamd.rpc import Server


@asynccontextmanager
async def daemon(**registry_options: Any):
    """Yields ``connect``: opens one more connection to the same daemon."""
    registry = SourceRegistry(**registry_options)
    async with registry, trio.open_nursery() as nursery:
        server = Server(Daemon(sources=registry, offload=registry.offload).methods_for)
        peers: list[Peer] = []

        async def connect() -> Peer:
            client, end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, end, end)
            peer = Peer(client)
            peers.append(peer)
            return peer

        connect.registry = registry  # type: ignore[attr-defined]
        try:
            yield connect
        finally:
            for peer in peers:
                await peer.close_input()


async def handshake(peer: Peer, world: Any, **settings: Any) -> None:
    await peer.send(init(world, **settings))
    assert "result" in await peer.recv()


async def shutdown(peer: Peer) -> None:
    await peer.send(req(9, "recall/shutdown"))
    assert await peer.recv() == {"jsonrpc": "2.0", "id": 9, "result": {}}


@pytest.fixture
def world(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a", title="one"), w.rec("b", title="two"))
    return w


async def test_the_next_connection_finds_the_source_warm_and_generations_continue(world):
    with trio.fail_after(20):
        async with daemon() as connect:
            first = await connect()
            await handshake(first, world)
            await first.send(health(2))
            assert (await first.recv())["result"]["index_generation"] == "gen-1"
            await shutdown(first)
            world.append("a.jsonl", world.rec("c", title="three"))
            second = await connect()
            await handshake(second, world)
            await second.send(search(2, "three"))
            result = (await second.recv())["result"]
            assert result["diagnostics"]["generation"] == "gen-2"
            assert [c["source_record_id"] for c in result["candidates"]] == ["c"]
            (source,) = connect.registry.sources
            assert source.served.scanner.builds == 2  # one first build, one catch-up


async def test_two_connections_on_one_source_share_one_build(world):
    with trio.fail_after(20):
        async with daemon() as connect:
            a, b = await connect(), await connect()
            await handshake(a, world)
            await handshake(b, world)
            await a.send(health(2))
            await b.send(health(2))
            ga = (await a.recv())["result"]["index_generation"]
            gb = (await b.recv())["result"]["index_generation"]
            assert ga == gb == "gen-1"
            assert connect.registry.open_count == 1


async def test_other_settings_are_another_source(world):
    with trio.fail_after(20):
        async with daemon() as connect:
            a, b = await connect(), await connect()
            await handshake(a, world)
            await handshake(b, world, max_candidates=5)
            assert connect.registry.open_count == 2


async def test_a_build_goes_on_after_the_connection_that_started_it_is_gone(gated_world):
    w, gate = gated_world
    with trio.fail_after(60):
        async with daemon() as connect:
            first = await connect()
            await handshake(first, w)
            await first.send(req(2, "recall/health", deadline=in_seconds(5)))
            assert (await first.recv())["result"]["coverage"] == "partial"
            await shutdown(first)
            gate.open()  # the build the first connection started may go on
            second = await connect()
            await handshake(second, w)
            await second.send(req(2, "recall/refresh", deadline=in_seconds(60)))
            done = (await second.recv())["result"]
            assert done["coverage"] == "complete" and done["indexed_count"] == 3_000  # gated_world
            # One build, which the first connection started: nothing started over.
            (source,) = connect.registry.sources
            assert source.served.scanner.builds == 1


async def test_an_idle_source_is_closed_after_its_idle_time(world, autojump_clock):
    with trio.fail_after(600):
        async with daemon(idle_close=60, offload=inline) as connect:
            peer = await connect()
            await handshake(peer, world)
            await peer.send(health(2))
            await peer.recv()
            registry = connect.registry
            await shutdown(peer)
            await trio.sleep(59)
            assert registry.open_count == 1
            await trio.sleep(2)
            assert registry.open_count == 0


async def test_past_max_open_the_least_recently_used_idle_source_is_closed(world):
    world.write("b.jsonl", world.rec("x", title="other"))
    with trio.fail_after(20):
        async with daemon(max_open=1) as connect:
            a = await connect()
            await handshake(a, world)
            await shutdown(a)
            b = await connect()
            await handshake(b, world, files=["b.jsonl"])
            registry = connect.registry
            assert registry.open_count == 1
            ((_, _, _, path, _),) = [s.key for s in registry.sources]
            assert path.endswith("b.jsonl")
