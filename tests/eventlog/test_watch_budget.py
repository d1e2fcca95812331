"""The budget all of a log's watches share, and the watches a connection may open.

Counted, never timed: what the budget holds, which watches gave way, and the
seqs each consumer was given before its error. The log's own watch budget is
small here (64 KiB) so that a few watches pass the shared one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import ev, mocked
from support.rpc_client import Client

from streamd.errors import BUDGET_EXCEEDED, RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.service import eventlog_methods
from streamd.eventlog.watch_budget import WatchBudget
from streamd.rpc import Server

BUDGET = 64 * 1024
ENTRY = "x" * 8_000  # about 8.2 KB on the wire


class Holder:
    def __init__(self, budget: WatchBudget) -> None:
        self.budget = budget
        self.held_bytes = 0
        self.gave_way: tuple[int, int] | None = None
        budget.join(self)

    def hold(self, n: int) -> None:
        self.held_bytes += n
        self.budget.add(n)

    def give_way(self, total: int, limit: int) -> None:
        self.gave_way = (total, limit)
        self.held_bytes = 0


def test_past_the_limit_the_one_holding_the_most_gives_way_until_the_sum_is_within_it() -> None:
    budget = WatchBudget(100)
    a, b, c = Holder(budget), Holder(budget), Holder(budget)
    a.hold(30)
    b.hold(50)
    c.hold(20)
    assert budget.total == 100 and not (a.gave_way or b.gave_way or c.gave_way)
    c.hold(25)  # 125: b, holding the most (50), gives way; 75 is within the limit
    assert (a.gave_way, b.gave_way, c.gave_way) == (None, (125, 100), None)
    assert budget.total == 75 and len(budget) == 2
    a.hold(100)  # 175: a (130) gives way, and c alone is within it
    assert a.gave_way == (175, 100) and c.gave_way is None
    assert budget.total == 45
    c.hold(-45)
    budget.leave(c)
    assert budget.total == 0 and len(budget) == 0


async def fill(log: EventLog, count: int) -> None:
    for i in range(count):
        await log.append("app", "u", "s", ev(f"e{i}", ENTRY))


async def test_unread_watches_hold_at_most_the_shared_budget_and_the_one_that_gave_way_resumes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    limit = 3 * BUDGET
    with trio.fail_after(600):
        async with mocked(tmp_path / "events.db", watch_buffer_bytes=BUDGET,
                          watch_total_bytes=limit, watch_stall_timeout=3600) as log:
            await fill(log, 40)
            # Six watches from the start, none read: each would hold its 64 KiB.
            watches = [log.watch(0) for _ in range(6)]
            await trio.testing.wait_all_tasks_blocked()
            assert log.watch_budget.total <= limit
            assert sum(w.held_bytes for w in watches) == log.watch_budget.total
            gave_way = [w for w in watches if w.gave_way.is_set()]
            kept = [w for w in watches if not w.gave_way.is_set()]
            assert len(gave_way) >= 3 and len(kept) >= 1
            assert len(log.watch_budget) == len(kept)
            for w in gave_way:
                # What it held is dropped: its consumer gets the error at once,
                # naming where it resumes (nothing was handed out: the start).
                assert (w.held_bytes, w.buffered) == (0, 0)
                with pytest.raises(RpcError) as raised:
                    await w.__anext__()
                err = raised.value
                assert err.code == BUDGET_EXCEEDED and err.data["last_seq"] == 0
                assert "from_seq=0" in err.message
                assert err.data["total_bytes"] > limit == err.data["budget_bytes"]
            # What a watch that gave way missed is in the log: resuming loses nothing.
            assert gave_way[0].error is not None
            async with log.watch(gave_way[0].error.data["last_seq"]) as again:
                assert [(await again.__anext__()).seq for _ in range(40)] == list(range(1, 41))
            for w in watches:
                await w.aclose()
            assert log.watch_budget.total == 0 and len(log.watch_budget) == 0


async def test_a_watch_whose_consumer_keeps_up_is_not_the_one_to_give_way(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with (
            mocked(tmp_path / "events.db", watch_buffer_bytes=BUDGET,
                   watch_total_bytes=2 * BUDGET, watch_stall_timeout=3600) as log,
            log.watch(0) as reader,
        ):
            stalled = [log.watch(0) for _ in range(3)]
            got: list[int] = []
            for i in range(40):
                await log.append("app", "u", "s", ev(f"e{i}", ENTRY))
                got.append((await reader.__anext__()).seq)
                assert log.watch_budget.total <= 2 * BUDGET
            assert got == list(range(1, 41)) and not reader.gave_way.is_set()
            assert any(w.gave_way.is_set() for w in stalled)
            for w in stalled:
                await w.aclose()


async def test_a_json_rpc_watch_gives_way_while_its_send_waits_and_names_the_last_seq_sent(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A JSON-RPC watch reads ahead an eighth of its budget (one 8 KB entry
    # here) and queues up to the rest on its connection. Its client reads
    # nothing: once the connection is full, the watch holds a batch it cannot
    # send and a buffered entry, 16 KB, past a shared budget of 12 KiB.
    limit = 12 * 1024
    with trio.fail_after(600):
        async with mocked(tmp_path / "events.db", watch_buffer_bytes=BUDGET,
                          watch_total_bytes=limit, watch_stall_timeout=3600) as log:
            await fill(log, 60)
            methods = {m.name: m for m in eventlog_methods(lambda: log)}
            # No buffer between the two ends: what the client does not read
            # stays with the daemon's connection.
            client_end, server_end = trio.testing.lockstep_stream_pair()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(Server(lambda conn: methods).serve, server_end, server_end)
                watcher = Client(client_end)
                watch_id = await watcher.start("eventlog/watch", {"from_seq": 0})
                await trio.testing.wait_all_tasks_blocked()
                # Ended while its client still reads nothing: it counts no more.
                assert (log.watch_budget.total, len(log.watch_budget)) == (0, 0)
                given = []
                while "method" in (frame := await watcher.frame()):
                    given.append(frame["params"]["entry"]["seq"])
                assert frame["id"] == watch_id
                error = frame["error"]
                assert error["code"] == BUDGET_EXCEEDED, error
                # What its client was sent, in order, and the error names the
                # last of it: not what the watch had read ahead.
                last = error["data"]["last_seq"]
                assert last > 0 and given == list(range(1, last + 1))
                assert f"from_seq={last}" in error["message"]
                assert error["data"]["held_bytes"] > limit
                # Resuming there loses nothing.
                await watcher.start("eventlog/watch", {"from_seq": last})
                assert (await watcher.frame())["params"]["entry"]["seq"] == last + 1
                nursery.cancel_scope.cancel()


async def test_a_connection_may_have_64_watches_open_and_one_more_is_refused_by_its_id(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            methods = {m.name: m for m in eventlog_methods(lambda: log)}
            server = Server(lambda conn: methods)
            async with trio.open_nursery() as nursery:
                clients = []
                for _ in range(2):
                    client_end, server_end = trio.testing.memory_stream_pair()
                    nursery.start_soon(server.serve, server_end, server_end)
                    clients.append(Client(client_end))
                first, other = clients
                ids = [await first.start("eventlog/watch", {"from_seq": 0}) for _ in range(64)]
                await trio.testing.wait_all_tasks_blocked()
                extra = await first.start("eventlog/watch", {"from_seq": 0})
                other_id = await other.start("eventlog/watch", {"from_seq": 0})
                await log.append("app", "u", "s", ev("e0"))
                # Every watch open on the connection is given the entry; the
                # one past the limit is answered instead (it was served before).
                watching: list[Any] = []
                while len(watching) < 64 or extra not in first.responses:
                    frame = await first.frame()
                    if "method" in frame:
                        watching.append(frame["params"]["watch"])
                        assert len(watching) <= 64, "a watch past the limit was served"
                    else:
                        first.responses[frame["id"]] = frame
                assert sorted(watching) == ids
                refused = first.responses.pop(extra)["error"]
                assert refused["code"] == BUDGET_EXCEEDED
                assert refused["data"] == {"reason": "too_many_watches", "limit": 64,
                                           "last_seq": 0}
                # Another connection's count is its own.
                assert (await other.notification())["params"]["watch"] == other_id
                # One ended, one more may open.
                await first.send({"jsonrpc": "2.0", "method": "$/cancelRequest",
                                  "params": {"id": ids[0]}})
                assert (await first.response(ids[0]))["error"]["code"] == -32007
                again = await first.start("eventlog/watch", {"from_seq": 0})
                assert (await first.notification())["params"]["watch"] == again
                nursery.cancel_scope.cancel()
