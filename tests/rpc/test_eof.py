"""End of input finishes what was asked of the event log, and cancels Recall.

For ``eventlog/*`` requests, end of input (stdin's EOF, a socket peer's
half-close) means "no more requests": those already read are answered as usual
within the grace, an open watch ends with ``{last_seq}``, and only a request
still running after the grace is cancelled (-32007). Recall requests keep the
reference's rule: cancelled at end of input, answered -32007. A stall is a
hook on a real method's handler, and the grace passes on Trio's mock clock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.recall import Peer, error, initialized, req, search

from streamd.daemon import Config, Daemon, serve_socket
from streamd.rpc import Method, MethodTable, Server
from streamd.rpc.methods import Connection
from streamd.rpc.outbox import Outbox
from streamd.rpc.server import EOF_GRACE, STOP_GRACE

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]

CREATE = {"app": "a", "user": "u", "session": "s"}


def appended(event_id: str) -> dict[str, Any]:
    return {**CREATE, "event": {"id": event_id, "author": "me", "content": event_id}}


class Stall:
    """A hook in front of one method's real handler: the request waits there
    (``entered`` is set) until ``release`` is set, then runs as usual."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    def around(self, method: Method) -> Method:
        async def stalled(params: Any, request: Any) -> Any:
            self.entered.set()
            await self.release.wait()
            return await method.handler(params, request)

        return dataclasses.replace(method, handler=stalled)


@asynccontextmanager
async def served(
    tmp_path: Path, stalls: dict[str, Stall] | None = None
) -> AsyncIterator[tuple[Peer, trio.Event]]:
    """The daemon's real method table (Recall and the event log) on one
    in-memory connection; yields (peer, ended)."""
    daemon = Daemon(Config(db=str(tmp_path / "events.db")))

    def methods(conn: Any) -> MethodTable:
        table = dict(daemon.methods_for(conn).items())
        for name, stall in (stalls or {}).items():
            table[name] = stall.around(table[name])
        return table

    server = Server(methods)
    client, server_end = trio.testing.memory_stream_pair()
    ended = trio.Event()

    async def serve() -> None:
        await server.serve(server_end, server_end)
        ended.set()

    async with daemon.running(), trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield Peer(client), ended


def by_id(frames: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    answers = [f for f in frames if "id" in f]
    assert len({f["id"] for f in answers}) == len(answers), frames
    return {f["id"]: f for f in answers}


async def test_every_eventlog_method_finishes_at_eof_and_every_recall_method_is_cancelled(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        conn = Connection(nursery, Outbox(8))
        table = Daemon(Config(db=str(tmp_path / "e.db"))).methods_for(conn)
        policy = {name: m.at_eof for name, m in table.items()}
        nursery.cancel_scope.cancel()
    assert {n for n, p in policy.items() if p == "finish"} == {
        n for n in policy if n.startswith("eventlog/")}
    assert {n for n, p in policy.items() if p == "cancel"} == {
        n for n in policy if n.startswith("recall/")} != set()


def test_the_newcomer_pipe_answers_both_requests_and_exits_zero(tmp_path: Path) -> None:
    """``echo REQUESTS | streamd --db x.db``: what was written is answered.
    (The append goes to another session: requests on one connection run
    concurrently, and an append, which creates its session, may commit before
    a create sent ahead of it.)"""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "eventlog/sessions.create", "params": CREATE},
        {"jsonrpc": "2.0", "id": 2, "method": "eventlog/append",
         "params": {**appended("e1"), "session": "t"}},
    ]
    done = subprocess.run(
        [sys.executable, "-m", "streamd", "--db", str(tmp_path / "x.db")],
        input="".join(json.dumps(r) + "\n" for r in requests).encode(),
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    frames = by_id([json.loads(line) for line in done.stdout.splitlines()])
    assert done.returncode == 0, done.stderr
    assert sorted(frames) == [1, 2]
    assert "result" in frames[1] and frames[1]["result"]["session"] == "s", frames
    assert frames[2].get("result") == {"seq": 1, "duplicate": False}, frames


async def test_a_watch_open_at_end_of_input_answers_its_last_seq(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with served(tmp_path) as (peer, ended):
            await peer.send(*(req(i, "eventlog/append", **appended(f"e{i}")) for i in (1, 2, 3)))
            assert sorted(await peer.recv_by_id(3)) == [1, 2, 3]
            await peer.send(req(9, "eventlog/watch", from_seq=0))
            entries = [await peer.recv() for _ in range(3)]
            assert [f["params"]["entry"]["seq"] for f in entries if f] == [1, 2, 3]
            await peer.close_input()
            frames = await peer.drain()
            await ended.wait()
    assert frames == [{"jsonrpc": "2.0", "id": 9, "result": {"last_seq": 3}}]


async def test_requests_in_flight_at_end_of_input_finish_and_recall_ones_are_cancelled(
    tmp_path: Path, world: Any
) -> None:
    with trio.fail_after(60):
        async with served(tmp_path) as (peer, ended):
            await initialized(peer, world, debug_stall_ms=600_000)
            await peer.send(
                search(2, "td-1"),
                req(3, "eventlog/sessions.create", **CREATE),
                req(4, "eventlog/append", **{**appended("e1"), "session": "t"}),
                req(5, "eventlog/watch", from_seq=0),
            )
            await peer.close_input()
            frames = await peer.drain()
            await ended.wait()
    got = by_id(frames)
    assert error(got[2]) == (2, -32007, "context canceled")  # the reference's rule
    assert got[3]["result"]["session"] == "s"
    assert got[4]["result"] == {"seq": 1, "duplicate": False}
    # The watch may or may not have been handed e1 before it wrapped up; its
    # answer says which, and it is never an error.
    sent = [f["params"]["entry"]["seq"] for f in frames if f.get("method") == "eventlog/entry"]
    assert got[5]["result"] == {"last_seq": sent[-1] if sent else 0}


async def test_an_eventlog_request_that_outlasts_the_grace_is_cancelled(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    stall = Stall()
    with trio.fail_after(EOF_GRACE * 10):  # mock time
        async with served(tmp_path, {"eventlog/ping": stall}) as (peer, ended):
            await peer.send(req(1, "eventlog/ping"))
            await stall.entered.wait()
            await peer.close_input()
            at_eof = trio.current_time()
            frames = await peer.drain()
            waited = trio.current_time() - at_eof
            await ended.wait()
    assert len(frames) == 1 and error(frames[0])[:2] == (1, -32007)
    assert "grace" in frames[0]["error"]["message"]
    assert EOF_GRACE <= waited < EOF_GRACE + 1


def stoppable(tmp_path: Path, stall: Stall) -> tuple[Daemon, Server, Peer, Any]:
    """The daemon's methods, ``eventlog/ping`` stalled, on a server the test
    stops itself (as a signal does); the server's end of the stream is last."""
    daemon = Daemon(Config(db=str(tmp_path / "events.db")))

    def methods(conn: Any) -> MethodTable:
        table = dict(daemon.methods_for(conn).items())
        table["eventlog/ping"] = stall.around(table["eventlog/ping"])
        return table

    client, server_end = trio.testing.memory_stream_pair()
    return daemon, Server(methods), Peer(client), server_end


async def test_a_signal_after_end_of_input_cuts_the_grace_short(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    stall = Stall()
    daemon, server, peer, server_end = stoppable(tmp_path, stall)
    with trio.fail_after(EOF_GRACE * 10):
        async with daemon.running(), trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            await peer.send(req(1, "eventlog/ping"))
            await stall.entered.wait()
            await peer.close_input()
            await trio.sleep(1)
            server.stop()
            at_stop = trio.current_time()
            frames = await peer.drain()
            assert trio.current_time() - at_stop < 1
    assert error(frames[0]) == (1, -32007, "context canceled")


async def test_a_socket_half_close_finishes_eventlog_requests_and_watches(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "streamd.sock")
    daemon = Daemon(Config(db=str(tmp_path / "events.db")))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_socket, daemon, path)
            stream = await trio.open_unix_socket(path)
            peer = Peer(trio.StapledStream(stream, stream))
            await peer.send(req(1, "eventlog/append", **appended("e1")))
            assert (await peer.recv() or {}).get("result") == {"seq": 1, "duplicate": False}
            await peer.send(req(2, "eventlog/watch", from_seq=0))
            entry = await peer.recv()
            assert entry and entry["params"]["entry"]["seq"] == 1
            await peer.send(req(3, "eventlog/sessions.create", **{**CREATE, "session": "t"}),
                            req(4, "eventlog/append", **appended("e2")))
            await stream.send_eof()  # shutdown(SHUT_WR): what attach sends at its EOF
            frames = await peer.drain()
            nursery.cancel_scope.cancel()
    got = by_id(frames)
    assert got[3]["result"]["session"] == "t"
    assert got[4]["result"] == {"seq": 2, "duplicate": False}
    sent = [1] + [f["params"]["entry"]["seq"] for f in frames
                  if f.get("method") == "eventlog/entry"]
    assert got[2]["result"] == {"last_seq": sent[-1]}



async def test_a_signal_ends_a_watch_with_its_last_seq_and_cancels_what_does_not_wrap_up(
    tmp_path: Path,
) -> None:
    # A watch cancelled at a stop left its client nothing to tell the daemon's
    # end from its own cancel, and no seq to resume from. (The real clock: a
    # mock one jumps ahead while the log's threads work.)
    stall = Stall()
    daemon, server, peer, server_end = stoppable(tmp_path, stall)
    with trio.fail_after(60):
        async with daemon.running(), trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            await peer.send(req(1, "eventlog/append", **appended("e1")))
            assert (await peer.recv() or {}).get("result") == {"seq": 1, "duplicate": False}
            await peer.send(req(2, "eventlog/watch", from_seq=0), req(3, "eventlog/ping"))
            entry = await peer.recv()
            assert entry and entry["params"]["entry"]["seq"] == 1
            await stall.entered.wait()
            server.stop()
            at_stop = trio.current_time()
            frames = await peer.drain()
            waited = trio.current_time() - at_stop
    got = by_id(frames)
    assert got[2]["result"] == {"last_seq": 1}
    # A request that does not wrap up is cancelled after the stop's grace.
    assert error(got[3]) == (3, -32007, "context canceled")
    assert waited >= STOP_GRACE


async def test_a_signal_while_a_shutdown_waits_for_requests_still_answers_the_shutdown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The shutdown's wait for the requests in flight ran inside the reading
    # scope a stop cancels: the requests were answered, the shutdown never.
    stall = Stall()
    daemon, server, peer, server_end = stoppable(tmp_path, stall)
    with trio.fail_after(EOF_GRACE * 10):
        async with daemon.running(), trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            await peer.send(req(1, "eventlog/ping"))
            await stall.entered.wait()
            await peer.send(req(2, "recall/shutdown"))
            await trio.testing.wait_all_tasks_blocked()
            server.stop()
            frames = await peer.drain()
    got = by_id(frames)
    assert error(got[1]) == (1, -32007, "context canceled")
    assert got[2]["result"] == {}
    assert frames[-1] is got[2]  # still the last frame
