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


async def sized(params: Params, request: Any) -> str:
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
