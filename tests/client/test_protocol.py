"""The clients' protocol core, without an event loop: bytes in, events out.

Frames the core writes are read back with the daemon's own
:class:`~streamd.rpc.protocol.FrameReader`, so "it is a request the daemon
understands" is checked by the daemon's code, not restated here.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from streamd.client import calls
from streamd.client.protocol import (
    Call,
    ClientProtocol,
    Garbled,
    LockLost,
    Reply,
    WatchUpdated,
    decode_result,
)
from streamd.errors import BUDGET_EXCEEDED, CLOSED, INTERNAL_ERROR, RpcError
from streamd.eventlog.model import (
    AppendResult,
    Entry,
    Event,
    Filter,
    StateDelta,
    WatchParams,
    WatchResult,
)
from streamd.rpc.protocol import Call as DaemonCall
from streamd.rpc.protocol import Cancel, FrameReader, encode_notification, encode_result


def answer(request_id: int, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode() + b"\n"


def failure(request_id: int, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode() + b"\n"


def note(method: str, params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode() + b"\n"


def entry(seq: int, content: Any = None) -> dict[str, Any]:
    return {
        "seq": seq,
        "app": "app",
        "user": "u",
        "session": "s",
        "event": {
            "id": f"e{seq}",
            "author": "agent",
            "content": content,
            "branch": "",
            "invocation_id": "",
            "timestamp": "2025-01-01T00:00:00Z",
        },
        "metadata": None,
    }


def daemon_reads(frame: bytes) -> Any:
    reader = FrameReader()
    (line,) = reader.feed(frame)
    return reader.event(line)


def test_a_request_frame_is_one_the_daemon_reads_as_that_call() -> None:
    core = ClientProtocol()
    call = calls.append(
        "app", "u", "s", Event(id="e1", author="me", content={"k": [1]}),
        state_delta=StateDelta(user={"x": 1}), expected_seq=3,
    )
    request_id, frame = core.start(call)
    got = daemon_reads(frame)
    assert isinstance(got, DaemonCall) and got.id == request_id and got.method == "eventlog/append"
    params = msgspec.json.decode(got.params)
    assert params["state_delta"] == {"user": {"x": 1}} and params["expected_seq"] == 3
    assert core.in_flight == 1


def test_an_answer_is_decoded_to_the_calls_result_type() -> None:
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/append", {}, AppendResult))
    events, out = core.receive(answer(request_id, {"seq": 7, "duplicate": False}))
    assert events == [Reply(request_id, value=AppendResult(seq=7, duplicate=False))]
    assert out == [] and core.in_flight == 0


def test_an_answer_asked_for_raw_is_its_result_as_sent() -> None:
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/sessions.get", {}, msgspec.Raw))
    frame = b'{"jsonrpc":"2.0","id":%d,"result":{"b": [1, 2],"a":"x"}}\n' % request_id
    (event,), _ = core.receive(frame)
    assert isinstance(event, Reply) and isinstance(event.value, msgspec.Raw)
    assert bytes(event.value) == b'{"b": [1, 2],"a":"x"}'


def test_a_result_asked_for_raw_is_not_read_again() -> None:
    """It was read as JSON already (the envelope's decode): handed over as
    the same object, not decoded into a new one (which reads all of it)."""
    read = msgspec.Raw(b'{"events": [1, 2, 3]}')
    assert decode_result(read, msgspec.Raw) is read
    made = decode_result(b'{"a": 1}', msgspec.Raw)
    assert isinstance(made, msgspec.Raw) and bytes(made) == b'{"a": 1}'


def test_a_large_answer_is_decoded_with_the_collector_paused_and_resumed() -> None:
    """A session's events are thousands of objects: no collection walks them
    while they are decoded (each one would walk the heap), and the collector
    runs again afterwards."""
    import gc

    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    data = json.dumps([{"n": i, "list": [i]} for i in range(20_000)]).encode()
    kind = list[dict[str, Any]]
    decode_result(b"[]", kind)  # its decoder made and kept, before counting
    assert len(data) > 64 << 10 and gc.isenabled()
    gc.collect()  # from an empty young generation: a collection seen is the decode's
    gc.callbacks.append(count)
    try:
        decoded = decode_result(data, kind)
        during = len(collections)
    finally:
        gc.callbacks.remove(count)
    assert len(decoded) == 20_000
    # 40,000 containers made: dozens of collections without the pause; with
    # it, at most the one its end sets off.
    assert during <= 1
    assert gc.isenabled()


def test_an_error_answer_is_the_daemons_code_message_and_data() -> None:
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/append", {}, AppendResult))
    (reply,), _ = core.receive(
        failure(request_id, -32014, "moved on", {"expected_seq": 1, "last_seq": 2})
    )
    assert isinstance(reply, Reply) and reply.error is not None
    assert (reply.error.code, reply.error.message, reply.error.data) == (
        -32014, "moved on", {"expected_seq": 1, "last_seq": 2},
    )


def test_a_result_that_does_not_fit_fails_that_call_and_not_the_connection() -> None:
    core = ClientProtocol()
    bad, _ = core.start(Call("eventlog/append", {}, AppendResult))
    good, _ = core.start(Call("eventlog/append", {}, AppendResult))
    events, _ = core.receive(answer(bad, {"seq": "seven"}) + answer(good, {"seq": 1,
                                                                           "duplicate": True}))
    assert events[0].error is not None and events[0].error.code == INTERNAL_ERROR
    assert events[1] == Reply(good, value=AppendResult(seq=1, duplicate=True))
    assert not core.closed


def test_frames_split_at_any_byte_are_put_back_together() -> None:
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/append", {}, AppendResult))
    data = answer(request_id, {"seq": 1, "duplicate": False})
    events: list[Any] = []
    for i in range(len(data)):
        got, _ = core.receive(data[i : i + 1])
        events += got
    assert events == [Reply(request_id, value=AppendResult(seq=1, duplicate=False))]


def test_cancelling_tells_the_daemon_and_drops_the_late_answer() -> None:
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/since", {}, AppendResult))
    frame = core.cancel(request_id)
    assert frame is not None
    assert daemon_reads(frame) == Cancel(request_id)
    assert core.cancel(request_id) is None  # once is enough
    assert core.in_flight == 1  # until the daemon lets go
    events, _ = core.receive(failure(request_id, -32007, "context canceled"))
    assert events == [] and core.in_flight == 0
    assert core.cancel(request_id) is None  # answered: nothing to cancel


def test_watch_entries_come_in_order_and_its_end_after_them() -> None:
    core = ClientProtocol()
    watch_id, frame = core.start_watch(WatchParams(from_seq=4, filter=Filter(app="app")))
    sent = msgspec.json.decode(daemon_reads(frame).params, type=WatchParams)
    assert sent == WatchParams(from_seq=4, filter=Filter(app="app"))
    assert core.take(watch_id) is None
    events, _ = core.receive(
        note("eventlog/entry", {"watch": watch_id, "entry": entry(5)})
        + note("eventlog/entry", {"watch": watch_id, "entry": entry(6)})
        + answer(watch_id, {"last_seq": 6})
    )
    assert events == [WatchUpdated(watch_id)] * 3
    first = core.take(watch_id)
    assert isinstance(first, Entry) and first.seq == 5 and core.last_seq(watch_id) == 5
    assert core.take(watch_id).seq == 6
    assert core.take(watch_id) == WatchResult(last_seq=6)
    assert core.take(watch_id) == WatchResult(last_seq=6)  # the end stays the end


def test_a_watch_past_its_byte_budget_ends_after_what_it_holds_and_is_cancelled() -> None:
    core = ClientProtocol()
    watch_id, _ = core.start_watch(WatchParams(), budget=1500)
    big = "x" * 400  # 682 bytes a notification
    _, out = core.receive(
        b"".join(
            note("eventlog/entry", {"watch": watch_id, "entry": entry(i, big)})
            for i in range(1, 5)
        )
    )
    # The third entry would pass 1500 bytes: the watch ends there and the
    # daemon is told to stop.
    assert len(out) == 1 and daemon_reads(out[0]) == Cancel(watch_id)
    assert [core.take(watch_id).seq for _ in range(2)] == [1, 2]
    err = core.take(watch_id)
    assert isinstance(err, RpcError) and err.code == BUDGET_EXCEEDED
    assert err.data["last_seq"] == 2 and "from_seq=2" in err.message
    # Nothing after the error: later entries, and the cancel's answer, are dropped.
    core.receive(note("eventlog/entry", {"watch": watch_id, "entry": entry(9)}))
    core.receive(failure(watch_id, -32007, "context canceled"))
    assert core.take(watch_id) is err and core.in_flight == 0


def test_a_consumer_that_takes_its_entries_never_meets_the_budget() -> None:
    core = ClientProtocol()
    watch_id, _ = core.start_watch(WatchParams(), budget=1000)
    for i in range(1, 50):
        _, out = core.receive(note("eventlog/entry", {"watch": watch_id, "entry": entry(i, "x" *
                                                                                     400)}))
        assert out == []
        assert core.take(watch_id).seq == i


def test_the_entries_of_a_watch_let_go_of_are_dropped() -> None:
    core = ClientProtocol()
    watch_id, _ = core.start_watch(WatchParams())
    core.receive(note("eventlog/entry", {"watch": watch_id, "entry": entry(1)}))
    assert core.cancel(watch_id) is not None
    events, _ = core.receive(note("eventlog/entry", {"watch": watch_id, "entry": entry(2)}))
    assert events == [] and core.take(watch_id) is None
    core.forget_watch(watch_id)
    with pytest.raises(KeyError):
        core.take(watch_id)


def test_lock_lost_names_the_lease_and_the_end_of_input_loses_the_rest() -> None:
    core = ClientProtocol()
    core.lease_acquired("L1")
    core.lease_acquired("L2")
    core.lease_acquired("L3")
    core.lease_released("L3")
    events, _ = core.receive(note("eventlog/lock_lost", {"lock": "L1", "holder": "h/1/ab"}))
    assert events == [LockLost("L1", "h/1/ab")]
    assert core.receive(b"")[0] == [LockLost("L2", "")]


def test_the_end_of_input_fails_every_call_and_watch_with_closed() -> None:
    core = ClientProtocol()
    call_id, _ = core.start(Call("eventlog/ping", {}, AppendResult))
    watch_id, _ = core.start_watch(WatchParams())
    abandoned, _ = core.start(Call("eventlog/ping", {}, AppendResult))
    core.cancel(abandoned)
    # A last answer without its newline still counts.
    events, _ = core.receive(answer(call_id, {"seq": 1, "duplicate": False})[:-1])
    assert events == []
    events, _ = core.receive(b"")
    assert events[0] == Reply(call_id, value=AppendResult(seq=1, duplicate=False))
    assert events[1] == WatchUpdated(watch_id)
    err = core.take(watch_id)
    assert isinstance(err, RpcError) and err.code == CLOSED
    assert len(events) == 2 and core.in_flight == 0
    with pytest.raises(RpcError) as info:
        core.start(Call("eventlog/ping", {}, AppendResult))
    assert info.value.code == CLOSED
    assert core.cancel(watch_id) is None


@pytest.mark.parametrize(
    "frame",
    [
        b"not json\n",
        b'{"jsonrpc":"2.0","id":99,"result":{}}\n',
        b'{"jsonrpc":"2.0","id":"x","result":{}}\n',
        b'{"jsonrpc":"2.0","method":"eventlog/entry","params":{"watch":1}}\n',
        b'{"jsonrpc":"2.0","method":"eventlog/lock_lost","params":[]}\n',
    ],
)
def test_a_frame_that_makes_no_sense_is_reported_and_skipped(frame: bytes) -> None:
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/append", {}, AppendResult))
    events, _ = core.receive(frame + answer(request_id, {"seq": 1, "duplicate": False}))
    assert isinstance(events[0], Garbled)
    assert events[-1] == Reply(request_id, value=AppendResult(seq=1, duplicate=False))


def test_an_oversized_frame_is_skipped_without_being_held() -> None:
    core = ClientProtocol(max_frame=100)
    request_id, _ = core.start(Call("eventlog/append", {}, AppendResult))
    events, _ = core.receive(b"[" + b"1," * 1000 + b"1]\n")
    assert isinstance(events[0], Garbled) and "over the limit" in events[0].why
    events, _ = core.receive(answer(request_id, {"seq": 1, "duplicate": False}))
    assert events == [Reply(request_id, value=AppendResult(seq=1, duplicate=False))]


def test_unknown_notifications_are_ignored() -> None:
    core = ClientProtocol()
    assert core.receive(note("recall/progress", {"x": 1})) == ([], [])


def test_an_error_with_no_id_is_why_the_end_of_input_came() -> None:
    # A daemon serving as many connections as it takes answers a new one
    # with one error and closes it: the calls in flight fail with its words.
    core = ClientProtocol()
    request_id, _ = core.start(Call("eventlog/latest_seq", {}, int))
    refusal = {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32000, "message": "streamd serves at most 512 connections at once",
        "data": {"reason": "too_many_connections", "limit": 512}}}
    events, _ = core.receive(json.dumps(refusal).encode() + b"\n")
    assert [e for e in events if not isinstance(e, Garbled)] == []
    events, _ = core.receive(b"")
    (reply,) = [e for e in events if isinstance(e, Reply)]
    assert reply.id == request_id and reply.error is not None
    assert reply.error.code == CLOSED  # closed, whoever closed it: callers reconnect on it
    assert reply.error.message == ("connection to the streamd daemon closed: streamd serves at"
                                   " most 512 connections at once")
    assert reply.error.data == {"reason": "too_many_connections", "limit": 512}


def test_an_error_with_no_id_that_is_no_refusal_leaves_the_end_of_input_plain() -> None:
    # The daemon answers a frame it could not read (too deep, too big) with
    # id null too: that says nothing about why the connection ends later.
    core = ClientProtocol()
    core.start(Call("eventlog/latest_seq", {}, int))
    unreadable = {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": "frame nests arrays and objects more than 128 levels deep"}}
    events, _ = core.receive(json.dumps(unreadable).encode() + b"\n")
    assert [type(e) for e in events] == [Garbled]
    (reply,) = [e for e in core.receive(b"")[0] if isinstance(e, Reply)]
    assert reply.error is not None and reply.error.code == CLOSED
    assert reply.error.message == "connection to the streamd daemon closed: end of input"


def test_a_request_over_the_daemons_frame_limit_is_refused_here_not_sent() -> None:
    # The daemon refuses such a frame without reading its id, so its answer
    # never reached the call, which waited for ever (a 9 MiB ADK event).
    proto = ClientProtocol(max_frame=1_000)
    big = calls.append("a", "u", "s", Event(id="e", author="x", content="x" * 2_000))
    with pytest.raises(RpcError) as caught:
        proto.start(big)
    assert caught.value.code == -32600
    assert "over the daemon's 1000 byte frame limit" in caught.value.message
    assert proto.in_flight == 0
    small = calls.append("a", "u", "s", Event(id="e", author="x", content="x"))
    proto.start(small)  # the connection goes on
    assert proto.in_flight == 1


@pytest.mark.parametrize("piece", [1 << 20, 97], ids=["one read", "many reads"])
def test_an_answer_over_the_frame_limit_fails_its_call_instead_of_leaving_it_waiting(
    piece: int,
) -> None:
    # Dropped unread, it was only a warning: the call waited for ever.
    core = ClientProtocol(max_frame=1_000)
    big, _ = core.start(Call("eventlog/sessions.get", {}, AppendResult))
    other, _ = core.start(Call("eventlog/append", {}, AppendResult))
    data = encode_result(big, {"seq": 1, "pad": "x" * 5_000})
    events = []
    for i in range(0, len(data), piece):
        events += core.receive(data[i:i + piece])[0]
    (reply,) = events
    assert reply.id == big and reply.error is not None
    assert reply.error.code == INTERNAL_ERROR
    size = len(data) - 1  # without its newline, as the limit counts
    assert f"answer is {size} bytes, over the 1000 byte frame limit" in reply.error.message
    assert core.in_flight == 1
    events, _ = core.receive(encode_result(other, {"seq": 2, "duplicate": False}))
    assert events == [Reply(other, value=AppendResult(seq=2, duplicate=False))]


def test_a_watch_entry_over_the_frame_limit_ends_the_watch_naming_where_to_resume() -> None:
    # Dropped unread, the watch went on past it: its consumer missed an
    # entry without a word.
    core = ClientProtocol(max_frame=1_000)
    watch_id, _ = core.start_watch(WatchParams())

    def entry_note(seq: int, content: Any = None) -> bytes:
        return encode_notification("eventlog/entry", {"watch": watch_id, "entry": entry(seq,
                                                                                     content)})

    _, out = core.receive(entry_note(1) + entry_note(2, "x" * 5_000) + entry_note(3))
    assert len(out) == 1 and daemon_reads(out[0]) == Cancel(watch_id)
    assert core.take(watch_id).seq == 1
    err = core.take(watch_id)
    assert isinstance(err, RpcError) and err.code == INTERNAL_ERROR
    assert err.data["last_seq"] == 1 and "from_seq=1" in err.message
    assert core.take(watch_id) is err  # entry 3, after the gap, is not given
