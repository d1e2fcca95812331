"""An answer longer than the frame limit is never written: a client drops such
a frame unread (it cannot tell whose it was), and the call it answered waited
for ever. The call is answered -32603 instead, naming the sizes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import trio
import trio.testing
from support.rpc_client import Client

from streamd.rpc import Method, Server
from streamd.rpc.protocol import result_frame

LIMIT = 4_096


class Params(msgspec.Struct):
    size: int


class Strict(msgspec.Struct, forbid_unknown_fields=True):
    size: int = 0


async def sized(params: Params | Strict, request: Any) -> str:
    return "x" * params.size


def test_an_answer_at_the_limit_is_written_and_one_byte_more_is_refused_by_its_id() -> None:
    # '{"jsonrpc":"2.0","id":7,"result":""}' is 36 bytes around the string.
    at_limit = result_frame(7, "x" * (LIMIT - 36), LIMIT)
    assert len(at_limit) == LIMIT + 1 and at_limit.endswith(b"\n")
    assert json.loads(at_limit)["result"] == "x" * (LIMIT - 36)
    over = json.loads(result_frame(7, "x" * (LIMIT - 35), LIMIT))
    assert over == {
        "jsonrpc": "2.0", "id": 7,
        "error": {
            "code": -32603,
            "message": f"the answer is {LIMIT + 1} bytes, over the {LIMIT} byte frame limit",
            "data": {"answer_bytes": LIMIT + 1, "max_frame": LIMIT},
        },
    }


async def test_a_served_answer_over_the_limit_is_an_error_and_the_connection_serves_on() -> None:
    server = Server(lambda conn: {"sized": Method("sized", Params, sized)}, max_frame=LIMIT)
    client_end, server_end = trio.testing.memory_stream_pair()
    client = Client(client_end)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            big = await client.start("sized", {"size": 2 * LIMIT})
            small = await client.start("sized", {"size": 10})
            assert (await client.response(big))["error"]["code"] == -32603
            assert (await client.response(small))["result"] == "x" * 10
            nursery.cancel_scope.cancel()


async def test_an_error_that_echoes_a_key_near_the_limit_is_cut_to_fit_by_its_id() -> None:
    # msgspec names an unknown params key whole in the -32602 message: a key
    # that filled the request frame made an error answer 50 bytes over the
    # limit, which a client drops unread, and its call waited for ever.
    server = Server(lambda conn: {"sized": Method("sized", Strict, sized)}, max_frame=LIMIT)
    client_end, server_end = trio.testing.memory_stream_pair()
    client = Client(client_end)
    head, tail = b'{"jsonrpc":"2.0","id":3,"method":"sized","params":{"', b'":1}}'
    frame = head + b"k" * (LIMIT - len(head) - len(tail)) + tail
    assert len(frame) == LIMIT
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            await client.stream.send_all(frame + b"\n")
            while b"\n" not in client.buffer:
                client.buffer += await client.stream.receive_some(1 << 16)
            answer, client.buffer = client.buffer.split(b"\n", 1)
            assert len(answer) <= LIMIT
            error = json.loads(answer)
            assert error["id"] == 3 and error["error"]["code"] == -32602
            assert "unknown field `kkk" in error["error"]["message"]
            assert f"over the {LIMIT} byte frame limit" in error["error"]["message"]
            assert (await client.result("sized", {"size": 10})) == "x" * 10
            nursery.cancel_scope.cancel()
