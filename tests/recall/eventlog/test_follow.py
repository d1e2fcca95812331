"""The source's own tasks: the follower keeps the index warm, a replaced log is read anew."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from streamd.eventlog import EventLog
from streamd.recall.eventlog.settings import LogSettings
from streamd.recall.eventlog.source import LogSource

from .conftest import say


async def caught_up(source: LogSource, seq: int) -> None:
    while source.generation is None or source.generation.seq < seq:
        await source.next_publication()


async def test_commits_reach_the_index_without_a_request(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
        await say(log, "e1", "one")
        source = LogSource(log.requests, LogSettings(), str(work))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(source.run)
            with trio.fail_after(10):
                first = await source.current()
                assert first.seq == 1
                rounds = source.rounds
                await say(log, "e2", "two")
                await say(log, "e3", "three")
                # Nobody asks: the follower's watch wakes the builder.
                await caught_up(source, 3)
            assert source.rounds > rounds
            assert source.generation is not None and source.generation.indexed == 3
            nursery.cancel_scope.cancel()


async def test_a_log_replaced_under_the_source_is_indexed_anew(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    async with (
        EventLog(tmp_path / "a.db", synchronous="NORMAL") as old,
        EventLog(tmp_path / "b.db", synchronous="NORMAL") as new,
    ):
        for i in range(3):
            await say(old, f"old{i}", "old")
        await say(new, "new0", "new")
        source = LogSource(old.requests, LogSettings(), str(work))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(source.run)
            with trio.fail_after(10):
                assert (await source.current()).seq == 3
                # As a restore from an older backup looks: fewer seqs than read.
                source.requests = new.requests
                generation = await source.current()
            assert (generation.seq, generation.indexed) == (1, 1)
            assert generation.view.index.ids == ["new0"]
            assert generation.gen > 1  # names continue: gen-1 was the old log's
            nursery.cancel_scope.cancel()


async def test_a_saved_index_of_another_log_is_not_adopted(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    async with EventLog(tmp_path / "a.db", synchronous="NORMAL") as a:
        await say(a, "a1", "x")
        await say(a, "a2", "x")
        source = LogSource(a.requests, LogSettings(), str(work))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(source.run)
            with trio.fail_after(10):
                await source.current()
            nursery.cancel_scope.cancel()  # the last save is made as it stops
    saved = json.loads((work / "index" / "manifest.json").read_text())
    assert (saved["records"], saved["eventlog"]["seq"], saved["eventlog"]["last_id"]) == (
        2, 2, "a2")
    async with EventLog(tmp_path / "b.db", synchronous="NORMAL") as b:
        await say(b, "b1", "x")
        await say(b, "b2", "x")  # the same seqs, other events
        source = LogSource(b.requests, LogSettings(), str(work))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(source.run)
            with trio.fail_after(10):
                generation = await source.current()
            assert generation.view.index.ids == ["b1", "b2"]  # built, not adopted
            assert generation.gen == 2  # named after the saved gen-1, never gen-1 again
            nursery.cancel_scope.cancel()
