"""Bulk methods (``Method.bulk``): reads whose answers can be megabytes are
computed a few at a time per connection, and only while the peer reads.

Before, a peer that pipelined reads and read no answer had every request in
flight (256) compute its answer: with pages of events of a few MiB each, a
gigabyte of daemon memory per connection."""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing
from support.rpc_client import Client, rpc
from support.rpc_streams import StalledStream

from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, Server

ANSWER = "x" * 1_000  # each answer's result: about a kilobyte on the wire


class Params(msgspec.Struct):
    n: int


class Reads:
    """A bulk read (``big``) and a plain one (``small``), counting the answers computed."""

    def __init__(self) -> None:
        self.computed: list[int] = []

    async def big(self, params: Params, request: Any) -> str:
        self.computed.append(params.n)
        return ANSWER

    def table(self) -> dict[str, Method]:
        return {"big": Method("big", Params, self.big, bulk=True),
                "plain": Method("plain", Params, self.big)}


async def flooded(method: str) -> tuple[Reads, int]:
    """A peer that writes 2,000 requests of ``method`` at once and reads
    nothing: how many answers the server computed, and the bytes it holds
    unwritten. (At once: the server reads many frames a chunk and dispatches
    them before any has run, as from a client that pipelines.)"""
    reads = Reads()
    client_end, server_end = trio.testing.memory_stream_pair()
    stream = StalledStream(server_end)
    server = Server(lambda conn: reads.table(), max_inflight=64, max_unwritten_bytes=4_000,
                    max_bulk=2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, stream, stream)
            await client_end.send_all(b"".join(rpc(n, method, {"n": n}) for n in range(2_000)))
            await trio.testing.wait_all_tasks_blocked()
            (session,) = server._sessions
            unwritten = session.conn.unwritten_bytes
            stream.release.set()
            nursery.cancel_scope.cancel()
    return reads, unwritten


async def test_a_peer_that_reads_no_answers_holds_a_bounded_number_of_bulk_answers() -> None:
    reads, unwritten = await flooded("big")
    # Within the 4,000 unwritten bytes, then at most the two slots' answers
    # past it (about 1,050 bytes each): about six, not the 64 in flight.
    assert 4 <= len(reads.computed) <= 7, reads.computed
    assert unwritten <= 4_000 + 2 * 1_100


async def test_a_method_not_bulk_is_bounded_by_the_requests_in_flight_alone() -> None:
    # What the bound was for every method before: the reads in flight (64
    # here) each computed their answer.
    reads, unwritten = await flooded("plain")
    assert len(reads.computed) == 64
    assert unwritten > 60_000


async def test_a_bulk_request_waiting_for_a_slot_is_cancelled_by_its_peer() -> None:
    reads = Reads()
    gate = trio.Event()

    async def held(params: Params, request: Any) -> str:
        reads.computed.append(params.n)
        await gate.wait()
        return ANSWER

    table = {"held": Method("held", Params, held, bulk=True)}
    client_end, server_end = trio.testing.memory_stream_pair()
    server = Server(lambda conn: table, max_bulk=1)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            client = Client(client_end)
            await client.send({"jsonrpc": "2.0", "id": 1, "method": "held", "params": {"n": 1}})
            await client.send({"jsonrpc": "2.0", "id": 2, "method": "held", "params": {"n": 2}})
            await trio.testing.wait_all_tasks_blocked()
            # One took the slot (which one is the scheduler's), the other waits for it.
            (running,) = reads.computed
            waiting = 3 - running
            await client.send({"jsonrpc": "2.0", "method": "$/cancelRequest",
                               "params": {"id": waiting}})
            cancelled = await client.response(waiting)
            assert cancelled["error"]["code"] == -32007
            gate.set()
            assert await client.response(running) == {
                "jsonrpc": "2.0", "id": running, "result": ANSWER}
            assert reads.computed == [running]
            nursery.cancel_scope.cancel()


def test_the_event_logs_page_reads_are_bulk_and_its_writes_are_not() -> None:
    table = {m.name: m for m in eventlog_methods(lambda: None)}  # type: ignore[arg-type,return-value]
    bulk = {name for name, m in table.items() if m.bulk}
    assert bulk == {
        "eventlog/since", "eventlog/sessions.get", "eventlog/sessions.get_many",
        "eventlog/sessions.list", "eventlog/state.get", "eventlog/boot.recent",
        "eventlog/branches",
    }
    assert not table["eventlog/watch"].bulk and not table["eventlog/append"].bulk


def test_recalls_searches_and_expands_are_bulk_on_both_sources() -> None:
    # Their answers can be megabytes (a max_candidates of thousands): before,
    # a connection pipelining searches had every one in flight compute its
    # answer, and 64 such clients took the daemon past the daemon-wide bound.
    from streamd.recall.eventlog.service import LogRecallService
    from streamd.recall.service import RecallService

    class Conn:  # what the services ask of a connection at their start: nothing runs
        def start_soon(self, *args: Any) -> None:
            pass

        def on_close(self, callback: Any) -> None:
            pass

    conn: Any = Conn()
    for service in (RecallService(conn), LogRecallService(conn, lambda: None)):  # type: ignore[arg-type]
        table = {m.name: m for m in service.methods()}
        assert {name for name, m in table.items() if m.bulk} == {"recall/search", "recall/expand"}
