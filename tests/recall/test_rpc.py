"""The JSON-RPC layer with the real method table, over in-memory streams.

Each test runs ``streamd.rpc.Server(Daemon().methods_for)`` on one end of
``trio.testing.memory_stream_pair`` and plays the Recall core on the other.
Waiting is on frames and Trio's clock, never on sleeps: cancellation tests
stall the search for far longer than the test may run, deadline and shutdown
tests run on the autojump clock with wall time injected to follow it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from support.recall import (
    FAR,
    WALL0,
    error,
    health,
    init,
    initialized,
    inline,
    req,
    search,
    session,
)

from streamd.golang import gotime

PAST = "2000-01-01T00:00:00Z"










def note(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}














# --- malformed frames --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [b"{not json", b'{"jsonrpc":"2.0","id":1,', b"\xff\xfe", b"nul"])
async def test_malformed_json_is_a_parse_error_with_a_null_id_and_the_session_goes_on(world, bad):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.raw(bad + b"\n")
            await peer.send(health(2))
            first = await peer.recv()
            assert first["jsonrpc"] == "2.0"
            assert first["id"] is None
            assert first["error"]["code"] == -32700
            second = await peer.recv()
            assert second["id"] == 2
            assert second["result"]["status"] == "unavailable"  # no handshake yet


@pytest.mark.parametrize(
    ("frame", "id"),
    [
        (b"[1,2]", None),
        (b"[]", None),
        (b'"recall/health"', None),
        (b"42", None),
        (b"null", None),
        (b'{"jsonrpc":"2.0","id":7}', 7),  # neither a method nor a response
        (b'{"jsonrpc":"1.0","id":8,"method":"recall/health"}', 8),
        (b'{"id":9,"method":"recall/health","params":{}}', 9),  # no jsonrpc member
        (b'{"jsonrpc":"2.0","id":10,"method":7}', None),
    ],
)
async def test_a_frame_that_is_not_a_request_object_is_an_invalid_request(world, frame, id):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.raw(frame + b"\n")
            await peer.send(health(99))
            got_id, code, _ = error(await peer.recv())
            assert (got_id, code) == (id, -32600)
            assert (await peer.recv())["id"] == 99


@pytest.mark.parametrize(
    ("method", "message"),
    [("x", 'unknown method "x"'), ("recall/searchh", 'unknown method "recall/searchh"'),
     ('a"b\n', 'unknown method "a\\"b\\n"')],
)
async def test_an_unknown_method_is_method_not_found_naming_it(world, method, message):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(req(3, method))
            assert error(await peer.recv()) == (3, -32601, message)


@pytest.mark.parametrize("id", ["x", "", 7, 0, -3, 1.5, 2**53])
async def test_a_request_id_of_any_json_type_is_echoed(world, id):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(req(id, "no/such"), health(id))
            assert error(await peer.recv())[:2] == (id, -32601)
            frame = await peer.recv()
            assert frame["id"] == id and type(frame["id"]) is type(id)


# --- params ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "mentions"),
    [
        ({"query": "", "filters": {}, "limit": 1, "deadline": FAR, "bogus": 1}, "bogus"),
        ({"query": "", "filters": {}, "limit": 1}, "deadline"),
        ({"query": "", "filters": {}, "limit": -1, "deadline": FAR}, "limit"),
        ({"query": "", "filters": {}, "limit": "10", "deadline": FAR}, "limit"),
        ({"query": 5, "filters": {}, "limit": 1, "deadline": FAR}, "query"),
        ({"query": "", "limit": 1, "deadline": FAR}, "filters"),
        ({"query": "", "filters": {"bogus": 1}, "limit": 1, "deadline": FAR}, "bogus"),
        ({"query": "", "filters": {}, "limit": 1, "deadline": "tomorrow"}, "deadline"),
        # The schema's date-time wants two hour digits, Go's parser an upper-case T.
        ({"query": "", "filters": {}, "limit": 1, "deadline": "2999-01-01T0:00:00Z"}, "deadline"),
        ({"query": "", "filters": {}, "limit": 1, "deadline": "2999-01-01t00:00:00Z"}, "deadline"),
        ({"query": "", "filters": {"since": "2026-05-02 10:00:00Z"}, "limit": 1,
          "deadline": FAR}, "since"),
        ({"query": "", "filters": {}, "limit": 1, "deadline": FAR, "as_of": "now"}, "as_of"),
    ],
)
async def test_search_params_the_schema_rejects_are_invalid_params(world, params, mentions):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send({"jsonrpc": "2.0", "id": 2, "method": "recall/search",
                             "params": params})
            got_id, code, message = error(await peer.recv())
            assert (got_id, code) == (2, -32602)
            assert mentions in message


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("recall/expand", {"locator": "signals:v2/sig-1", "detail": "everything",
                           "budget_bytes": 0, "deadline": FAR}),
        ("recall/expand", {"locator": "v2/sig-1", "detail": "full", "budget_bytes": 0,
                           "deadline": FAR}),
        ("recall/expand", {"locator": "signals:v2/sig-1", "detail": "full",
                           "budget_bytes": -1, "deadline": FAR}),
        ("recall/expand", {"locator": "signals:v2/sig-1", "detail": "full", "budget_bytes": 0}),
        ("recall/health", {}),
        ("recall/refresh", {"full": True}),
        ("recall/refresh", {"deadline": FAR, "full": "yes"}),
        ("recall/cancel", {"id": 1}),
    ],
)
async def test_other_methods_reject_params_their_schemas_reject(world, method, params):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send({"jsonrpc": "2.0", "id": 2, "method": method, "params": params})
            frame = await peer.recv()
            if method == "recall/cancel":
                # recall/cancel is a notification; as a request it is no method we serve.
                assert error(frame)[:2] == (2, -32601)
            else:
                assert error(frame)[:2] == (2, -32602)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"settings": {"bogus": 1}}, 'stream settings: json: unknown field "bogus"'),
        ({"settings": {"upstream": {"tasks": "a:b"}}},
         'stream settings: upstream "tasks" maps to an unusable source_id'),
        ({"settings": {"upstream": {"tasks": ""}}},
         'stream settings: upstream "tasks" maps to an unusable source_id'),
        ({"settings": {"max_candidates": -1}},
         "stream settings: max_candidates and debug_stall_ms cannot be negative"),
        ({"protocol_version_min": 2, "protocol_version_max": 3},
         "protocol version 1 is outside the requested range 2..3"),
        ({"settings": {"files": ["../escape.jsonl"]}},
         'stream settings: file "../escape.jsonl" resolves outside the configured location'),
    ],
)
async def test_initialize_refuses_bad_settings_with_a_readable_message(world, overrides, message):
    frame = init(world)
    for key, value in overrides.items():
        frame["params"][key] = value
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            assert error(await peer.recv()) == (1, -32602, message)
            # A refused handshake leaves the adapter unusable.
            await peer.send(search(2))
            assert error(await peer.recv())[:2] == (2, -32000)


@pytest.mark.parametrize(
    "settings",
    [{"max_candidates": 2.0}, {"Max_Candidates": 2}, {"FILES": ["a.jsonl"], "upstream": None}],
)
async def test_initialize_accepts_what_go_decoding_accepts(world, settings):
    frame = init(world)
    frame["params"]["settings"] = {"files": ["a.jsonl"], **settings}
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            assert "result" in await peer.recv()
            await peer.send(search(2))
            result = (await peer.recv())["result"]
            assert len(result["candidates"]) <= 2
            assert result["diagnostics"]["matched"] == 2


# Each message recorded from the reference (recall-stream built from marcus/recall
# d3a53f1) by sending it the same handshake: it decodes the block as generic JSON
# (every number a float64), encodes it again (keys sorted) and decodes that into
# its settings struct, so these are the words, digits and order of that round trip.
_U = "stream settings: json: cannot unmarshal "
REFERENCE_SETTINGS_ERRORS = [
    ({"max_candidates": 2**63 - 1},
     _U + "number 9223372036854776000 into Go struct field Settings.max_candidates of type int"),
    ({"max_candidates": 2**63 - 512},
     _U + "number 9223372036854776000 into Go struct field Settings.max_candidates of type int"),
    ({"debug_stall_ms": 2**63 - 1},
     _U + "number 9223372036854776000 into Go struct field Settings.debug_stall_ms of type int"),
    ({"max_candidates": 2**64},
     _U + "number 18446744073709552000 into Go struct field Settings.max_candidates of type int"),
    ({"max_candidates": -(2**63) - 1},
     _U + "number -9223372036854776000 into Go struct field Settings.max_candidates of type int"),
    ({"max_candidates": -(2**63)},  # its float64 is printed with digits past Go's int
     _U + "number -9223372036854776000 into Go struct field Settings.max_candidates of type int"),
    ({"max_candidates": 1e20},
     _U + "number 100000000000000000000 into Go struct field Settings.max_candidates of type int"),
    ({"max_candidates": 1e-7},
     _U + "number 1e-7 into Go struct field Settings.max_candidates of type int"),
    ({"max_candidates": 10**30},
     _U + "number 1e+30 into Go struct field Settings.max_candidates of type int"),
    ({"files": 1e20}, _U + "number into Go struct field Settings.files of type []string"),
    ({"files": ["a", True]}, _U + "bool into Settings.files.1 of type string"),
    ({"files": [None, 1.5]}, _U + "number into Settings.files.1 of type string"),
    ({"upstream": {"x": 5}}, _U + "number into Go struct field Settings.upstream.x of type string"),
    ({"upstream": {"b": 1, "a": True}},
     _U + "bool into Go struct field Settings.upstream.a of type string"),
    ({"upstream": 1e-7},
     _U + "number into Go struct field Settings.upstream of type map[string]string"),
    ({"zzz": 1, "files": 5}, _U + "number into Go struct field Settings.files of type []string"),
    ({"files": 5, "debug_stall_ms": "x"},
     _U + "string into Go struct field Settings.debug_stall_ms of type int"),
    ({"MAX_CANDIDATES": "x", "max_candidates": 5},
     _U + "string into Go struct field Settings.MAX_CANDIDATES of type int"),
    ({"files": ["a", 1], "FILES": [True]}, _U + "bool into Settings.FILES.0 of type string"),
    ({"Zeta": 1, "Alpha": 2}, 'stream settings: json: unknown field "Alpha"'),
]


@pytest.mark.parametrize(("settings", "message"), REFERENCE_SETTINGS_ERRORS)
async def test_initialize_refuses_settings_in_the_references_words(world, settings, message):
    frame = init(world)
    frame["params"]["settings"] = settings
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            assert error(await peer.recv()) == (1, -32602, message)


@pytest.mark.parametrize("value", [2**63 - 513, -0.0, 3.0])
async def test_initialize_accepts_the_numbers_the_reference_reads_back_as_ints(world, value):
    # 2**63 - 513 is the float64 9223372036854774784, an int; -0.0 is written "-0".
    frame = init(world)
    frame["params"]["settings"]["max_candidates"] = value
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            frame = await peer.recv()
            assert "result" in frame, frame


async def test_a_fractional_max_candidates_is_invalid_params(world):
    frame = init(world)
    frame["params"]["settings"]["max_candidates"] = 2.5
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            assert error(await peer.recv())[:2] == (1, -32602)


# --- frame size ------------------------------------------------------------------------------


async def test_an_oversized_frame_is_refused_and_the_next_frame_answered(world):
    with trio.fail_after(10):
        async with session(max_frame=256) as (peer, _):
            # Arrives in pieces, none of which holds a newline until the end.
            await peer.raw(b'{"jsonrpc":"2.0","id":1,"method":"recall/health","params":{')
            for _ in range(10):
                await peer.raw(b" " * 100)
            await peer.raw(b"}}\n")
            await peer.send(health(2))
            got_id, code, _ = error(await peer.recv())
            assert (got_id, code) == (None, -32600)
            assert (await peer.recv())["id"] == 2


async def test_a_frame_of_exactly_the_limit_is_accepted(world):
    body = json.dumps(health(5)).encode()
    padded = body[:-1] + b" " * (256 - len(body)) + b"}"
    assert len(padded) == 256
    with trio.fail_after(10):
        async with session(max_frame=256) as (peer, _):
            await peer.raw(padded + b"\n" + padded[:-1] + b" }\n")
            frames = await peer.recv_by_id(2)
            assert "result" in frames[5]
            assert error(frames[None])[:2] == (None, -32600)


# --- notifications ------------------------------------------------------------------------------


async def test_notifications_are_never_answered(world):
    with trio.fail_after(10):
        async with session() as (peer, ended):
            await initialized(peer, world)
            await peer.send(
                note("recall/health", deadline=FAR),
                note("no/such/method"),
                note("recall/cancel", id=12345),
                note("recall/cancel", bogus=True),
                note("$/cancelRequest"),
                # A response arriving at the server answers nothing it asked.
                {"jsonrpc": "2.0", "id": 77, "result": {}},
                {"jsonrpc": "2.0", "id": 78, "error": {"code": 1, "message": "x"}},
                req(5, "recall/health", deadline=FAR),
            )
            assert (await peer.recv())["id"] == 5
            await peer.close_input()
            assert await peer.drain() == []
            await ended.wait()


# --- cancellation and deadlines ------------------------------------------------------------------


@pytest.mark.parametrize("cancel", ["recall/cancel", "$/cancelRequest"])
@pytest.mark.parametrize("method", ["search", "refresh"])
async def test_cancel_answers_an_in_flight_request_context_canceled(world, cancel, method):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world, debug_stall_ms=600_000)
            if method == "search":
                await peer.send(search(2, "td-1"))
            else:
                await peer.send(req(2, "recall/refresh", deadline=FAR, full=True))
            await peer.send(note(cancel, id=2))
            assert error(await peer.recv()) == (2, -32007, "context canceled")


async def test_a_cancel_names_its_request_by_id_and_type(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world, debug_stall_ms=600_000)
            await peer.send(search("2"), search(2))
            # The string "2" and the number 2 are different requests.
            await peer.send(note("recall/cancel", id=2), health(3))
            frames = await peer.recv_by_id(2)
            assert error(frames[2]) == (2, -32007, "context canceled")
            assert "result" in frames[3]
            await peer.send(note("recall/cancel", id="2"))
            assert error(await peer.recv()) == ("2", -32007, "context canceled")


async def test_a_passing_deadline_answers_context_deadline_exceeded(world, autojump_clock):
    def wall_ns() -> int:
        return WALL0 + round(trio.current_time() * 1e9)

    deadline = gotime.format_nano(WALL0 + 5 * gotime.NS)
    with trio.fail_after(120):
        async with session(offload=inline, wall_ns=wall_ns) as (peer, _):
            await initialized(peer, world, debug_stall_ms=60_000)
            started = trio.current_time()
            await peer.send(search(2, "td-1", deadline=deadline))
            assert error(await peer.recv()) == (2, -32007, "context deadline exceeded")
            # Answered when the deadline passed, not when the 60 s stall ended.
            assert 5 <= trio.current_time() - started < 6


async def test_a_deadline_after_the_work_lets_it_finish(world, autojump_clock):
    def wall_ns() -> int:
        return WALL0 + round(trio.current_time() * 1e9)

    deadline = gotime.format_nano(WALL0 + 5 * gotime.NS)
    with trio.fail_after(120):
        async with session(offload=inline, wall_ns=wall_ns) as (peer, _):
            await initialized(peer, world, debug_stall_ms=2_000)
            await peer.send(search(2, "td-1", deadline=deadline))
            frame = await peer.recv()
            assert frame["id"] == 2
            assert [c["source_record_id"] for c in frame["result"]["candidates"]] == ["sig-1"]


@pytest.mark.parametrize(
    "frame",
    [
        search(2, deadline=PAST),
        req(2, "recall/expand", locator="signals:v2/sig-1", detail="full", budget_bytes=0,
            deadline=PAST),
        health(2, deadline=PAST),
        req(2, "recall/refresh", deadline=PAST),
    ],
)
async def test_a_deadline_already_past_is_answered_deadline_exceeded(world, frame):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(frame)
            assert error(await peer.recv()) == (2, -32007, "context deadline exceeded")


async def test_unsupported_filters_are_reported_before_the_deadline_is_checked(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(search(2, "td-1", deadline=PAST,
                                   filters={"entities": ["marcus"], "project": "recall"}))
            assert (await peer.recv())["result"] == {
                "candidates": [],
                "diagnostics": {"unsupported_filters": ["entities", "project"]},
                "outcome": "skipped",
                "reason": "filter_unsupported",
            }


@pytest.mark.parametrize(
    ("filters", "named"),
    [({"entities": ["x"]}, ["entities"]), ({"project": "p"}, ["project"]),
     ({"entities": [], "project": ""}, None)],
)
async def test_an_entities_or_project_filter_skips_the_search(world, filters, named):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(search(2, "td-1", filters=filters))
            result = (await peer.recv())["result"]
            if named is None:  # empty filters are no filters
                assert result["outcome"] == "success"
            else:
                assert result["outcome"] == "skipped"
                assert result["diagnostics"] == {"unsupported_filters": named}
                assert result["candidates"] == []


# --- concurrency -----------------------------------------------------------------------------


async def test_concurrent_requests_are_answered_independently(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world, debug_stall_ms=600_000)
            await peer.send(
                search(2, "td-1"),
                health(3),
                req(4, "recall/expand", locator="signals:v2/sig-2", detail="summary",
                    budget_bytes=0, deadline=FAR),
                req(5, "nope"),
                search(2, "again"),  # the same id while 2 is in flight
            )
            answers = await peer.recv_by_id(4)
            assert answers[3]["result"]["status"] == "healthy"
            assert answers[4]["result"]["content"] == "Review\nevent at 2026-05-02T10:05:00Z"
            assert error(answers[5])[1] == -32601
            assert error(answers[2])[1:] == (-32600, "request id 2 is already in flight")
            # The stalled search is still in flight until it is cancelled.
            await peer.send(note("recall/cancel", id=2))
            assert error(await peer.recv()) == (2, -32007, "context canceled")


async def test_searches_in_flight_together_share_one_generation(world, autojump_clock):
    with trio.fail_after(60):
        async with session(offload=inline) as (peer, _):
            await initialized(peer, world, debug_stall_ms=1_000)
            await peer.send(search(2, "td-1"), search(3, "review"), search(4, ""))
            frames = await peer.recv_by_id(3)
            assert sorted(frames) == [2, 3, 4]
            assert {f["result"]["diagnostics"]["generation"] for f in frames.values()} == {"gen-1"}


# --- shutdown and end of input --------------------------------------------------------------------


async def test_shutdown_waits_for_in_flight_work_and_its_ack_is_the_last_frame(
    world, autojump_clock
):
    with trio.fail_after(60):
        async with session(offload=inline) as (peer, ended):
            await initialized(peer, world, debug_stall_ms=2_000)
            started = trio.current_time()
            await peer.send(search(2, "td-1"), req(9, "recall/shutdown"), health(10))
            frames = await peer.drain()
            await ended.wait()
    assert [f["id"] for f in frames] == [2, 9]
    assert "result" in frames[0]
    assert frames[1] == {"jsonrpc": "2.0", "id": 9, "result": {}}
    assert trio.current_time() - started >= 2


async def test_shutdown_with_bad_params_is_refused_and_the_session_goes_on(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(req(9, "recall/shutdown", bogus=1), health(10))
            assert error(await peer.recv())[:2] == (9, -32602)
            assert (await peer.recv())["id"] == 10


async def test_end_of_input_cancels_in_flight_requests_and_ends_the_session(world):
    with trio.fail_after(10):
        async with session() as (peer, ended):
            await initialized(peer, world, debug_stall_ms=600_000)
            await peer.send(search(2, "td-1"), req(3, "recall/refresh", deadline=FAR))
            await peer.close_input()
            frames = await peer.drain()
            await ended.wait()
    assert sorted(error(f) for f in frames) == [
        (2, -32007, "context canceled"), (3, -32007, "context canceled"),
    ]


async def test_a_last_request_without_a_newline_before_eof_is_still_answered(world):
    with trio.fail_after(10):
        async with session() as (peer, ended):
            await peer.raw(json.dumps(health(4)).encode())
            await peer.close_input()
            frames = await peer.drain()
            await ended.wait()
    assert [f["id"] for f in frames] == [4]
