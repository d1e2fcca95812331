"""What all connections hold together (:mod:`streamd.rpc.held`).

Each connection was bounded on its own, none together: N clients pipelining
requests whose params or answers they never let go of made the daemon hold
N times a connection's bounds (``bench/held_memory.py``). Memory is asserted
through the accounting (the budget's peak total), never through RSS; nothing
is timed: handlers are gated by events, and each test is bounded.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import trio.testing
from support.rpc_client import Client, rpc
from support.rpc_streams import StalledStream

from streamd.rpc import Method, Server
from streamd.rpc.held import HeldBudget, admits

KIB = 1 << 10
LIMIT = 1 << 20  # half common, half shared among the connections


class Params(msgspec.Struct):
    pad: str = ""


class Held:
    """A method whose requests hold their params until ``gate`` opens (a
    watch's filter is held for the watch's life), one answered at once, and
    a bulk one whose answers are 4 KiB (a page of events, a search)."""

    def __init__(self) -> None:
        self.started = 0
        self.gate = trio.Event()

    async def hold(self, params: Params, request: Any) -> str:
        self.started += 1
        await self.gate.wait()
        return "done"

    async def ping(self, params: Params, request: Any) -> str:
        return "pong"

    async def page(self, params: Params, request: Any) -> str:
        self.started += 1
        return "x" * (4 * KIB)

    def table(self) -> dict[str, Method]:
        return {"hold": Method("hold", Params, self.hold),
                "ping": Method("ping", Params, self.ping),
                "page": Method("page", Params, self.page, bulk=True)}


def held_params(request_id: int) -> bytes:
    """A "hold" of 32 KiB of ASCII params: charged about 32 KiB."""
    return rpc(request_id, "hold", {"pad": "p" * (32 * KIB)})


async def test_pipelining_clients_hold_at_most_the_daemon_wide_limit_together() -> None:
    held = Held()
    server = Server(lambda conn: held.table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                client_end, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve, server_end, server_end)
                # 64 x 32 KiB each: 16 MiB in all, within each connection's
                # own bounds (256 requests, 64 MiB).
                nursery.start_soon(client_end.send_all,
                                   b"".join(held_params(n) for n in range(64)))
            await trio.testing.wait_all_tasks_blocked()
            # Half the limit in common, then a share of 64 KiB for each of the
            # eight, past which a connection neither reads (but for the read
            # that passed it, 64 KiB at most) nor dispatches; but for the one
            # with the overdraft, which may hold what its own bounds let it
            # (its 64 requests here).
            assert server.held.peak <= LIMIT + 8 * 64 * KIB + 64 * 33 * KIB
            assert held.started * 32 * KIB <= LIMIT + 64 * 32 * KIB
            assert held.started >= 4
            held.gate.set()
            nursery.cancel_scope.cancel()


async def test_a_client_within_its_share_is_served_while_the_hogs_wait() -> None:
    held = Held()
    server = Server(lambda conn: held.table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                hog_end, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve, server_end, server_end)
                nursery.start_soon(hog_end.send_all, b"".join(held_params(n) for n in range(64)))
            await trio.testing.wait_all_tasks_blocked()
            hogs_started = held.started
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            client = Client(client_end)
            # Answered while the hogs still hold what they took and wait.
            assert await client.result("ping", {"pad": "q" * KIB}) == "pong"
            assert held.started == hogs_started < 4 * 64
            # The common half is full: one more hog request would pass it.
            assert server.held.total + 33 * KIB > LIMIT // 2
            held.gate.set()
            nursery.cancel_scope.cancel()


async def test_clients_that_read_no_answers_hold_at_most_the_limit_together() -> None:
    held = Held()
    server = Server(lambda conn: held.table(), max_held_bytes=LIMIT)
    stalled = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                hog_end, server_end = trio.testing.memory_stream_pair()
                stream = StalledStream(server_end)
                stalled.append(stream)
                nursery.start_soon(server.serve, stream, stream)
                # 256 answers of 4 KiB each: 1 MiB, within the connection's
                # 16 MiB of unwritten answers; 8 MiB for the eight.
                nursery.start_soon(hog_end.send_all, b"".join(
                    rpc(n, "page", {}) for n in range(256)))
            await trio.testing.wait_all_tasks_blocked()
            # A bulk answer is computed once its connection fits: past the
            # limit by at most what each connection's four slots computed
            # at once, and the answers of the one with the overdraft (its
            # 256). Before, each computed all 256 (8 MiB in all).
            slack = 8 * 4 * 4 * KIB + 256 * 5 * KIB
            assert held.started * 4 * KIB <= LIMIT + slack
            assert held.started < 8 * 256
            assert server.held.peak <= LIMIT + slack
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            assert await Client(client_end).result("ping", {}) == "pong"
            for stream in stalled:
                stream.release.set()
            nursery.cancel_scope.cancel()


async def test_bulk_answers_are_charged_before_they_are_computed() -> None:
    computing = 0
    gate = trio.Event()

    async def slow_page(params: Params, request: Any) -> str:
        nonlocal computing
        computing += 1
        await gate.wait()
        return "x" * (4 * KIB)

    table = {"page": Method("page", Params, slow_page, bulk=True)}
    server = Server(lambda conn: table, max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                hog_end, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve, server_end, server_end)
                nursery.start_soon(hog_end.send_all, b"".join(
                    rpc(n, "page", {}) for n in range(16)))
            await trio.testing.wait_all_tasks_blocked()
            # Each computation holds up to a share from its start (64 KiB
            # here once all eight are open): about the common half's worth
            # and one more per connection, not the four slots of all eight
            # (32), which were charged nothing until answered.
            assert 1 <= computing <= 16
            assert server.held.peak <= LIMIT
            gate.set()
            nursery.cancel_scope.cancel()


class CountingReads(trio.abc.HalfCloseableStream):
    """A server end that counts what the server has read from it."""

    def __init__(self, inner: trio.StapledStream) -> None:
        self.inner = inner
        self.read = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.read += len(data)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_clients_sending_unfinished_big_frames_hold_at_most_the_limit_together() -> None:
    server = Server(lambda conn: Held().table(), max_held_bytes=LIMIT)
    ends = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                client_end, server_end = trio.testing.memory_stream_pair()
                counted = CountingReads(server_end)
                ends.append(counted)
                nursery.start_soon(server.serve, counted, counted)
                # The start of a frame of 1 MiB, within the 8 MiB limit: the
                # reader holds what it has read of it.
                nursery.start_soon(client_end.send_all, b'{"pad":"' + b"x" * (1 << 20))
            await trio.testing.wait_all_tasks_blocked()
            # Each stops reading past its share, give or take one read (64 KiB),
            # but for the one with the overdraft, which reads its frame on.
            assert sum(end.read for end in ends) <= LIMIT + 8 * 64 * KIB + (1 << 20)
            assert server.held.peak <= LIMIT + 8 * 64 * KIB + (1 << 20)
            assert sum(end.read for end in ends) < 8 * (1 << 20)
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            assert await Client(client_end).result("ping", {}) == "pong"
            nursery.cancel_scope.cancel()


async def test_what_a_connection_held_is_let_go_when_it_ends() -> None:
    held = Held()
    server = Server(lambda conn: held.table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            await client_end.send_all(b"".join(held_params(n) for n in range(4)))
            await trio.testing.wait_all_tasks_blocked()
            assert server.held.total >= 4 * 32 * KIB
            held.gate.set()
            await client_end.send_eof()
            await trio.testing.wait_all_tasks_blocked()
            assert server.held.total == 0 and server.held.accounts == 0
            nursery.cancel_scope.cancel()


def test_past_the_common_half_only_a_connection_within_its_share_goes_ahead() -> None:
    limit = 1000
    assert admits(total=400, held=400, size=100, connections=5, limit=limit)
    assert not admits(total=450, held=450, size=100, connections=5, limit=limit)
    # The other half over five connections: 100 each.
    assert admits(total=950, held=0, size=100, connections=5, limit=limit)
    assert not admits(total=950, held=1, size=100, connections=5, limit=limit)


async def test_a_waiter_past_its_share_goes_ahead_once_another_lets_go() -> None:
    budget = HeldBudget(1000)
    first, hog, other = budget.open(), budget.open(), budget.open()
    for account in (first, hog, other):
        account.charge(200)
    went = trio.Event()

    async def waiter() -> None:
        await hog.wait_room(100)
        went.set()

    with trio.fail_after(5):
        await first.wait_room(100)  # the first to wait takes the overdraft
        assert budget.overdraft is first
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert not went.is_set()
            other.close()
            await went.wait()
            # The total is back within the common half: taken back from its holder.
            assert budget.overdraft is None


async def test_clients_that_all_stop_inside_big_frames_each_finish_them_in_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Sixteen frames of 192 KiB against a limit of 1 MiB, read 64 KiB at a
    # time from each: all sixteen stopped past their share inside their
    # frames, and none could finish one (a finished frame is what lets its
    # bytes go): every client waited for ever. The first to wait now takes
    # the overdraft and reads on; it is taken back once that connection is
    # within the rules again (its frame finished), and the next waiter takes it.
    # (The mock clock only makes a hang fail at once.)
    server = Server(lambda conn: Held().table(), max_held_bytes=LIMIT)
    answers: list[str] = []

    async def big_ping(client_end: trio.testing.MemoryStapledStream) -> None:
        answers.append(await Client(client_end).result("ping", {"pad": "x" * (192 * KIB)}))

    with trio.fail_after(30):
        async with trio.open_nursery() as servers:
            async with trio.open_nursery() as clients:
                for _ in range(16):
                    client_end, server_end = trio.testing.memory_stream_pair()
                    servers.start_soon(server.serve, server_end, server_end)
                    clients.start_soon(big_ping, client_end)
            servers.cancel_scope.cancel()
    assert answers == ["pong"] * 16
    # Within the limit, but for a read past its share for each, and one
    # frame being finished past its connection's share.
    assert server.held.peak <= LIMIT + 16 * 64 * KIB + 192 * KIB


async def test_a_connection_cancelled_while_waiting_for_a_slot_leaves_no_share_behind() -> None:
    # Its account was opened before it waited, and closed only once it was
    # refused or served: cancelled in between (a stop), it counted among the
    # connections for good, and every other connection's share shrank.
    server = Server(lambda conn: Held().table(), max_held_bytes=LIMIT, max_connections=1)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            first_end, first_server = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, first_server, first_server)
            assert await Client(first_end).result("ping", {}) == "pong"
            waiting = trio.CancelScope()

            async def second() -> None:
                _, server_end = trio.testing.memory_stream_pair()
                with waiting:
                    await server.serve(server_end, server_end)

            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            waiting.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert server.held.accounts == 1
            assert server.held.share() == LIMIT // 2
            nursery.cancel_scope.cancel()


async def test_the_overdraft_is_handed_on_once_its_holder_is_within_the_rules() -> None:
    budget = HeldBudget(1000)
    first, second = budget.open(), budget.open()
    first.charge(400)
    second.charge(400)
    went = trio.Event()

    async def waiter() -> None:
        await second.wait_room(100)
        went.set()

    with trio.fail_after(5):
        await first.wait_room(100)
        first.charge(100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert not went.is_set()
            first.discharge(100)  # still past its share: it keeps it
            await trio.testing.wait_all_tasks_blocked()
            assert not went.is_set()
            first.discharge(200)  # within its share (250): handed on
            await went.wait()
            assert budget.overdraft is second


async def test_two_clients_each_half_through_a_frame_past_their_shares_are_both_answered() -> None:
    # Each read its frame a chunk at a time until both were past their shares
    # and the common half was full: neither read on, so neither frame ever
    # finished and nothing either held was ever let go.
    server = Server(lambda conn: Held().table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            clients = []
            for _ in range(2):
                client_end, server_end = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve, server_end, server_end)
                clients.append(Client(client_end))
            answers: list[str] = []

            async def ping(client: Client) -> None:
                answers.append(await client.result("ping", {"pad": "x" * (400 * KIB)}))

            async with trio.open_nursery() as pings:
                for client in clients:
                    pings.start_soon(ping, client)
            assert answers == ["pong", "pong"]
            # Past the limit by one connection's frame at most, not by one each.
            assert server.held.peak <= LIMIT + 400 * KIB + 64 * KIB
            nursery.cancel_scope.cancel()


async def test_a_lone_client_request_past_half_the_limit_is_answered() -> None:
    # The connection waited for room that only it held: its frame, then its
    # request, never went ahead, and the connection never read again.
    server = Server(lambda conn: Held().table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            client = Client(client_end)
            assert await client.result("ping", {"pad": "x" * (600 * KIB)}) == "pong"
            assert await client.result("ping", {}) == "pong"
            await client_end.send_eof()
            await trio.testing.wait_all_tasks_blocked()
            assert server.held.total == 0 and server.held.overdraft is None
            nursery.cancel_scope.cancel()


async def test_the_overdraft_is_handed_on_once_a_close_grows_its_holders_share() -> None:
    # The holder came within the rules when a connection holding nothing
    # closed (one share fewer to divide), but the overdraft was taken back
    # only at a release: with none to come, the other waiter waited for good
    # behind a holder that no longer needed it.
    budget = HeldBudget(1000)
    holder, waiter, idle = budget.open(), budget.open(), budget.open()
    holder.charge(240)  # past its share of three (166), within one of two (250)
    waiter.charge(280)  # past both, and the total (520) past the common half
    went = trio.Event()

    async def wait() -> None:
        await waiter.wait_room(1)
        went.set()

    with trio.fail_after(5):
        await holder.wait_room(1)
        assert budget.overdraft is holder
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not went.is_set()
            idle.close()
            await went.wait()
            assert budget.overdraft is waiter


async def test_the_overdraft_of_a_connection_that_closes_goes_to_a_waiter() -> None:
    budget = HeldBudget(1000)
    holder, waiter = budget.open(), budget.open()
    holder.charge(400)
    waiter.charge(400)
    went = trio.Event()

    async def wait() -> None:
        await waiter.wait_room(1)
        went.set()

    with trio.fail_after(5):
        await holder.wait_room(1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not went.is_set()
            holder.close()
            await went.wait()
            assert budget.overdraft is None  # within the rules once alone


async def test_a_client_past_its_share_waits_while_a_client_reading_nothing_holds_the_overdraft(
) -> None:
    # The worst case the overdraft leaves (rpc/held, docs/wire.md): its
    # holder keeps it while it is past the rules, and one whose peer reads
    # none of its answers stays past them, so another client stopped inside
    # a frame past its share waits as long as that one stays connected.
    held = Held()
    server = Server(lambda conn: held.table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            hog_end, hog_server = trio.testing.memory_stream_pair()
            stalled = StalledStream(hog_server)
            hog = trio.CancelScope()

            async def serve_hog() -> None:
                with hog:
                    await server.serve(stalled, stalled)

            nursery.start_soon(serve_hog)
            # 256 answers of 4 KiB: past the common half and its share.
            await hog_end.send_all(b"".join(rpc(n, "page", {}) for n in range(256)))
            await trio.testing.wait_all_tasks_blocked()
            overdraft = server.held.overdraft
            assert overdraft is not None
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, server_end, server_end)
            answered = trio.Event()

            async def big_ping() -> None:
                assert await Client(client_end).result("ping", {"pad": "x" * (400 * KIB)}) == "pong"
                answered.set()

            nursery.start_soon(big_ping)
            await trio.testing.wait_all_tasks_blocked()
            assert not answered.is_set() and server.held.overdraft is overdraft
            hog.cancel()  # its connection ends (a hang-up breaks its writes)
            await answered.wait()
            nursery.cancel_scope.cancel()


async def test_a_client_past_its_share_waits_while_the_overdraft_holder_keeps_requests_that_last(
) -> None:
    # The other worst case: requests that last (watches, whose params are
    # held for their life) keep their connection past the rules once it took
    # the overdraft, though its client behaves; the others past their shares
    # wait until those requests end.
    held = Held()
    server = Server(lambda conn: held.table(), max_held_bytes=LIMIT)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            a_end, a_server = trio.testing.memory_stream_pair()
            b_end, b_server = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve, a_server, a_server)
            nursery.start_soon(server.serve, b_server, b_server)
            await a_end.send_all(b"".join(held_params(n) for n in range(20)))  # 640 KiB
            await trio.testing.wait_all_tasks_blocked()
            assert held.started == 20
            overdraft = server.held.overdraft
            assert overdraft is not None
            answered = trio.Event()

            async def big_ping() -> None:
                assert await Client(b_end).result("ping", {"pad": "y" * (400 * KIB)}) == "pong"
                answered.set()

            nursery.start_soon(big_ping)
            await trio.testing.wait_all_tasks_blocked()
            assert not answered.is_set() and server.held.overdraft is overdraft
            held.gate.set()  # the requests that lasted end
            await answered.wait()
            nursery.cancel_scope.cancel()
