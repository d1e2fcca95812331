"""The protocol core without an event loop: bytes in, events out.

Every test here is a plain function: :class:`FrameReader` and :func:`bind`
never await, so what a frame means is decided before any Trio code runs.
"""

from __future__ import annotations

import msgspec
import pytest

from streamd.errors import RpcError
from streamd.rpc.methods import Method
from streamd.rpc.protocol import (
    Call,
    Cancel,
    Fault,
    FrameReader,
    Ignored,
    Shutdown,
    bind,
    encode_error,
    encode_notification,
    encode_result,
    error_frame,
)


def events(data: bytes, reader: FrameReader | None = None) -> list:
    reader = reader or FrameReader()
    return [reader.event(frame) for frame in [*reader.feed(data), *reader.close()]]


def test_a_request_is_a_call_carrying_its_raw_params_and_frame_size():
    frame = b'{"jsonrpc":"2.0","id":7,"method":"m","params":{"a":[1,2]}}'
    [call] = events(frame + b"\n")
    assert isinstance(call, Call)
    assert (call.id, call.method, bytes(call.params), call.size) == (
        7, "m", b'{"a":[1,2]}', len(frame),
    )


def test_a_frame_split_across_reads_is_one_event_and_a_last_line_needs_no_newline():
    reader = FrameReader()
    assert reader.feed(b'{"jsonrpc":"2.0","id":1,') == []
    [first] = reader.feed(b'"method":"a"}\n{"jsonrpc":"2.0","id":2,"method":"b"}')
    [second] = reader.close()
    assert [reader.event(first).method, reader.event(second).method] == ["a", "b"]


def test_a_null_id_is_a_call_answered_with_a_null_id_and_no_id_is_a_notification():
    [call, note] = events(
        b'{"jsonrpc":"2.0","id":null,"method":"m"}\n{"jsonrpc":"2.0","method":"m"}\n'
    )
    assert isinstance(call, Call) and call.id is None
    assert note == Ignored("notification m")


@pytest.mark.parametrize("method", ["recall/cancel", "$/cancelRequest"])
def test_both_cancel_notifications_name_the_request_and_a_malformed_one_is_ignored(method):
    good, bad = events(
        f'{{"jsonrpc":"2.0","method":"{method}","params":{{"id":"x"}}}}\n'
        f'{{"jsonrpc":"2.0","method":"{method}","params":{{"id":[1]}}}}\n'.encode()
    )
    assert good == Cancel("x")
    assert isinstance(bad, Ignored) and bad.why.startswith(f"malformed {method}")


def test_a_response_and_a_blank_line_are_ignored_not_answered():
    assert [type(e) for e in events(b'{"jsonrpc":"2.0","id":1,"result":{}}\n   \n')] == [
        Ignored, Ignored,
    ]


def test_shutdown_is_its_own_event_and_with_bad_params_a_fault_with_its_id():
    ok, bad = events(
        b'{"jsonrpc":"2.0","id":9,"method":"recall/shutdown","params":{}}\n'
        b'{"jsonrpc":"2.0","id":10,"method":"recall/shutdown","params":{"x":1}}\n'
    )
    assert ok == Shutdown(9)
    assert isinstance(bad, Fault) and (bad.id, bad.error.code) == (10, -32602)


@pytest.mark.parametrize(
    ("frame", "code", "words"),
    [
        (b"{not json", -32700, "parse error"),
        (b'{"jsonrpc":"2.0","id":1,"method":"\xff"}', -32700, "not valid UTF-8"),
        (b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}', -32700, "lone surrogate"),
        (b'[{"jsonrpc":"2.0","id":1,"method":"m"}]', -32600, "batch requests are not supported"),
        (b"[]", -32600, "an empty batch"),
        (b'{"jsonrpc":"2.0","id":9223372036854775808,"method":"m"}', -32600, "64 bits"),
        (b'{"jsonrpc":"1.0","id":1,"method":"m"}', -32600, 'jsonrpc must be "2.0"'),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","result":1}', -32600, "no result or error"),
        (b'{"jsonrpc":"2.0","id":1}', -32600, "neither a method nor an id"),
    ],
)
def test_a_frame_that_is_not_a_request_is_a_fault_naming_what_is_wrong(frame, code, words):
    [event] = events(frame + b"\n")
    assert isinstance(event, Fault)
    assert event.error.code == code and words in event.error.message


def test_a_fault_keeps_the_id_it_could_read():
    [event] = events(b'{"jsonrpc":"1.0","id":"abc","method":"m"}\n')
    assert isinstance(event, Fault) and event.id == "abc"


def test_nesting_past_the_limit_is_refused_before_decoding():
    reader = FrameReader(max_depth=4)
    ok, deep = events(
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":[[[1]]]}\n'
        b'{"jsonrpc":"2.0","id":1,"method":"m","params":[[[[1]]]]}\n',
        reader,
    )
    assert isinstance(ok, Call)
    assert isinstance(deep, Fault) and "more than 4 levels deep" in deep.error.message


def test_an_oversized_frame_is_a_fault_and_the_next_frame_is_read_whole():
    reader = FrameReader(max_frame=64)
    big, after = events(b"x" * 1000 + b'\n{"jsonrpc":"2.0","id":2,"method":"m"}\n', reader)
    assert isinstance(big, Fault) and big.error.message == (
        "frame of 1000 bytes exceeds the 64 byte limit"
    )
    assert isinstance(after, Call) and after.id == 2


class Params(msgspec.Struct, forbid_unknown_fields=True):
    limit: int


async def _never(params, request):  # pragma: no cover - bind never calls it
    raise AssertionError


TABLE = {"m": Method("m", Params, _never)}


def test_bind_decodes_params_into_the_methods_struct():
    [call] = events(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"limit":3}}\n')
    method, params = bind(call, TABLE)
    assert method is TABLE["m"] and params == Params(limit=3)


def test_bind_refuses_an_unknown_method_quoted_as_go_does_and_bad_params_with_a_path():
    [unknown, bad] = events(
        b'{"jsonrpc":"2.0","id":1,"method":"n\\t"}\n'
        b'{"jsonrpc":"2.0","id":2,"method":"m","params":{"limit":"x"}}\n'
    )
    with pytest.raises(RpcError) as missing:
        bind(unknown, TABLE)
    assert (missing.value.code, missing.value.message) == (-32601, 'unknown method "n\\t"')
    with pytest.raises(RpcError) as invalid:
        bind(bad, TABLE)
    assert invalid.value.code == -32602
    assert invalid.value.message == "m params: Expected `int`, got `str` - at `$.limit`"


def test_encoders_write_one_json_rpc_line_each():
    assert encode_result(1, {"a": 1}) == b'{"jsonrpc":"2.0","id":1,"result":{"a":1}}\n'
    assert encode_error(None, RpcError(-32600, "no")) == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no"}}\n'
    )
    assert encode_notification("n", [1]) == b'{"jsonrpc":"2.0","method":"n","params":[1]}\n'


def test_an_error_json_cannot_carry_still_becomes_an_answer():
    frame = error_frame(3, RpcError(-32000, "bad", data={"x": object()}))
    assert msgspec.json.decode(frame)["error"] == {
        "code": -32603, "message": "source_unavailable: the error could not be encoded",
    }
