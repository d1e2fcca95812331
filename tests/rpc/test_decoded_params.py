"""What decoded params cost, and what a connection is charged for them.

A frame of small containers decodes to some 24 times its bytes, so the
in-flight bound counts each request's estimated decoded size
(:mod:`streamd.rpc.footprint`), a request waits for room before it is
decoded, and params estimated past ``max_decoded`` are refused undecoded.
Counted, never timed: starts of a gated handler, decodes, and ``tracemalloc``.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from support.hostile import Peer

from streamd import errors
from streamd.eventlog import EventLog
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, Server
from streamd.rpc.footprint import MAX_DECODED_BYTES
from streamd.rpc.framing import MAX_FRAME_BYTES
from streamd.rpc.protocol import Call, FrameReader


def padded(
    request_id: int, method: str, item: bytes, size: int, params: Any = None
) -> bytes:
    """A request whose params' ``"@"`` (``{"pad": "@"}`` by default) is a list
    of ``item``, the frame ``size`` bytes long (newline included)."""
    params = {"pad": "@"} if params is None else params
    head, tail = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                             "params": params}).encode().split(b'"@"')
    count = (size - len(head) - len(tail) - 3) // (len(item) + 1)
    frame = head + b"[" + b",".join([item] * count) + b"]" + tail
    return frame + b" " * (size - 1 - len(frame)) + b"\n"


def one_string(request_id: int, method: str, size: int, char: str = "x") -> bytes:
    """A request whose params hold one string, the frame ``size`` bytes long."""
    head = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                       "params": {"text": ""}}).encode()[:-3]
    body = char.encode() * ((size - len(head) - 4) // len(char.encode()))
    frame = head + body + b'"}}'
    return frame + b" " * (size - 1 - len(frame)) + b"\n"


def call_of(frame: bytes) -> Call:
    reader = FrameReader()
    [line] = reader.feed(frame)
    call = reader.event(line)
    assert isinstance(call, Call)
    return call


class Gate:
    """A method whose handler blocks until released; counts starts and decodes."""

    def __init__(self) -> None:
        self.started = 0
        self.decoded = 0
        self.release = trio.Semaphore(0)
        gate = self

        class Params(msgspec.Struct):
            pad: list[Any] = []
            text: str = ""

            def __post_init__(self) -> None:
                gate.decoded += 1

        self.params = Params

    async def wait(self, params: Any, req: Any) -> Any:
        self.started += 1
        await self.release.acquire()
        return {}

    def table(self, conn: Any) -> dict[str, Method]:
        return {"wait": Method("wait", self.params, self.wait)}


@asynccontextmanager
async def session(methods: Any, **options: Any) -> AsyncIterator[Peer]:
    client, server_end = trio.testing.memory_stream_pair()
    server = Server(methods, **options)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, server_end, server_end)
        try:
            yield Peer(client)
        finally:
            await client.send_stream.aclose()


# --- the estimate, sans I/O ---------------------------------------------------------------


def test_a_frame_of_empty_objects_is_charged_more_than_it_decodes_to_and_a_string_its_size():
    objects = padded(1, "m", b"{}", 256 << 10)
    [params] = [json.loads(objects)["params"]]
    tracemalloc.start()
    try:
        decoded = msgspec.json.decode(objects)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert decoded["params"] == params
    assert call_of(objects).held >= held > 20 * len(objects)
    text = one_string(1, "m", 1 << 20)
    assert len(text) <= call_of(text).held <= len(text) + 1024
    # One character past U+FFFF makes the whole string four bytes a character.
    wide = one_string(1, "m", 1 << 20, "\U0001f600")
    assert call_of(wide).held >= 4 * len(wide)


def test_params_estimated_past_the_limit_are_a_params_fault_and_a_frame_of_one_string_is_not():
    reader = FrameReader()
    [line] = reader.feed(padded(7, "m", b"{}", MAX_FRAME_BYTES))
    call = reader.event(line)
    assert isinstance(call, Call) and call.id == 7
    assert call.params_fault is not None and "once decoded" in call.params_fault
    assert call.held == len(line)  # never decoded, so it holds only its frame
    for char in ("x", "\U0001f600"):
        [line] = reader.feed(one_string(8, "m", MAX_FRAME_BYTES, char))
        call = reader.event(line)
        assert isinstance(call, Call) and call.params_fault is None
        assert call.held <= MAX_DECODED_BYTES


# --- the server ---------------------------------------------------------------------------


async def test_the_in_flight_bytes_count_what_params_take_decoded_not_their_frames_bytes():
    gate = Gate()
    with trio.fail_after(20):
        async with session(gate.table, max_inflight_bytes=1 << 20) as peer:
            # Eight frames of 32 KiB: 256 KiB of frames, some 16 MiB decoded.
            await peer.raw(b"".join(padded(i, "wait", b"{}", 32 << 10) for i in range(8)))
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 1
            for _ in range(8):
                gate.release.release()
            assert sorted([(await peer.recv())["id"] for _ in range(8)]) == list(range(8))
            # Eight frames of one 100 KB string each: about their size, all at once.
            await peer.raw(b"".join(one_string(10 + i, "wait", 100_000) for i in range(8)))
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 8 + 8
            for _ in range(8):
                gate.release.release()
            assert sorted([(await peer.recv())["id"] for _ in range(8)]) == list(range(10, 18))


async def test_a_request_waiting_for_room_is_not_decoded_yet():
    gate = Gate()
    with trio.fail_after(10):
        async with session(gate.table, max_inflight=1) as peer:
            await peer.raw(b"".join(padded(i, "wait", b"{}", 4096) for i in range(3)))
            await trio.testing.wait_all_tasks_blocked()
            assert (gate.started, gate.decoded) == (1, 1)
            for _ in range(3):
                gate.release.release()
            assert sorted([(await peer.recv())["id"] for _ in range(3)]) == [0, 1, 2]
            assert gate.decoded == 3


async def test_params_that_would_decode_past_the_limit_are_refused_by_id_and_never_decoded():
    gate = Gate()
    frame = padded(5, "wait", b"{}", MAX_FRAME_BYTES)
    tracemalloc.start()
    try:
        with trio.fail_after(60):
            async with session(gate.table) as peer:
                tracemalloc.reset_peak()
                await peer.raw(frame)
                got = await peer.recv()
                peak = tracemalloc.get_traced_memory()[1]
                assert got["id"] == 5 and got["error"]["code"] == errors.INVALID_PARAMS
                assert "once decoded" in got["error"]["message"]
                assert (gate.started, gate.decoded) == (0, 0)
                # The connection goes on.
                await peer.raw(one_string(6, "wait", 1000))
                await trio.testing.wait_all_tasks_blocked()
                gate.release.release()
                assert (await peer.recv())["id"] == 6
    finally:
        tracemalloc.stop()
    # The frame and a few copies of it, never the 200 MB it decodes to.
    assert peak < 8 * MAX_FRAME_BYTES, peak


@pytest.mark.parametrize("char", ["x", "\U0001f600"])
async def test_a_frame_of_the_largest_size_holding_one_string_is_still_served(char):
    gate = Gate()
    with trio.fail_after(30):
        async with session(gate.table) as peer:
            await peer.raw(one_string(1, "wait", MAX_FRAME_BYTES, char))
            await trio.testing.wait_all_tasks_blocked()
            assert gate.started == 1
            gate.release.release()
            assert (await peer.recv()) == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_an_append_of_8_mib_of_empty_objects_is_refused_undecoded_by_its_id(
    tmp_path: Path,
):
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        methods = {m.name: m for m in eventlog_methods(lambda: log)}
        frame = padded(3, "eventlog/append", b"{}", MAX_FRAME_BYTES, {
            "app": "a", "user": "u", "session": "s",
            "event": {"id": "e", "author": "x", "content": "@"}})
        with trio.fail_after(60):
            async with session(lambda conn: methods) as peer:
                await peer.raw(frame)
                got = await peer.recv()
                assert got["id"] == 3 and got["error"]["code"] == errors.INVALID_PARAMS
                assert got["error"]["message"].startswith("eventlog/append params: would take")
                assert await log.latest_seq() == 0


@pytest.mark.parametrize("shape", ["table rows", "function calls"])
async def test_an_append_of_structured_content_at_the_event_limit_is_stored(
    tmp_path: Path, shape: str
):
    # Before: params estimated past 64 MiB were refused, and an event of
    # some 3.6 MiB of table rows or function calls (a tool's result) is
    # estimated past it, though events of 5 MiB are stored.
    if shape == "table rows":
        content: Any = [{"id": i, "name": f"item {i}", "price": i * 1.5, "tags": ["a", "b"]}
                        for i in range(64_000)]
    else:
        content = {"parts": [{"function_call": {"name": "lookup", "args": {"q": f"x{i}", "n": i}}}
                             for i in range(64_000)]}
    frame = json.dumps({"jsonrpc": "2.0", "id": 4, "method": "eventlog/append", "params": {
        "app": "a", "user": "u", "session": "s",
        "event": {"id": "e", "author": "x", "content": content}}}).encode() + b"\n"
    assert 4 << 20 < len(frame) < 5 << 20
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        methods = {m.name: m for m in eventlog_methods(lambda: log)}
        with trio.fail_after(60):
            async with session(lambda conn: methods) as peer:
                await peer.raw(frame)
                assert await peer.recv() == {
                    "jsonrpc": "2.0", "id": 4, "result": {"seq": 1, "duplicate": False}}
        [entry] = (await log.since(0)).entries
        assert entry.event.content == content
