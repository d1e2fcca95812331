"""The watch fan-out: this process's commits reach caught-up watches from memory.

The first half drives :class:`Fanout` with plain values (no loop, no store):
its one rule is that entries are handed over only when the commit provably
follows everything already handed over. The second half checks the claims on
a real log: a live watch costs no store read, another process's commit and a
full buffer send a watch back to the store, and nothing is lost or repeated.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.eventlog import ev, mocked, take

from streamd.eventlog import AppendParams, EventLog, Filter, SqliteStore
from streamd.eventlog.fanout import Fanout
from streamd.eventlog.log import SAFETY_POLL
from streamd.eventlog.model import EntryNotification
from streamd.eventlog.service import ENTRY_NOTIFICATION
from streamd.eventlog.store import CommitOutcome, Committed
from streamd.rpc import encode_notification


def committed(seq: int, session: str = "s") -> Committed:
    return Committed(seq, "app", "u", session, "", "agent", b'{"seq":%d}' % seq)


def outcome(before: int, after: int, *, captured: bool = True) -> CommitOutcome:
    entries = [committed(s) for s in range(before + 1, after + 1)] if captured else None
    return CommitOutcome(results=[], before_seq=before, after_seq=after, entries=entries)


class Recorder:
    def __init__(self) -> None:
        self.got: list[int] = []
        self.drops = 0

    def deliver(self, entries: Sequence[Committed], nbytes: int) -> None:
        assert nbytes == sum(len(c.wire) for c in entries)
        self.got += [c.seq for c in entries]

    def dropped(self) -> None:
        self.drops += 1


def test_the_first_commit_drops_everyone_because_nothing_before_it_is_known() -> None:
    fan, sub = Fanout(), Recorder()
    fan.subscribe(sub)
    fan.committed(outcome(4, 6))
    assert (sub.got, sub.drops, fan.tail, fan.subscribers) == ([], 1, 6, 0)


def test_a_commit_that_follows_the_tail_is_handed_to_every_subscriber() -> None:
    fan, a, b = Fanout(), Recorder(), Recorder()
    fan.committed(outcome(0, 2))
    fan.subscribe(a)
    fan.subscribe(b)
    fan.committed(outcome(2, 5))
    fan.committed(outcome(5, 6))
    assert a.got == b.got == [3, 4, 5, 6]
    assert (a.drops, fan.tail) == (0, 6)


def test_a_commit_after_someone_elses_drops_everyone_and_moves_the_tail() -> None:
    fan, sub = Fanout(), Recorder()
    fan.committed(outcome(0, 2))
    fan.subscribe(sub)
    fan.committed(outcome(3, 4))  # seq 3 was another process's
    assert (sub.got, sub.drops, fan.tail, fan.subscribers) == ([], 1, 4, 0)
    again = Recorder()
    fan.subscribe(again)
    fan.committed(outcome(4, 5))
    assert again.got == [5]


def test_a_commit_without_captured_entries_drops_everyone() -> None:
    fan, sub = Fanout(), Recorder()
    fan.committed(outcome(0, 1))
    fan.subscribe(sub)
    fan.committed(outcome(1, 3, captured=False))
    assert (sub.got, sub.drops, fan.tail) == ([], 1, 3)


def test_a_commit_of_only_duplicates_keeps_everyone() -> None:
    fan, sub = Fanout(), Recorder()
    fan.committed(outcome(0, 1))
    fan.subscribe(sub)
    fan.committed(outcome(1, 1))
    assert (sub.got, sub.drops, fan.subscribers) == ([], 0, 1)


def test_an_external_seq_past_the_tail_drops_everyone_and_one_at_it_drops_nobody() -> None:
    fan, sub = Fanout(), Recorder()
    fan.committed(outcome(0, 3))
    fan.subscribe(sub)
    fan.external(3)
    assert (sub.drops, fan.subscribers) == (0, 1)
    fan.external(7)
    assert (sub.drops, fan.subscribers, fan.tail) == (1, 0, 7)


def test_entry_frames_are_the_bytes_of_an_encoded_notification() -> None:
    from streamd.eventlog.service import _EntryFrames

    entry = b'{"seq":7,"app":"a"}'
    for watch_id in (3, "w\x00\"splice", '\x00splice\x00'):
        frames = _EntryFrames(watch_id)
        expected = encode_notification(
            ENTRY_NOTIFICATION, EntryNotification(watch=watch_id, entry=msgspec.Raw(entry))
        )
        c = Committed(7, "a", "u", "s", "", "x", entry)
        assert frames.encode([c]) == expected
        assert frames.encode([c, c, c]) == expected * 3
    assert expected.startswith(b'{"jsonrpc":"2.0","method":"eventlog/entry","params":{"watch":')


# --- on a real log ---------------------------------------------------------------


@pytest.fixture
def open_mocked(tmp_path: Path) -> Callable[..., EventLog]:
    return functools.partial(mocked, tmp_path / "events.db")


def count_calls(store: Any, name: str) -> list[int]:
    counter = [0]
    real = getattr(store, name)

    def counted(*args: Any) -> Any:
        counter[0] += 1
        return real(*args)

    setattr(store, name, counted)
    return counter


async def test_a_live_watch_gets_this_processs_commits_without_reading_the_store(
    open_mocked: Callable[..., EventLog], autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_interval=3600) as log:
            await log.append("app", "u", "s", ev("e0"))
            reader = log.connections.reader
            assert isinstance(reader, SqliteStore)
            reads = count_calls(reader, "since_committed")
            async with log.watch(0) as w:
                await take(w, 1)
                # The first commit this log sees is not known to follow
                # anything, so the watch rereads once; after that, memory.
                await log.append("app", "u", "s", ev("e1"))
                await take(w, 1)
                await trio.testing.wait_all_tasks_blocked()
                assert w.live
                settled = reads[0]
                for i in range(2, 50):
                    await log.append("app", "u", "s", ev(f"e{i}"))
                got = await take(w, 48)
                assert [e.event.id for e in got] == [f"e{i}" for i in range(2, 50)]
                assert reads[0] == settled <= 3


async def test_an_entry_from_memory_is_the_entry_a_replay_reads(
    open_mocked: Callable[..., EventLog], autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_interval=3600) as log:
            await log.append("app", "u", "s", ev("e0"))
            async with log.watch(0) as w:
                await take(w, 1)
                await log.append("app", "u", "s", ev("warm-up"))
                await take(w, 1)
                await trio.testing.wait_all_tasks_blocked()
                assert w.live
                await log.append(
                    "app", "u", "s", ev("e1", {"k": ["é", 1.5]}, branch="b.c"), {"m": "1"}
                )
                (live,) = await take(w, 1)
            replay = (await log.since(live.seq - 1, limit=1)).entries[0]
            assert msgspec.json.encode(live) == msgspec.json.encode(replay)


async def test_another_processs_commit_between_ours_reaches_the_watch_in_seq_order(
    open_mocked: Callable[..., EventLog], autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_interval=3600) as log:
            await log.append("app", "u", "s", ev("warm-up"))
            other = SqliteStore.open(str(tmp_path / "events.db"))  # like another process
            try:
                async with log.watch(0) as w:
                    await take(w, 1)
                    await log.append("app", "u", "s", ev("ours-1"))
                    await take(w, 1)
                    await trio.testing.wait_all_tasks_blocked()
                    assert w.live
                    # No poll will run within the test (an hour's interval): only
                    # our next commit's before_seq can reveal the other's row.
                    other.append(AppendParams(app="app", user="u", session="s",
                                              event=ev("theirs")), 0)
                    await log.append("app", "u", "s", ev("ours-2"))
                    got = await take(w, 2)
            finally:
                other.close()
    assert [e.event.id for e in got] == ["theirs", "ours-2"]
    assert got[0].seq + 1 == got[1].seq


async def test_a_live_watch_whose_consumer_falls_behind_catches_up_from_the_store(
    open_mocked: Callable[..., EventLog], autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with open_mocked(watch_interval=3600, watch_buffer=4) as log:
            await log.append("app", "u", "s", ev("warm-up"))
            async with log.watch(0, Filter(session="s")) as w:
                await take(w, 1)
                await log.append("app", "u", "s", ev("e0"))
                await take(w, 1)
                await trio.testing.wait_all_tasks_blocked()
                assert w.live
                # 30 entries with nobody reading: 4 fit, the rest wait in the store.
                for i in range(1, 31):
                    await log.append("app", "u", "s" if i % 3 else "other", ev(f"e{i}"))
                assert w.buffered <= 4
                got = await take(w, 20)
                await trio.testing.wait_all_tasks_blocked()
                assert w.live  # caught up again, and joined the fan-out
                await log.append("app", "u", "s", ev("after"))
                got += await take(w, 1)
    assert [e.event.id for e in got] == [f"e{i}" for i in range(1, 31) if i % 3] + ["after"]


class _Silent:
    """A change source that never wakes: a notification that was lost."""

    def expect_commit(self) -> None:
        pass

    async def wait(self) -> None:
        await trio.sleep_forever()


@asynccontextmanager
async def _silent() -> AsyncIterator[_Silent]:
    yield _Silent()


async def test_a_commit_no_notification_reported_is_seen_by_the_safety_check(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        async with mocked(tmp_path / "events.db", open_changes=_silent) as log:
            await log.append("app", "u", "s", ev("ours"))
            other = SqliteStore.open(str(tmp_path / "events.db"))
            try:
                async with log.watch(0) as w:
                    await take(w, 1)
                    await trio.testing.wait_all_tasks_blocked()
                    start = trio.current_time()
                    other.append(AppendParams(app="app", user="u", session="s",
                                              event=ev("theirs")), 0)
                    (entry,) = await take(w, 1)
            finally:
                other.close()
    assert entry.event.id == "theirs"
    assert trio.current_time() - start <= SAFETY_POLL + 1e-6


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    commits=st.lists(
        st.lists(st.integers(0, 3_000), min_size=1, max_size=6), min_size=1, max_size=8
    ),  # the content sizes of each commit's events
    budget=st.integers(1, 12_000) | st.just(100_000),
    capacity=st.integers(1, 10),
)
# The edges: a commit one entry past the capacity, and one just past the budget.
@example(commits=[[10, 10], [10, 10]], budget=100_000, capacity=3)
@example(commits=[[10], [10]], budget=300, capacity=10)
async def test_a_whole_log_watch_takes_a_commit_at_once_exactly_as_one_by_one_would(
    tmp_path_factory: pytest.TempPathFactory,
    commits: list[list[int]],
    budget: int,
    capacity: int,
) -> None:
    # A whole-log watch takes a commit that fits in one step; a filter that
    # matches everything takes the same entries one by one, which is the
    # definition. After every commit both must hold the same entries, the same
    # bytes, and be live or sent back to the store alike.
    path = tmp_path_factory.mktemp("bulk") / "events.db"
    with trio.fail_after(600):
        async with mocked(
            path, watch_interval=3600, watch_buffer=capacity, watch_buffer_bytes=budget
        ) as log:
            await log.append("app", "u", "s", ev("warm-up"))
            whole, everything = log.watch(0), log.watch(0, Filter())
            async with whole, everything:
                await take(whole, 1)
                await take(everything, 1)
                await log.append("app", "u", "s", ev("joined"))  # the first is reread
                await take(whole, 1)
                await take(everything, 1)
                await trio.testing.wait_all_tasks_blocked()
                assert whole.live and everything.live
                for n, sizes in enumerate(commits):
                    await log.append_batch([
                        AppendParams(app="app", user="u", session="s",
                                     event=ev(f"c{n}-{i}", "x" * size))
                        for i, size in enumerate(sizes)
                    ])
                    seen = [
                        (w.buffered, w.buffered_bytes, w.live) for w in (whole, everything)
                    ]
                    assert seen[0] == seen[1], (n, seen)
                    assert seen[0][1] <= budget or seen[0][0] == 1
                    # Drain both (and let a watch sent back to the store catch up),
                    # so the next commit meets an empty buffer or a full one alike.
                    if n % 2:
                        await take(whole, whole.buffered)
                        await take(everything, everything.buffered)
                        await trio.testing.wait_all_tasks_blocked()


async def test_a_sink_takes_live_commits_only_while_the_consumer_waits_on_nothing(
    open_mocked: Callable[..., EventLog], autojump_clock: trio.testing.MockClock
) -> None:
    # The sink is the JSON-RPC watch's shortcut past its consumer's wake. It
    # may take a commit only when nothing is buffered ahead of it and the
    # consumer is waiting; a commit it refuses, or one that comes while the
    # consumer is busy, goes to the buffer, in order.
    sunk: list[int] = []
    accept = [True]

    def sink(entries: Sequence[Committed], nbytes: int) -> bool:
        assert nbytes == sum(len(c.wire) for c in entries)
        if accept[0]:
            sunk.extend(c.seq for c in entries)
        return accept[0]

    with trio.fail_after(600):
        async with open_mocked(watch_interval=3600) as log:
            await log.append("app", "u", "s", ev("warm-up"))
            async with log.watch(0) as w:
                await take(w, 1)
                await log.append("app", "u", "s", ev("joined"))  # the first is reread
                await take(w, 1)
                w.sink(sink)
                got: list[int] = []

                async def consume() -> None:
                    while True:
                        batch, _ = await w.receive_batch()
                        got.extend(c.seq for c in batch)

                async with trio.open_nursery() as nursery:
                    # Not waiting yet: the commit is buffered, not sunk.
                    first = (await log.append("app", "u", "s", ev("buffered"))).seq
                    assert (sunk, w.buffered) == ([], 1)
                    nursery.start_soon(consume)
                    await trio.testing.wait_all_tasks_blocked()
                    assert got == [first]
                    # Waiting on an empty buffer: sunk, and the consumer sleeps on.
                    seqs = [r.seq for r in await log.append_batch([
                        AppendParams(app="app", user="u", session="s", event=ev(f"b{i}"))
                        for i in range(3)
                    ])]
                    await trio.testing.wait_all_tasks_blocked()
                    assert (sunk, got, w.last_seq) == (seqs, [first], seqs[-1])
                    # Refused: the consumer gets it.
                    accept[0] = False
                    refused = (await log.append("app", "u", "s", ev("refused"))).seq
                    await trio.testing.wait_all_tasks_blocked()
                    assert (sunk, got) == (seqs, [first, refused])
                    # Two commits in one step, the first refused: the consumer is
                    # woken but has not run, so the second may not overtake it.
                    w.deliver([committed(refused + 1)], len(committed(refused + 1).wire))
                    accept[0] = True
                    w.deliver([committed(refused + 2)], len(committed(refused + 2).wire))
                    await trio.testing.wait_all_tasks_blocked()
                    assert (sunk, got[-2:]) == (seqs, [refused + 1, refused + 2])
                    nursery.cancel_scope.cancel()
