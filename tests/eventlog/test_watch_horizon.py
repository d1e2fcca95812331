"""Retention keeps what a JSON-RPC watch's client has not been given."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from support.eventlog import ev, mocked, take
from support.rpc_client import Client

from streamd.eventlog.model import Filter
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Server


async def test_a_watch_ended_by_a_stalled_client_resumes_with_nothing_removed_under_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with mocked(tmp_path / "events.db", watch_buffer_bytes=16 * 1024,
                      watch_stall_timeout=30) as log:
        for i in range(200):
            await log.append("app", "u", "s", ev(f"e{i}", "x" * 500))
        methods = {m.name: m for m in eventlog_methods(lambda: log)}
        # No buffer between the two ends: what the client does not read
        # stays with the daemon's connection.
        client_end, server_end = trio.testing.lockstep_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Server(lambda conn: methods).serve, server_end, server_end)
            watcher = Client(client_end)
            await watcher.start("eventlog/watch", {"from_seq": 0})
            # The watch has taken a batch it cannot send: the client reads nothing.
            await trio.testing.wait_all_tasks_blocked()
            await log.set_retention("app", max_events=1)
            compacted = await log.compact("app")
            await trio.sleep(60)  # virtual: the stall timeout passes, the watch ends
            given = []
            while "method" in (frame := await watcher.frame()):
                given.append(frame["params"]["entry"]["seq"])
            assert frame["error"]["code"] == -32006, frame
            last = frame["error"]["data"]["last_seq"]
            assert given == list(range(1, last + 1))
            # Nothing after what the client was given was removed ...
            assert compacted.keep_after_seq is not None and compacted.keep_after_seq <= last
            # ... so resuming where the error said loses nothing.
            await watcher.start("eventlog/watch", {"from_seq": last})
            frame = await watcher.frame()
            assert frame["params"]["entry"]["seq"] == last + 1, (last, frame)
            nursery.cancel_scope.cancel()


async def test_a_watch_whose_filter_matches_nothing_holds_back_no_retention(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A dashboard tailing one quiet session held back retention of the whole
    # log: its position was what it had sent (nothing), so no event of any
    # app after its from_seq was ever removed while it stayed open.
    async with mocked(tmp_path / "events.db") as log:
        await log.append("quiet", "u", "s", ev("q0", "old"))
        async with log.watch(0, Filter(app="quiet")) as quiet:
            assert [e.event.id for e in await take(quiet, 1)] == ["q0"]
            for i in range(50):
                await log.append("busy", "u", "s", ev(f"e{i}", "x"))
            await log.set_retention("busy", max_events=2)
            compacted = await log.compact("busy")
            assert compacted.events_deleted == 48, compacted
            assert compacted.keep_after_seq == 51
            # It still gets what it matches, once.
            await log.append("quiet", "u", "s", ev("q1", "new"))
            assert [e.event.id for e in await take(quiet, 1)] == ["q1"]


async def test_a_filtered_watch_still_keeps_the_match_its_consumer_has_not_taken(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with mocked(tmp_path / "events.db") as log, log.watch(0, Filter(author="a")) as w:
        await trio.testing.wait_all_tasks_blocked()
        for i in range(20):
            await log.append("app", "u", "s", ev(f"e{i}", "x", author="a" if i == 5 else "b"))
        await trio.testing.wait_all_tasks_blocked()
        await log.set_retention("app", max_events=1)
        compacted = await log.compact("app")
        # e5 (seq 6) is buffered, not taken: nothing from it on is removed.
        assert compacted.keep_after_seq == 5, compacted
        assert [(e.seq, e.event.id) for e in await take(w, 1)] == [(6, "e5")]
