"""Hostile input: one bad frame costs its sender one error answer, never the process.

One ``streamd serve --socket`` serves every client on a machine, so each test
here sends what a broken or malicious client might and then checks two
things: the bad frame got its answer, and the connection (or another client)
is still served. Three settings: ``streamd.rpc.Server`` over in-memory
streams (the mechanism, with test method tables where a handler must block or
misbehave), the real process on pipes, and ``serve_socket`` with two clients.
Waiting is on frames, events and Trio's scheduler, never on sleeps; every
test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from support.hostile import DEEP, FAR, INVALID_UTF8, Peer, answer, request

from streamd.daemon import Daemon
from streamd.errors import RpcError
from streamd.rpc import Method, Server


@asynccontextmanager
async def session(methods: Any = None, **options: Any) -> AsyncIterator[Peer]:
    """A Server on one end of an in-memory stream pair; the real method table
    unless ``methods`` (a per-connection table factory) is given."""
    client, server_end = trio.testing.memory_stream_pair()
    server = Server(methods or Daemon().methods_for, **options)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, server_end, server_end)
        try:
            yield Peer(client)
        finally:
            await client.send_stream.aclose()






# --- 1. invalid UTF-8, and any failure while handling a frame --------------------------------


@pytest.mark.parametrize("where", INVALID_UTF8)
async def test_invalid_utf8_in_any_string_is_answered_and_the_connection_lives(where):
    frame, expected = INVALID_UTF8[where]
    with trio.fail_after(10):
        async with session() as peer:
            await peer.raw(frame + b"\n")
            if expected is not None:
                assert answer(await peer.recv()) == expected
            await peer.pinged()


async def test_a_lone_surrogate_escape_is_named_as_such_and_answered_with_the_id():
    # An unreadable frame is answered with id null; a request whose params
    # hold a lone surrogate is a request, and its client waits for its id.
    with trio.fail_after(10):
        async with session() as peer:
            await peer.raw(b'{"jsonrpc":"2.0","id":1,"method":"eventlog/ping",'
                           b'"params":{"a":"\\udc00\\ud800x"}}\n')
            frame = await peer.recv()
            assert answer(frame) == (1, -32602)
            assert frame["error"]["message"] == (
                "eventlog/ping params: a \\u escape of a lone surrogate (D800-DFFF),"
                " which no UTF-8 string can hold")
            await peer.raw(b'{"jsonrpc":"2.0","id":2,"method":"\\ud800"}\n')
            frame = await peer.recv()
            assert answer(frame) == (2, -32700) and "lone surrogate" in frame["error"]["message"]
            # An id that holds one cannot be answered: id null.
            await peer.raw(b'{"jsonrpc":"2.0","id":"\\ud800","method":"eventlog/ping"}\n')
            frame = await peer.recv()
            assert answer(frame) == (None, -32700) and "surrogate" in frame["error"]["message"]
            # A frame that really is cut short still says so.
            await peer.raw(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\\ud800\\udc00"\n')
            message = (await peer.recv())["error"]["message"]
            assert message == "parse error: Input data was truncated"


class Exploding(Mapping[str, Method]):
    """A method table whose lookup fails: a failure the frame handler did not foresee."""

    def __init__(self, inner: Mapping[str, Method]) -> None:
        self.inner = inner

    def __getitem__(self, name: str) -> Method:
        if name == "boom":
            raise ZeroDivisionError("lookup exploded")
        return self.inner[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name == "boom" or name in self.inner else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


async def test_an_unexpected_failure_looking_up_a_method_is_internal_error_to_the_requests_id():
    # As when the first eventlog/* call's import of the log's methods fails
    # for want of descriptors: its client waits for an answer to its id, and
    # an error with id null (what it was answered before) is none.
    daemon = Daemon()
    with trio.fail_after(10):
        async with session(lambda conn: Exploding(daemon.methods_for(conn))) as peer:
            await peer.send(request(1, "boom"))
            assert answer(await peer.recv()) == (1, -32603)
            await peer.pinged()


async def test_an_error_whose_data_json_cannot_carry_is_still_answered():
    async def bad_data(params: Any, req: Any) -> Any:
        raise RpcError(-32000, "unavailable", data={"when": object()})

    async def bad_result(params: Any, req: Any) -> Any:
        return {"value": object()}

    table = {
        "bad/data": Method("bad/data", dict, bad_data),
        "bad/result": Method("bad/result", dict, bad_result),
    }
    with trio.fail_after(10):
        async with session(lambda conn: table) as peer:
            await peer.send(request(1, "bad/data"), request(2, "bad/result"))
            got = {answer(await peer.recv()) for _ in range(2)}
            assert got == {(1, -32603), (2, -32603)}
            await peer.send(request(3, "bad/data"))
            assert answer(await peer.recv()) == (3, -32603)


# --- 2. nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DEEP)
async def test_a_frame_nested_too_deep_is_refused_before_decoding_and_the_session_goes_on(name):
    with trio.fail_after(20):
        async with session() as peer:
            await peer.raw(DEEP[name] + b"\n")
            frame = await peer.recv()
            assert answer(frame) == (None, -32600)
            assert "128 levels" in frame["error"]["message"]
            await peer.pinged()


async def test_nesting_up_to_the_limit_is_decoded_as_usual():
    # 128 levels with the request object and params: only the params are wrong.
    params = b"[" * 126 + b"]" * 126
    frame = b'{"jsonrpc":"2.0","id":1,"method":"recall/health","params":{"deadline":%s}}' % params
    with trio.fail_after(10):
        async with session() as peer:
            await peer.raw(frame + b"\n")
            assert answer(await peer.recv()) == (1, -32602)


async def test_brackets_inside_strings_are_not_nesting():
    deep_text = "[{" * 5000
    with trio.fail_after(10):
        async with session() as peer:
            await peer.send(request(1, "no/such", text=deep_text))
            assert answer(await peer.recv()) == (1, -32601)


# --- 6. batches, null ids, big integers ---------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "code", "words"),
    [
        (b'[{"jsonrpc":"2.0","id":1,"method":"recall/health","params":{}}]', -32600,
         "batch requests are not supported"),
        (b"[1,2,3]", -32600, "batch requests are not supported"),
        (b"[]", -32600, "empty batch"),
        (b"[ ]", -32600, "empty batch"),
        (b'[{"jsonrpc":"2.0"', -32700, "truncated"),
    ],
)
async def test_a_batch_is_refused_with_one_error_that_says_so(frame, code, words):
    with trio.fail_after(10):
        async with session() as peer:
            await peer.raw(frame + b"\n")
            got = await peer.recv()
            assert answer(got) == (None, code)
            assert words in got["error"]["message"]
            await peer.pinged()


async def test_a_request_with_a_null_id_is_answered_with_a_null_id():
    with trio.fail_after(10):
        async with session() as peer:
            await peer.send(request(None, "recall/health", deadline=FAR))
            frame = await peer.recv()
            assert frame["id"] is None and frame["result"]["status"] == "unavailable"
            # Two at once are not "already in flight": neither can be cancelled by id.
            await peer.send(request(None, "no/such"), request(None, "no/such/either"))
            assert [answer(await peer.recv()) for _ in range(2)] == [(None, -32601)] * 2


async def test_an_integer_id_beyond_64_bits_is_an_invalid_request():
    with trio.fail_after(10):
        async with session() as peer:
            await peer.send(request(2**63, "recall/health", deadline=FAR))
            assert answer(await peer.recv()) == (None, -32600)
            await peer.send(request(-(2**63) - 1, "recall/health", deadline=FAR))
            assert answer(await peer.recv()) == (None, -32600)
            await peer.send(request(2**63 - 1, "recall/health", deadline=FAR))
            assert (await peer.recv())["id"] == 2**63 - 1


def _initialize(world, **settings: Any) -> dict[str, Any]:
    return request(
        1, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
        workdir=str(world.work), source_id="signals", location=str(world.data),
        settings={"files": ["a.jsonl"], **settings},
    )


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("recall/search", {"query": "", "filters": {}, "limit": 2**63, "deadline": FAR}, "limit"),
        ("recall/search", {"query": "", "filters": {}, "limit": 10**400, "deadline": FAR},
         "limit"),
        ("recall/expand", {"locator": "signals:v2/a", "detail": "full", "budget_bytes": 2**63,
                           "deadline": FAR}, "budget_bytes"),
    ],
)
async def test_recall_integers_beyond_gos_int_are_invalid_params(recall_world, method, params,
                                                                 field):
    recall_world.write("a.jsonl", recall_world.rec("a", title="one"))
    with trio.fail_after(10):
        async with session() as peer:
            await peer.send(_initialize(recall_world))
            assert "result" in await peer.recv()
            await peer.send({"jsonrpc": "2.0", "id": 2, "method": method, "params": params})
            frame = await peer.recv()
            assert answer(frame) == (2, -32602)
            assert field in frame["error"]["message"]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("max_candidates", 2**63), ("debug_stall_ms", 2**63), ("debug_stall_ms", 10**400),
     ("debug_stall_ms", 1e19)],
)
async def test_settings_integers_beyond_gos_int_are_invalid_params(recall_world, setting, value):
    recall_world.write("a.jsonl", recall_world.rec("a", title="one"))
    with trio.fail_after(10):
        async with session() as peer:
            await peer.send(_initialize(recall_world, **{setting: value}))
            frame = await peer.recv()
            assert answer(frame) == (1, -32602)
            assert f"Settings.{setting} of type int" in frame["error"]["message"]


# --- 5. in-flight bounds --------------------------------------------------------------------


class Gate:
    """A method table whose handler blocks until released, counting starts."""

    def __init__(self) -> None:
        self.started = 0
        self.release = trio.Semaphore(0)

    async def wait(self, params: Any, req: Any) -> Any:
        self.started += 1
        await self.release.acquire()
        return {}

    def table(self, conn: Any) -> dict[str, Method]:
        return {"wait": Method("wait", dict, self.wait)}


async def test_the_reader_stops_at_the_in_flight_count_and_resumes_as_requests_finish():
    gate = Gate()
    with trio.fail_after(10):
        async with session(gate.table, max_inflight=3) as peer:
            await peer.send(*(request(i, "wait") for i in range(10)))
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 3
            gate.release.release()
            # Which of the three admitted requests the release wakes is the
            # scheduler's choice; that the fourth waited for it is the claim.
            first = (await peer.recv())["id"]
            assert first in {0, 1, 2}
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 4
            for _ in range(6):
                gate.release.release()
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 10
            for _ in range(3):
                gate.release.release()
            rest = sorted([(await peer.recv())["id"] for _ in range(9)])
            assert rest == sorted(set(range(10)) - {first})


async def test_the_reader_stops_at_the_in_flight_bytes_but_always_admits_one_request():
    gate = Gate()
    padding = "x" * 600  # each frame is about 660 bytes
    with trio.fail_after(10):
        async with session(gate.table, max_inflight_bytes=1000) as peer:
            await peer.send(*(request(i, "wait", pad=padding) for i in range(3)))
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 1
            gate.release.release()
            assert (await peer.recv())["id"] == 0
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 2
            # A frame over the whole bound is still served, alone.
            await peer.send(request(9, "wait", pad="y" * 5000))
            for _ in range(3):
                gate.release.release()
            assert sorted([(await peer.recv())["id"] for _ in range(3)]) == [1, 2, 9]


async def test_a_slot_is_held_until_the_answer_is_queued_so_a_peer_that_never_reads_is_bounded():
    gate = Gate()
    client, server_end = trio.testing.lockstep_stream_pair()
    server = Server(gate.table, max_inflight=4)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for i in range(100_000):
                    await client.send_all(json.dumps(request(i, "wait")).encode() + b"\n")
                    sent += 1

            nursery.start_soon(flood)
            for _ in range(100_000):
                gate.release.release()
            await trio.testing.wait_all_tasks_blocked()
            # Nobody reads the answers: the writer blocks, then the outbox, then
            # the handlers holding their slots, then the reader; and the client.
            stalled_at = sent
            assert gate.started < 2_000 and stalled_at < 2_000
            await trio.testing.wait_all_tasks_blocked()
            assert sent == stalled_at
            nursery.cancel_scope.cancel()


async def test_a_peer_that_never_reads_its_error_answers_stops_being_read():
    # An error answer can be nearly as large as its frame (msgspec names the
    # unknown field, key and all): such answers count against the unwritten
    # bound like any other, or a peer that sends 8 MiB keys and reads nothing
    # holds 1,024 of them (the outbox's bound is in frames).
    client, server_end = trio.testing.lockstep_stream_pair()
    server = Server(Daemon().methods_for, max_unwritten_bytes=20_000)
    frame = json.dumps(request(1, "eventlog/ping", **{"k" * 10_000: 1})).encode() + b"\n"
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for _ in range(500):
                    await client.send_all(frame)
                    sent += 1

            nursery.start_soon(flood)
            await trio.testing.wait_all_tasks_blocked()
            # Answered until the bound (two or three of them), then not read.
            stalled_at = sent
            assert stalled_at < 10
            await trio.testing.wait_all_tasks_blocked()
            assert sent == stalled_at
            assert b"k" * 10_000 in await client.receive_some(1 << 16)  # one was answered
            nursery.cancel_scope.cancel()


async def test_a_finished_request_leaves_no_copy_of_its_frame_behind():
    async def ok(params: Any, req: Any) -> Any:
        return {}

    table = {"ok": Method("ok", dict, ok)}
    frame = json.dumps(request(1, "ok", blob="x" * (4 << 20))).encode() + b"\n"
    tracemalloc.start()
    try:
        with trio.fail_after(20):
            async with session(lambda conn: table) as peer:
                await peer.send(request(0, "ok"))
                await peer.recv()
                await trio.testing.wait_all_tasks_blocked()
                before = tracemalloc.get_traced_memory()[0]
                await peer.raw(frame)
                assert (await peer.recv())["id"] == 1
                await trio.testing.wait_all_tasks_blocked()
                held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1 << 20, held
