"""Fuzzing the frame reader and the dispatcher.

The claims, for any sequence of lines a client may send:

* every request frame gets exactly one answer, with its id, or with id null
  when its id could not be read; a notification or a response gets none; a
  frame damaged at the byte level (invalid UTF-8, a lone surrogate escape, cut
  short, random bytes, an integer too big for any decoder) gets at most one,
  with its id or null;
* every answer is a well-formed JSON-RPC response;
* the connection survives: a ping sent after the frames is answered.

And for the depth scan: a frame it lets through never makes the decoder
recurse deeper than its limit.

The suite runs a few hundred examples. A longer run, for instance before a
release:

    STREAMD_FUZZ_EXAMPLES=100000 .venv/bin/pytest tests/rpc/test_fuzz.py -p no:cacheprovider

(about 1 ms per example per core).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamd.daemon import Daemon
from streamd.rpc import Connection, Server
from streamd.rpc.framing import nests_deeper_than
from streamd.rpc.protocol import SHUTDOWN_METHOD

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("STREAMD_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMIT = 128
PING_ID = "\x00ping"  # no generated id is this string (they are printable)


def _method_names() -> list[str]:
    """The real method table's names (shutdown would end the session early)."""

    async def names() -> list[str]:
        async with trio.open_nursery() as nursery:
            conn = Connection(nursery, trio.open_memory_channel[bytes](1)[0])
            # Listed while the connection lives: the Recall side of the table
            # is made when it is first looked at.
            table = Daemon().methods_for(conn)
            listed = sorted(name for name in table if name != SHUTDOWN_METHOD)
            nursery.cancel_scope.cancel()
        return listed

    return trio.run(names)


METHODS = _method_names()

printable = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=["Cs"]), max_size=12
)
scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | printable
    | st.sampled_from(['"', "\\", "[", "{", "]}", '\\"[', "\\\\", "\u2028", "\x00"])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(printable, inner, max_size=4),
    max_leaves=20,
)


@st.composite
def nested(draw: Any) -> Any:
    """A JSON value, now and then wrapped deep enough to straddle the limit."""
    value = draw(values)
    for _ in range(draw(st.sampled_from([0, 0, 0, 60, 125, 126, 127, 200]))):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


ids = (
    st.none() | st.integers(-(2**64), 2**64) | st.sampled_from([2**63 - 1, -(2**63), 2**63])
    | st.floats(allow_nan=False, allow_infinity=False) | printable | st.booleans()
    | st.lists(st.integers(), max_size=2)
)
MISSING = object()


@st.composite
def envelopes(draw: Any) -> dict[str, Any]:
    frame: dict[str, Any] = {}
    jsonrpc = draw(st.sampled_from(["2.0"] * 8 + [MISSING, "1.0", None, 2]))
    if jsonrpc is not MISSING:
        frame["jsonrpc"] = jsonrpc
    request_id = draw(st.just(MISSING) | ids)
    if request_id is not MISSING:
        frame["id"] = request_id
    method = draw(
        st.sampled_from(METHODS) | st.sampled_from(["recall/cancel", "$/cancelRequest"])
        | printable | st.just(MISSING) | st.integers()
    )
    if method is not MISSING:
        frame["method"] = method
    if draw(st.booleans()):
        frame["params"] = draw(nested())
    if draw(st.integers(0, 9)) == 0:
        frame[draw(st.sampled_from(["result", "error"]))] = draw(values)
    return frame


DAMAGE = ["none"] * 6 + ["utf8", "surrogate", "truncate", "bytes", "bignum"]


@st.composite
def lines(draw: Any) -> tuple[bytes, Any, bool]:
    """(frame, the envelope it encodes, whether its bytes were damaged)."""
    value = draw(envelopes() | nested())
    text = json.dumps(value, ensure_ascii=draw(st.booleans())).encode()
    damage = draw(st.sampled_from(DAMAGE))
    at = draw(st.integers(0, len(text)))
    if damage == "utf8":
        text = text[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + text[at:]
    elif damage == "surrogate":
        text = text.replace(b'"', b'"\\ud800', 1) if b'"' in text else b'"\\udbff"'
    elif damage == "truncate":
        text = text[:at]
    elif damage == "bytes":
        text = draw(st.binary(max_size=40)).replace(b"\n", b" ")
    elif damage == "bignum":
        text = text.replace(b"0", b"1" + b"0" * draw(st.sampled_from([19, 400, 5000])), 1)
    return text, value, damage != "none"


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


NULL = object()  # "answered with id null"


def expected(value: Any) -> Any:
    """What the server owes an undamaged frame: None (no answer), NULL, or an id."""
    if depth(value) > LIMIT or not isinstance(value, dict):
        return NULL
    request_id = value.get("id", MISSING)
    valid_types = (
        isinstance(value.get("jsonrpc"), str | None)
        and isinstance(value.get("method"), str | None)
        and (request_id is MISSING or request_id is None or isinstance(request_id, float | str)
             or (type(request_id) is int and -(2**63) <= request_id < 2**63))
    )
    if not valid_types:
        return NULL
    echo = None if request_id is MISSING else request_id
    answer = NULL if echo is None else echo
    if value.get("jsonrpc") != "2.0":
        return answer
    response = "result" in value or "error" in value
    if value.get("method") is None:
        return None if response else answer
    if response:
        return answer
    return None if request_id is MISSING else answer


def key(request_id: Any) -> Any:
    return NULL if request_id is None else json.dumps(request_id)


@FUZZ
@given(st.lists(lines(), min_size=1, max_size=4))
async def test_every_request_gets_one_answer_and_the_connection_survives(frames):
    client, server_end = trio.testing.memory_stream_pair()
    server = Server(Daemon().methods_for)
    answers: list[dict[str, Any]] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            ping = {"jsonrpc": "2.0", "id": PING_ID, "method": "recall/health",
                    "params": {"deadline": "2999-01-01T00:00:00Z"}}
            await client.send_all(
                b"".join(text + b"\n" for text, _, _ in frames) + json.dumps(ping).encode() + b"\n"
            )
            buf = b""
            pinged = False
            while True:
                chunk = await client.receive_some(1 << 16)
                if not chunk:
                    break
                buf += chunk
                *complete, buf = buf.split(b"\n")
                for line in complete:
                    frame = json.loads(line)
                    if frame.get("id") == PING_ID:
                        assert "result" in frame, frame
                        pinged = True
                        # Alive after everything: now end the session; whatever is
                        # still in flight is cancelled and still answered.
                        await client.send_stream.aclose()
                    else:
                        answers.append(frame)
            assert pinged and buf == b""

    for frame in answers:
        assert frame["jsonrpc"] == "2.0" and "id" in frame, frame
        assert ("result" in frame) != ("error" in frame), frame
    got: dict[Any, int] = {}
    for frame in answers:
        got[key(frame["id"])] = got.get(key(frame["id"]), 0) + 1
    owed: dict[Any, int] = {}
    slack: dict[Any, int] = {}
    for text, value, damaged in frames:
        if damaged:
            # A damaged frame may still parse, with the id the damage left it
            # (a "bignum" can turn id 0.0 into 1e19): it may be answered under
            # that id, its original one, or null.
            for k in {NULL, *_own_id(value), *_own_id(_parsed(text))}:
                slack[k] = slack.get(k, 0) + 1
            continue
        want = expected(value)
        if want is not None:
            k = NULL if want is NULL else key(want)
            owed[k] = owed.get(k, 0) + 1
    damaged_frames = sum(1 for _, _, damaged in frames if damaged)
    assert sum(got.values()) <= sum(owed.values()) + damaged_frames, (got, owed)
    for k in set(got) | set(owed):
        assert owed.get(k, 0) <= got.get(k, 0) <= owed.get(k, 0) + slack.get(k, 0), (k, got, owed)


def _parsed(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _own_id(value: Any) -> list[Any]:
    if isinstance(value, dict) and "id" in value and value["id"] is not None:
        return [key(value["id"])]
    return []


# --- the depth scan ----------------------------------------------------------------------------


@FUZZ
@given(nested(), st.integers(0, 140))
def test_the_depth_scan_agrees_with_the_value_on_well_formed_json(value, limit):
    text = json.dumps(value, ensure_ascii=False).encode()
    assert nests_deeper_than(text, limit) == (depth(value) > limit)


TOKENS = [b"[", b"]", b"{", b"}", b'"', b"\\", b"\\\\", b'\\"', b"a", b":", b",", b"1", b"\xff",
          b'"k":', b"[[[[", b"{{{{"]
SCAN_LIMIT = 12


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=80))
def test_a_frame_the_scan_lets_through_never_recurses_past_the_limit(tokens):
    frame = b"".join(tokens)
    if nests_deeper_than(frame, SCAN_LIMIT):
        return
    # Leave the decoder room for exactly SCAN_LIMIT levels (measured here,
    # since what counts against Python's recursion limit is not only Python
    # frames): if the scan under-counted, this decode raises RecursionError.
    old = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(_limit_with_room_for(SCAN_LIMIT))
        msgspec.json.decode(frame)
    except (msgspec.DecodeError, UnicodeDecodeError):
        pass
    finally:
        sys.setrecursionlimit(old)


def _limit_with_room_for(levels: int) -> int:
    """The lowest recursion limit at which, from the caller's depth, msgspec
    decodes ``levels`` nested arrays."""
    probe = b"[" * levels + b"]" * levels
    for limit in range(levels, 10_000):
        try:
            # Raises while the limit is below the current depth.
            sys.setrecursionlimit(limit)
            msgspec.json.decode(probe)
        except RecursionError:
            continue
        return limit
    raise AssertionError("msgspec never decoded the probe")
