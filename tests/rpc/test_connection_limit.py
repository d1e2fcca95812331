"""The server's bound on connections served at once (``max_connections``):
one past it is answered one error and closed, the others are served on, and
a slot freed is taken by the next connection."""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing
from support.rpc_client import Client

from streamd.rpc import Method, Server


class Params(msgspec.Struct):
    n: int


async def echo(params: Params, request: Any) -> int:
    return params.n


def methods(conn: Any) -> dict[str, Method]:
    return {"echo": Method("echo", Params, echo)}


async def test_a_connection_past_the_limit_is_refused_and_the_others_served() -> None:
    server = Server(methods, max_connections=2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            clients = []
            for _ in range(2):
                client_end, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve, server_end, server_end)
                clients.append(Client(client_end))
            for n, client in enumerate(clients):
                assert await client.result("echo", {"n": n}) == n

            # The third: one frame, no id (it sent nothing), then end of stream.
            client_end, server_end = trio.testing.memory_stream_pair()
            await server.serve(server_end, server_end)
            await server_end.aclose()
            refused = Client(client_end)
            frame = await refused.frame()
            assert frame["id"] is None
            assert frame["error"]["code"] == -32000
            assert frame["error"]["data"] == {"reason": "too_many_connections", "limit": 2}
            assert "at most 2 connections" in frame["error"]["message"]
            assert await client_end.receive_some(100) == b""

            # The two are served on; one leaving frees a slot for the next.
            assert await clients[1].result("echo", {"n": 7}) == 7
            await clients[0].stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            assert await Client(client_end).result("echo", {"n": 9}) == 9
            nursery.cancel_scope.cancel()


async def test_a_refused_peer_that_reads_nothing_costs_a_bounded_wait(autojump_clock) -> None:
    # Half a second for a slot to free, then the refusal's one frame waits
    # at most a second for a peer that does not read; then it is given up.
    server = Server(methods, max_connections=0)
    client_end, server_end = trio.testing.lockstep_stream_pair()  # no buffer at all
    start = trio.current_time()
    await server.serve(server_end, server_end)
    assert trio.current_time() - start == 1.5
    await client_end.aclose()


async def test_a_connection_whose_input_ended_frees_its_slot_for_the_next() -> None:
    # A client that closes and connects again at once: its old connection is
    # still being wound down (its end of input not yet read, or its last
    # answers due) when the new one comes; the new one waits for the slot.
    server = Server(methods, max_connections=1)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for n in range(20):
                client_end, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve, server_end, server_end)
                client = Client(client_end)
                assert await client.result("echo", {"n": n}) == n, n
                await client_end.send_eof()  # and away, without waiting for the close
            nursery.cancel_scope.cancel()


async def test_refusals_are_logged_once_a_while_with_their_count(autojump_clock, caplog) -> None:
    server = Server(methods, max_connections=0)
    for _ in range(5):
        _client_end, server_end = trio.testing.memory_stream_pair()
        await server.serve(server_end, server_end)
    await trio.sleep(11)  # the mock clock: past the ten seconds
    for _ in range(2):
        _client_end, server_end = trio.testing.memory_stream_pair()
        await server.serve(server_end, server_end)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines == ["refused 1 connection in the last 10 s: 0 are open, the limit",
                     "refused 5 connections in the last 10 s: 0 are open, the limit"]
