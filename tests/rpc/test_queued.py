"""Queued methods (``Method.submit``): requests the server hands to their
method from the reader, with no task of their own, answered by a callback.

Most tests use a fake queue whose work the test finishes by hand, so "not
answered yet" is checked at a point where everything else has run
(``wait_all_tasks_blocked``); the last ones run ``eventlog/append`` on a real
:class:`EventLog`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from support.rpc_client import Client, rpc
from support.rpc_streams import CountingStream, StalledStream

from streamd import errors
from streamd.errors import RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, Server
from streamd.rpc.methods import Reply
from streamd.rpc.protocol import Call, FrameReader


class Params(msgspec.Struct, forbid_unknown_fields=True):
    n: int


class Queue:
    """A queued method whose work is finished by the test: ``submitted`` holds
    each accepted request's params and reply, in arrival order."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Params, Reply]] = []
        self.fail: BaseException | None = None

    def submit(self, params: Params, reply: Reply) -> Awaitable[None] | None:
        if self.fail is not None:
            raise self.fail
        self.submitted.append((params, reply))
        return None

    async def handler(self, params: Params, request: Any) -> Any:
        raise AssertionError("a queued method's handler is never run by the server")

    def finish(self, count: int | None = None) -> None:
        """Answer the first ``count`` (all) requests, in one step: ``{"n": n}``."""
        done, self.submitted = self.submitted[:count], self.submitted[len(self.submitted[:count]):]
        for params, reply in done:
            reply({"n": params.n})


def table(queue: Queue) -> dict[str, Method]:
    return {"q": Method("q", Params, queue.handler, submit=queue.submit)}


@asynccontextmanager
async def serving(
    methods: dict[str, Method], **options: Any
) -> AsyncIterator[tuple[Client, CountingStream, trio.Event]]:
    """A client on one connection; the server's end counts its writes; the
    event is set when ``serve`` returns."""
    client_end, server_end = trio.testing.memory_stream_pair()
    server_stream = CountingStream(server_end)
    server = Server(lambda conn: methods, **options)
    ended = trio.Event()

    async def serve() -> None:
        await server.serve(server_stream, server_stream)
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield Client(client_end), server_stream, ended
        nursery.cancel_scope.cancel()


def frames(writes: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for w in writes for line in w.splitlines()]


async def test_a_queued_request_is_answered_only_when_its_work_is_done() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, stream, _):
            await client.start("q", {"n": 7})
            await trio.testing.wait_all_tasks_blocked()
            assert [p.n for p, _ in queue.submitted] == [7]
            assert stream.writes == []
            queue.finish()
            assert await client.response(1) == {"jsonrpc": "2.0", "id": 1, "result": {"n": 7}}


@pytest.mark.parametrize("cancel", ["$/cancelRequest", "recall/cancel"])
async def test_a_cancel_of_a_queued_request_gets_its_real_outcome(cancel: str) -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, stream, _):
            await client.start("q", {"n": 1})
            await client.send({"jsonrpc": "2.0", "method": cancel, "params": {"id": 1}})
            await trio.testing.wait_all_tasks_blocked()
            assert stream.writes == []  # not answered "canceled"
            queue.finish()
            assert (await client.response(1))["result"] == {"n": 1}


async def test_the_in_flight_bound_holds_for_queued_requests_until_their_reply() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue), max_inflight=2) as (client, _, _):
            await client.stream.send_all(b"".join(rpc(i, "q", {"n": i}) for i in (1, 2, 3)))
            await trio.testing.wait_all_tasks_blocked()
            assert [p.n for p, _ in queue.submitted] == [1, 2]  # the reader waits for room
            queue.finish(1)
            await trio.testing.wait_all_tasks_blocked()
            assert [p.n for p, _ in queue.submitted] == [2, 3]
            queue.finish()
            assert [(await client.response(i))["result"]["n"] for i in (1, 2, 3)] == [1, 2, 3]


async def test_the_byte_bound_holds_for_queued_requests_until_their_reply() -> None:
    queue = Queue()
    # What each request is charged: its params' estimated decoded size.
    reader = FrameReader()
    [frame] = reader.feed(rpc(1, "q", {"n": 1}))
    call = reader.event(frame)
    assert isinstance(call, Call)
    with trio.fail_after(5):
        async with serving(table(queue), max_inflight_bytes=2 * call.held) as (client, _, _):
            await client.stream.send_all(b"".join(rpc(i, "q", {"n": i}) for i in (1, 2, 3)))
            await trio.testing.wait_all_tasks_blocked()
            assert len(queue.submitted) == 2
            queue.finish(1)
            await trio.testing.wait_all_tasks_blocked()
            assert [p.n for p, _ in queue.submitted] == [2, 3]
            queue.finish()


async def test_replies_finished_in_one_step_leave_in_one_write() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, stream, _):
            await client.stream.send_all(b"".join(rpc(i, "q", {"n": i}) for i in range(1, 51)))
            await trio.testing.wait_all_tasks_blocked()
            assert len(queue.submitted) == 50
            queue.finish()
            await trio.testing.wait_all_tasks_blocked()
            assert len(stream.writes) == 1
            assert sorted(f["id"] for f in frames(stream.writes)) == list(range(1, 51))


async def test_an_id_already_queued_is_refused_and_the_queued_one_still_answered() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, _, _):
            await client.stream.send_all(rpc(1, "q", {"n": 1}) + rpc(1, "q", {"n": 2}))
            refused = await client.frame()
            assert refused["error"]["code"] == errors.INVALID_REQUEST
            assert "already in flight" in refused["error"]["message"]
            queue.finish()
            assert (await client.frame())["result"] == {"n": 1}


async def test_errors_of_a_queued_method_answer_with_their_codes() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, _, _):
            # Params are decoded before the method sees them: -32602, nothing queued.
            assert (await client.error("q", {"n": "x"}))["code"] == errors.INVALID_PARAMS
            assert (await client.error("q", {"n": 1, "extra": 1}))["code"] == errors.INVALID_PARAMS
            assert queue.submitted == []
            queue.fail = RpcError(errors.CLOSED, "closed")
            assert (await client.error("q", {"n": 1}))["code"] == errors.CLOSED
            queue.fail = ValueError("boom")
            err = await client.error("q", {"n": 1})
            assert (err["code"], err["message"]) == (errors.INTERNAL_ERROR, "boom")
            queue.fail = None
            # The work failed: its error, as the method said it.
            request_id = await client.start("q", {"n": 1})
            await trio.testing.wait_all_tasks_blocked()
            _, reply = queue.submitted.pop()
            reply(RpcError(errors.EVENT_CONFLICT, "conflict", {"seq": 3}))
            err = (await client.response(request_id))["error"]
            assert err == {"code": errors.EVENT_CONFLICT, "message": "conflict", "data": {"seq": 3}}
            # A result JSON cannot carry: -32603, and the connection goes on.
            request_id = await client.start("q", {"n": 1})
            await trio.testing.wait_all_tasks_blocked()
            _, reply = queue.submitted.pop()
            reply({"x": object()})
            assert (await client.response(request_id))["error"]["code"] == errors.INTERNAL_ERROR
            request_id = await client.start("q", {"n": 2})
            await trio.testing.wait_all_tasks_blocked()
            queue.finish()
            assert (await client.response(request_id))["result"] == {"n": 2}


async def test_a_reply_given_twice_is_answered_once() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, stream, _):
            await client.start("q", {"n": 1})
            await trio.testing.wait_all_tasks_blocked()
            _, reply = queue.submitted.pop()
            reply({"n": 1})
            reply({"n": 2})
            await trio.testing.wait_all_tasks_blocked()
            assert [f["result"] for f in frames(stream.writes)] == [{"n": 1}]


async def test_end_of_input_waits_for_queued_requests_and_a_late_reply_is_dropped() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, _, ended):
            await client.start("q", {"n": 1})
            await client.stream.aclose()  # the peer is gone, both ways
            await trio.testing.wait_all_tasks_blocked()
            assert not ended.is_set()  # the queued request is still in flight
            queue.finish()  # its reply has nobody to go to: dropped, nothing raised
            await ended.wait()


async def test_a_reply_after_the_connection_was_torn_down_is_harmless() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with serving(table(queue)) as (client, _, ended):
            await client.start("q", {"n": 1})
            await trio.testing.wait_all_tasks_blocked()
        # serving() cancelled the connection with the request still queued.
        assert not ended.is_set()
        queue.finish()


async def test_a_submit_that_must_wait_first_is_answered_when_it_has_queued() -> None:
    gate = trio.Event()
    replies: list[Reply] = []

    async def later(reply: Reply) -> None:
        await gate.wait()
        replies.append(reply)

    def submit(params: Params, reply: Reply) -> Awaitable[None]:
        return later(reply)

    async def never(params: Params, request: Any) -> None:
        raise AssertionError

    with trio.fail_after(5):
        async with serving({"q": Method("q", Params, never, submit=submit)}) as (client, s, _):
            await client.start("q", {"n": 1})
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert s.writes == []
            replies[0]({"ok": True})
            assert (await client.response(1))["result"] == {"ok": True}


# --- on a real event log ----------------------------------------------------------------------


def append(event_id: str, session: str = "s") -> dict[str, Any]:
    return {
        "app": "app",
        "user": "u",
        "session": session,
        "event": {"id": event_id, "author": "agent", "content": {"k": event_id}},
    }


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL", watch_interval=60) as log:
        yield log


async def test_an_append_is_answered_after_the_commit_that_holds_it(log: EventLog) -> None:
    methods = {m.name: m for m in eventlog_methods(lambda: log)}
    with trio.fail_after(10):
        async with serving(methods) as (client, _, _):
            first = await client.result("eventlog/append", append("e0"))  # opens the log
            assert first == {"seq": 1, "duplicate": False}
            batches = log.stats.batches
            await client.stream.send_all(
                b"".join(rpc(100 + i, "eventlog/append", append(f"e{i}")) for i in range(1, 21))
            )
            results = [await client.response(100 + i) for i in range(1, 21)]
            # Every reply names a seq that a read on another connection finds.
            seqs = [r["result"]["seq"] for r in results]
            assert seqs == list(range(2, 22))
            assert await log.latest_seq() == 21
            assert log.stats.batches > batches


async def test_the_replies_of_one_commit_leave_in_one_write(log: EventLog) -> None:
    methods = {m.name: m for m in eventlog_methods(lambda: log)}
    with trio.fail_after(10):
        async with serving(methods) as (client, stream, _):
            await client.result("eventlog/append", append("e0"))
            batches, writes = log.stats.batches, len(stream.writes)
            await client.stream.send_all(
                b"".join(rpc(100 + i, "eventlog/append", append(f"e{i}")) for i in range(1, 31))
            )
            for i in range(1, 31):
                await client.response(100 + i)
            if log.stats.batches == batches + 1:  # all thirty in one commit, as is usual
                assert len(stream.writes) == writes + 1
            assert len(stream.writes) - writes <= log.stats.batches - batches


async def test_a_batch_is_queued_and_answered_as_one(log: EventLog) -> None:
    methods = {m.name: m for m in eventlog_methods(lambda: log)}
    with trio.fail_after(10):
        async with serving(methods) as (client, _, _):
            got = await client.result(
                "eventlog/append_batch", {"appends": [append("a"), append("b")]}
            )
            assert got == {"results": [{"seq": 1, "duplicate": False},
                                       {"seq": 2, "duplicate": False}]}
            err = await client.error("eventlog/append_batch", {"appends": [{"app": "app"}]})
            assert err["code"] == errors.INVALID_PARAMS


async def test_appends_of_a_connection_that_closed_are_committed_and_others_go_on(
    log: EventLog,
) -> None:
    methods = {m.name: m for m in eventlog_methods(lambda: log)}
    with trio.fail_after(10):
        async with serving(methods) as (bystander, _, _), serving(methods) as (leaver, _, ended):
            await bystander.result("eventlog/append", append("first", session="b"))
            await leaver.stream.send_all(
                b"".join(rpc(i, "eventlog/append", append(f"gone{i}")) for i in range(10))
            )
            await leaver.stream.aclose()
            await ended.wait()  # the connection ended once its appends were answered
            page = await log.since(0)
            assert {e.event.id for e in page.entries} >= {f"gone{i}" for i in range(10)}
            assert await bystander.result("eventlog/append", append("after", session="b")) == {
                "seq": 12,
                "duplicate": False,
            }


async def test_an_append_to_a_closed_log_answers_closed(tmp_path: Path) -> None:
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        methods = {m.name: m for m in eventlog_methods(lambda: log)}
        with trio.fail_after(10):
            async with serving(methods) as (client, _, _):
                await client.result("eventlog/append", append("e1"))
                await log.aclose()
                assert (await client.error("eventlog/append", append("e2")))["code"] == (
                    errors.CLOSED
                )
                err = await client.error("eventlog/append_batch", {"appends": [append("e3")]})
                assert err["code"] == errors.CLOSED


async def test_the_first_append_opens_a_log_the_factory_gives_asynchronously(
    tmp_path: Path,
) -> None:
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:

        async def factory() -> EventLog:
            await trio.lowlevel.checkpoint()
            return log

        methods = {m.name: m for m in eventlog_methods(factory)}
        with trio.fail_after(10):
            async with serving(methods) as (client, _, _):
                await client.stream.send_all(
                    b"".join(rpc(i, "eventlog/append", append(f"e{i}")) for i in range(1, 4))
                )
                seqs = [(await client.response(i))["result"]["seq"] for i in (1, 2, 3)]
                assert sorted(seqs) == [1, 2, 3]


async def test_a_peer_that_never_reads_its_answers_stops_being_read() -> None:
    # Replies of queued requests come from callbacks that cannot wait; the
    # bound on unwritten bytes is what keeps such a peer's cost bounded.
    queue = Queue()
    # Lockstep: a send completes only when the other side reads it, as a
    # full socket would.
    client_end, server_end = trio.testing.lockstep_stream_pair()
    stream = StalledStream(server_end)
    server = Server(lambda conn: table(queue), max_inflight=8, max_unwritten_bytes=2_000)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, stream, stream)
            client = Client(client_end)
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for n in range(10_000):
                    await client.send({"jsonrpc": "2.0", "id": n, "method": "q",
                                       "params": {"n": n}})
                    sent += 1

            nursery.start_soon(flood)
            for _ in range(200):
                await trio.testing.wait_all_tasks_blocked()
                queue.finish()
            session = next(iter(server._sessions))
            # Dispatch stops at the bound; past it come at most the answers of
            # the requests already in flight (8, each under 64 bytes).
            assert 2_000 < session.conn.unwritten_bytes <= 2_000 + 8 * 64
            assert sent < 10_000  # the flood itself is held up: nothing reads it
            stream.release.set()
            nursery.cancel_scope.cancel()
