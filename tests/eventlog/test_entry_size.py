"""Every event the log takes can be read back in one frame.

A client holds frames to the 8 MiB limit (``streamd.rpc.framing``) and drops
a longer one, so an entry stored larger than a frame could never be read
back: the read or the watch waiting for it waited for ever. The stored form
can be larger than the request that carried it (a float's text grows, an entry
has keys the request leaves out), so the size is checked at append on the
stored form (``MAX_ENTRY_BYTES``). Over the real method table, in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing
from support.rpc_client import Client

from streamd.daemon import Config, Daemon
from streamd.eventlog.model import MAX_ENTRY_BYTES, MAX_STATE_BYTES
from streamd.rpc import Server
from streamd.rpc.framing import MAX_FRAME_BYTES

SESSION = {"app": "a", "user": "u", "session": "s"}


def appended(content: Any) -> dict[str, Any]:
    return {**SESSION, "event": {"id": "e", "author": "x", "content": content}}


@asynccontextmanager
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    daemon = Daemon(Config(db=str(tmp_path / "events.db")))
    server = Server(daemon.methods_for)
    client_end, server_end = trio.testing.memory_stream_pair()
    async with daemon.running(), trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, server_end, server_end)
        c = Client(client_end)
        await c.result("eventlog/sessions.create", SESSION)
        yield c
        await client_end.aclose()


async def test_an_event_stored_larger_than_a_frame_is_refused_though_its_request_fits(
    tmp_path: Path,
) -> None:
    # 1e15 is four bytes in the request and stored as 1000000000000000.0: a
    # 7 MiB request made a 33 MiB entry that no client could read.
    content = [1e15] * ((7 << 20) // 5)
    with trio.fail_after(60):
        async with client(tmp_path) as c:
            frame = msgspec.json.encode(appended("")).replace(
                b'"content":""', b'"content":[' + b",".join([b"1e15"] * len(content)) + b"]"
            )
            assert len(frame) < MAX_FRAME_BYTES
            request_id = next(c.ids)
            await c.stream.send_all(
                b'{"jsonrpc":"2.0","id":%d,"method":"eventlog/append","params":%s}\n'
                % (request_id, frame)
            )
            error = (await c.response(request_id))["error"]
            assert error["code"] == -32602
            assert f"over the {MAX_ENTRY_BYTES} bytes an entry may take" in error["message"]
            page = await c.result("eventlog/since", {"from_seq": 0})
            assert page["entries"] == []


async def test_the_largest_event_taken_reads_back_in_one_frame_and_one_byte_more_is_refused(
    tmp_path: Path,
) -> None:
    # What the fields take beside the content's text, as the log encodes them.
    beside = len(msgspec.json.encode(["a", "u", "s", "e", "x", "", "", None, "", None]))
    largest = "x" * (MAX_ENTRY_BYTES - beside)
    with trio.fail_after(60):
        async with client(tmp_path) as c:
            error = await c.error("eventlog/append", appended(largest + "x"))
            assert error["code"] == -32602
            assert (await c.result("eventlog/append", appended(largest)))["seq"] == 1
            watch = await c.start("eventlog/watch", {"from_seq": 0})
            note = await c.notification()
            assert note["params"]["watch"] == watch
            assert note["params"]["entry"]["event"]["content"] == largest
            assert len(msgspec.json.encode(note)) < MAX_FRAME_BYTES
            request_id = await c.start("eventlog/since", {"from_seq": 0})
            while b"\n" not in c.buffer:
                c.buffer += await c.stream.receive_some(1 << 20)
            answer = c.buffer.split(b"\n", 1)[0]
            assert len(answer) <= MAX_FRAME_BYTES
            assert msgspec.json.decode(answer)["id"] == request_id


async def test_the_largest_event_reads_back_in_its_session_beside_three_full_states(
    tmp_path: Path,
) -> None:
    # A session read carries the session's state (and with scoped_state the
    # app's and the user's) beside at least one entry, however large: an
    # entry the limit let through, beside 100 kB of state, made every
    # sessions.get of its session -32603 (8,484,848 bytes), for good.
    full = "y" * (MAX_STATE_BYTES - len(b'{"k":""}'))
    beside = len(msgspec.json.encode(["a", "u", "s", "e", "x", "", "", None, "", None]))
    largest = "x" * (MAX_ENTRY_BYTES - beside)
    with trio.fail_after(60):
        async with client(tmp_path) as c:
            grow = {"app": {"k": full}, "user": {"k": full}, "session": {"k": full}}
            await c.result("eventlog/append", {**appended(None), "state_delta": grow})
            last = {**appended(largest), "event": {**appended(largest)["event"], "id": "f"}}
            assert (await c.result("eventlog/append", last))["seq"] == 2
            got = await c.response(await c.start(
                "eventlog/sessions.get", {**SESSION, "after_seq": 1, "scoped_state": True}
            ))
            assert "result" in got, got.get("error")
            assert got["result"]["events"][0]["event"]["content"] == largest
            assert got["result"]["state"] == {"k": full}
            assert len(msgspec.json.encode(got)) < MAX_FRAME_BYTES
