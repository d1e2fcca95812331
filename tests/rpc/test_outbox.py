"""The outbox's direct writes: a step's frames for an idle connection leave as
one non-blocking write at the step's end, with no wake of its writer task;
never while the writer task has something or is writing, and what does not
fit goes to the writer task in order.

The unit tests drive an :class:`Outbox` with a fake ``write_now`` and a writer
task that records what it takes; "parked" is checked once everything else has
run (``wait_all_tasks_blocked``). The last ones run the server on a real Unix
socket pair, where the direct write is the only kind that can put bytes in the
peer's socket without a checkpoint.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from support.rpc_client import Client

from streamd.rpc import Method, Server
from streamd.rpc.methods import Connection, Reply
from streamd.rpc.outbox import Outbox, gathered


class FakeSocket:
    """``write_now`` for an outbox: takes at most ``room`` bytes a call (all
    when None), or raises ``fail``."""

    def __init__(self, room: int | None = None, writes: list[bytes] | None = None) -> None:
        self.writes: list[bytes] = [] if writes is None else writes
        self.room = room
        self.fail: OSError | None = None

    def write_now(self, data: bytes) -> int:
        if self.fail is not None:
            raise self.fail
        n = len(data) if self.room is None else min(self.room, len(data))
        if n:
            self.writes.append(data[:n])
        return n


class Writer:
    """The connection's writer task, as the server runs it: takes everything
    queued, records it, and goes back for more."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.taken: list[list[bytes]] = []
        self.ended = False

    async def run(self) -> None:
        while frames := await self.outbox.take():
            self.taken.append(frames)
        self.ended = True


@asynccontextmanager
async def writer_for(outbox: Outbox) -> AsyncIterator[Writer]:
    writer = Writer(outbox)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()  # parked on the empty outbox
        yield writer
        outbox.close()


async def test_a_steps_frames_for_an_idle_connection_leave_as_one_write_at_its_end() -> None:
    sock = FakeSocket()
    outbox = Outbox(8, sock.write_now)
    async with writer_for(outbox) as writer:
        with gathered():
            assert outbox.put_nowait(b"a\n")
            with gathered():  # nested: the outer one writes
                assert outbox.put_nowait(b"b\n")
            assert outbox.put_nowait(b"c\n")
            assert sock.writes == []  # held until the step's end
        assert sock.writes == [b"a\nb\nc\n"]
        await trio.testing.wait_all_tasks_blocked()
        assert writer.taken == []  # the writer task was never woken
        # Later frames outside a step go to the writer task as always.
        outbox.put_nowait(b"d\n")
        await trio.testing.wait_all_tasks_blocked()
        assert writer.taken == [[b"d\n"]]
        assert sock.writes == [b"a\nb\nc\n"]


async def test_the_connections_a_step_holds_are_written_in_order_of_their_first_frames() -> None:
    # A commit's callers (answered before its watchers are handed it) get
    # their acknowledgements first: the writers' rate is the target.
    order: list[bytes] = []
    first, second = FakeSocket(writes=order), FakeSocket(writes=order)
    caller, watcher = Outbox(8, first.write_now), Outbox(8, second.write_now)
    async with writer_for(caller), writer_for(watcher):
        with gathered():
            caller.put_nowait(b"ack\n")
            watcher.put_nowait(b"entry\n")
            caller.put_nowait(b"ack2\n")
        assert order == [b"ack\nack2\n", b"entry\n"]


async def test_what_does_not_fit_goes_to_the_writer_task_in_order() -> None:
    sock = FakeSocket(room=3)
    outbox = Outbox(8, sock.write_now)
    async with writer_for(outbox) as writer:
        with gathered():
            outbox.put_nowait(b"one\n")
            outbox.put_nowait(b"two\n")
        assert sock.writes == [b"one"]
        # The writer task is woken for the rest; a frame queued meanwhile
        # (the next step's, say) goes behind it, never directly.
        with gathered():
            outbox.put_nowait(b"three\n")
        assert sock.writes == [b"one"]
        await trio.testing.wait_all_tasks_blocked()
    assert b"".join(sock.writes + [f for frames in writer.taken for f in frames]) == (
        b"one\ntwo\nthree\n"
    )


async def test_nothing_is_written_directly_while_frames_wait_for_the_writer_task() -> None:
    sock = FakeSocket()
    outbox = Outbox(8, sock.write_now)
    async with writer_for(outbox) as writer:
        outbox.put_nowait(b"first\n")  # the writer task is woken, has not run yet
        with gathered():
            outbox.put_nowait(b"second\n")
        assert sock.writes == []
        await trio.testing.wait_all_tasks_blocked()
        assert writer.taken == [[b"first\n", b"second\n"]]


async def test_a_connection_without_a_direct_write_wakes_its_writer_task() -> None:
    outbox = Outbox(8)
    async with writer_for(outbox) as writer:
        with gathered():
            outbox.put_nowait(b"x\n")
        await trio.testing.wait_all_tasks_blocked()
        assert writer.taken == [[b"x\n"]]


async def test_a_write_that_fails_leaves_the_frames_to_the_writer_task() -> None:
    sock = FakeSocket()
    sock.fail = BrokenPipeError()
    outbox = Outbox(8, sock.write_now)
    async with writer_for(outbox) as writer:
        with gathered():
            outbox.put_nowait(b"a\n")
            outbox.put_nowait(b"b\n")
        await trio.testing.wait_all_tasks_blocked()
        # Joined once already; the writer task meets the error and reports it.
        assert writer.taken == [[b"a\nb\n"]]


async def test_a_step_that_raises_still_writes_what_it_held() -> None:
    sock = FakeSocket()
    outbox = Outbox(8, sock.write_now)
    async with writer_for(outbox):
        with pytest.raises(ZeroDivisionError), gathered():
            outbox.put_nowait(b"a\n")
            _ = 1 / 0
        assert sock.writes == [b"a\n"]


async def test_an_outbox_closed_within_the_step_leaves_its_frames_to_the_writer_task() -> None:
    sock = FakeSocket()
    outbox = Outbox(8, sock.write_now)
    async with writer_for(outbox) as writer:
        with gathered():
            outbox.put_nowait(b"last\n")
            outbox.close()
            assert not outbox.put_nowait(b"dropped\n")
        assert sock.writes == []
        await trio.testing.wait_all_tasks_blocked()
        assert writer.taken == [[b"last\n"]]
        assert writer.ended


# --- the server on a real socket ---------------------------------------------------------


class Params(msgspec.Struct):
    n: int


class Queue:
    """A queued method whose work the test finishes by hand (as test_queued's)."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Params, Reply]] = []

    def submit(self, params: Params, reply: Reply) -> Awaitable[None] | None:
        self.submitted.append((params, reply))
        return None

    async def handler(self, params: Params, request: Any) -> Any:
        raise AssertionError("a queued method's handler is never run by the server")

    def finish(self) -> None:
        """Answer every request submitted, in one step: ``{"n": n}``."""
        done, self.submitted = self.submitted, []
        for params, reply in done:
            reply({"n": params.n})


def table(queue: Queue) -> dict[str, Method]:
    return {"q": Method("q", Params, queue.handler, submit=queue.submit)}


@asynccontextmanager
async def socket_session(queue: Queue) -> AsyncIterator[tuple[Connection, socket.socket]]:
    """The server on one end of a Unix socket pair, and its connection; the
    test holds the other end, a plain non-blocking socket, so it can look
    without a checkpoint."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    conns: list[Connection] = []

    def methods(conn: Connection) -> dict[str, Method]:
        conns.append(conn)
        return table(queue)

    server = Server(methods)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, stream, stream)
        await trio.testing.wait_all_tasks_blocked()
        try:
            (conn,) = conns
            yield conn, ours
        finally:
            nursery.cancel_scope.cancel()
            ours.close()


def pending(sock: socket.socket) -> bytes:
    """Whatever the server has written to ``sock`` so far, without waiting."""
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


async def test_a_steps_answers_are_in_the_peers_socket_when_the_step_ends() -> None:
    queue = Queue()
    with trio.fail_after(5):
        async with socket_session(queue) as (conn, sock):
            sock.sendall(
                b"".join(
                    b'{"jsonrpc":"2.0","id":%d,"method":"q","params":{"n":%d}}\n' % (n, n)
                    for n in range(3)
                )
            )
            while len(queue.submitted) < 3:
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0)
            assert pending(sock) == b""
            with gathered():
                queue.finish()
            # No checkpoint since: only the direct write can have put them there.
            assert pending(sock) == b"".join(
                b'{"jsonrpc":"2.0","id":%d,"result":{"n":%d}}\n' % (n, n) for n in range(3)
            )
            assert conn.unwritten_bytes == 0


async def fill_until_the_server_keeps_some(direct: bool) -> tuple[int, list[int]]:
    """A peer that stops reading, sent requests eight at a time, each eight
    answered in one step (as a commit of eight appends is), directly or by the
    writer task: the bytes in its socket when the server first has to keep
    some, and then every answer's id, read."""
    queue = Queue()
    with trio.fail_after(20):
        async with socket_session(queue) as (conn, sock):
            n = 0
            while not conn.unwritten_bytes:
                sock.sendall(
                    b"".join(
                        b'{"jsonrpc":"2.0","id":%d,"method":"q","params":{"n":%d}}\n' % (i, i)
                        for i in range(n, n + 8)
                    )
                )
                n += 8
                while len(queue.submitted) < 8:
                    await trio.sleep(0)
                if direct:
                    with gathered():
                        queue.finish()
                else:
                    queue.finish()
                    await trio.testing.wait_all_tasks_blocked()
            in_socket = unread(sock)
            client = Client(trio.SocketStream(trio.socket.from_stdlib_socket(sock)))
            return in_socket, [(await client.frame())["id"] for _ in range(n)]


async def test_a_peer_that_stops_reading_holds_as_much_as_with_the_writer_task() -> None:
    # The premise of the tests of peers that stop reading: a step's small
    # answers leave as one write (not one a frame: each write is a buffer of
    # its own in the kernel, and its overhead counts against the socket's
    # size), so the peer's socket takes as many of them as when the writer
    # task wrote them; past that they wait for the writer task, in order.
    by_task, _ = await fill_until_the_server_keeps_some(direct=False)
    direct, ids = await fill_until_the_server_keeps_some(direct=True)
    assert direct >= by_task > 1 << 15
    assert ids == list(range(len(ids)))


def unread(sock: socket.socket) -> int:
    """Bytes waiting unread on this end of a socket."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])


# --- a request's own answer ----------------------------------------------------------


class Gate:
    """A plain (not queued) method that answers ``{"n": n}`` once the test opens it."""

    def __init__(self) -> None:
        self.open = trio.Event()
        self.waiting = 0

    async def handler(self, params: Params, request: Any) -> Any:
        self.waiting += 1
        await self.open.wait()
        return {"n": params.n}


class WriterSteps(trio.abc.Instrument):
    """Counts the steps of the connections' writer tasks."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("_Session._write"):
            self.steps += 1


@asynccontextmanager
async def gated_session(gate: Gate) -> AsyncIterator[socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    server = Server(lambda conn: {"h": Method("h", Params, gate.handler)})
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, stream, stream)
        await trio.testing.wait_all_tasks_blocked()
        try:
            yield ours
        finally:
            nursery.cancel_scope.cancel()
            ours.close()


def calls(*ns: int) -> bytes:
    call = b'{"jsonrpc":"2.0","id":%d,"method":"h","params":{"n":%d}}\n'
    return b"".join(call % (n, n) for n in ns)


def answers(*ns: int) -> bytes:
    return b"".join(b'{"jsonrpc":"2.0","id":%d,"result":{"n":%d}}\n' % (n, n) for n in ns)


async def answered(*ns: int) -> tuple[bytes, int]:
    """Requests ``ns`` sent at once, held by the gate until all are in flight,
    then released in one step: what the peer's socket holds once everything
    has run, and how many steps the connection's writer task took for it."""
    gate, steps = Gate(), WriterSteps()
    with trio.fail_after(5):
        async with gated_session(gate) as sock:
            sock.sendall(calls(*ns))
            while gate.waiting < len(ns):  # the server reads the real socket
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0)
            trio.lowlevel.add_instrument(steps)
            try:
                gate.open.set()
                await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(steps)
            return pending(sock), steps.steps


async def test_the_answer_to_a_lone_request_leaves_without_the_writer_task() -> None:
    got, writer_steps = await answered(1)
    assert got == answers(1)
    assert writer_steps == 0


async def test_answers_of_requests_in_flight_together_leave_through_the_writer_task() -> None:
    # A peer that pipelines gets what one step answered in one write, as
    # before: one write a frame would fill its socket with overhead.
    got, writer_steps = await answered(1, 2, 3)
    assert sorted(got.splitlines(keepends=True)) == sorted(
        answers(1, 2, 3).splitlines(keepends=True)
    )
    assert writer_steps > 0
