"""Requests whose params make them costly: served off the event loop, stopped
when their request ends, and never able to take the process down.

At a million records a query of 100,000 terms took 39 s of ranking, one term
repeated 100,000 times 86 s, and a ``context`` expand whose window holds
100,000 records 2.7 s; all of it ran on the event loop, so nothing else was
answered meanwhile and a cancel was read only once it was over (114 s for
the -32007; the reference answers it in 40 ms). The stalls here are made
by gates the test opens, never by sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio
import trio.testing
from support.recall import (
    error,
    health,
    initialized,
    req,
    search,
    session,
)
from support.recall_proc import spawn

from streamd.recall import answers as answers_module
from streamd.recall.answers import Answers
from streamd.recall.index import native
from streamd.recall.index.streamfile import read_spans
from streamd.recall.oneshot import open_adapter
from streamd.recall.query.rank import Query, rank
from streamd.recall.scanner import ANSWER_THREADS
from streamd.recall.stop import Stop, Stopped
from streamd.recall.wire import ExpandParams
from streamd.rpc.bounds import MAX_BULK

FAR = "2999-01-01T00:00:00Z"


@pytest.fixture
def world(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("sig-1", "2026-05-02T10:00:00Z", title="Deploy td-1", ref="td-1", system="tasks"),
        w.rec("sig-2", "2026-05-02T10:05:00Z", title="Review", text="adapter transcripts"),
        w.rec("sig-3", "2026-05-02T10:06:00Z", title="Adapter review", text="adapter"),
    )
    return w


def note(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


class Gate:
    """Holds the patched work at its start until its request stops it; says
    whether the real work then gave up (``Stopped``). Without a stop (work
    called on the event loop, as before) it waits ``ALONE`` seconds and goes
    on, so that such a test fails instead of hanging."""

    ALONE = 5.0

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gave_up = threading.Event()

    def hold(self, stop: Stop | None) -> None:
        self.started.set()
        until = time.monotonic() + (30.0 if stop is not None else self.ALONE)
        while (stop is None or not stop.is_set()) and time.monotonic() < until:
            time.sleep(0.001)  # a thread handshake: the test sets the stop

    def run(self, work: Any, *args: Any, stop: Stop | None) -> Any:
        self.hold(stop)
        try:
            return work(*args) if stop is None else work(*args, stop)
        except Stopped:
            self.gave_up.set()
            raise


async def _stopped_in_time(gate: Gate) -> bool:
    return await trio.to_thread.run_sync(gate.gave_up.wait, 10)


async def _held(gate: Gate) -> None:
    assert await trio.to_thread.run_sync(gate.started.wait, 10)


async def test_a_long_search_leaves_other_requests_answered_and_a_cancel_stops_it(
        world, monkeypatch):
    gate = Gate()
    real = answers_module.rank

    def held(view, query, limit, stop=None):
        return gate.run(real, view, query, limit, stop=stop)

    monkeypatch.setattr(answers_module, "rank", held)
    with trio.fail_after(20):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(search(2, "adapter"))
            await _held(gate)
            await peer.send(health(3))
            # Answered while the search's ranking is held.
            frame = await peer.recv()
            assert frame["id"] == 3 and frame["result"]["status"] == "healthy", frame
            await peer.send(note("recall/cancel", id=2))
            assert error(await peer.recv()) == (2, -32007, "context canceled")
            assert await _stopped_in_time(gate)  # and the ranking gave up


async def test_a_search_rendering_many_candidates_leaves_other_requests_answered(
        world, monkeypatch):
    # A max_candidates of a billion over 1M records: 900,000 candidates
    # rendered on the event loop for 60 s (and 3.6 GB), nothing else answered.
    gate = Gate()
    real = Answers.search_result

    def held(self, generation, ranked, lines, started, max_bytes=None, stop=None):
        return gate.run(real, self, generation, ranked, lines, started, max_bytes, stop=stop)

    monkeypatch.setattr(Answers, "search_result", held)
    with trio.fail_after(20):
        async with session() as (peer, _):
            await initialized(peer, world, max_candidates=10**9)
            await peer.send(search(2, "adapter"))
            await _held(gate)
            await peer.send(health(3))
            frame = await peer.recv()
            assert frame["id"] == 3 and frame["result"]["status"] == "healthy", frame
            await peer.send(note("recall/cancel", id=2))
            assert error(await peer.recv()) == (2, -32007, "context canceled")
            assert await _stopped_in_time(gate)


async def test_a_long_context_expand_leaves_other_requests_answered_and_a_cancel_stops_it(
        world, monkeypatch):
    gate = Gate()
    real = Answers.expansion

    def held(self, generation, p, plan, lines, stop=None):
        return gate.run(real, self, generation, p, plan, lines, stop=stop)

    monkeypatch.setattr(Answers, "expansion", held)
    with trio.fail_after(20):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(req(2, "recall/expand", locator="signals:v2/sig-2", detail="context",
                                budget_bytes=0, deadline=FAR))
            await _held(gate)
            await peer.send(search(3, "td-1"))
            frame = await peer.recv()
            assert frame is not None and frame["result"]["candidates"], frame
            await peer.send(note("$/cancelRequest", id=2))
            assert error(await peer.recv()) == (2, -32007, "context canceled")
            assert await _stopped_in_time(gate)


async def test_long_searches_leave_threads_for_builds_and_for_other_clients(
        world, monkeypatch):
    # 45 searches that rank until cancelled took all 40 threads of Trio's
    # default limiter: no build and no other client's search got one.
    running = threading.Semaphore(0)
    real = answers_module.rank

    def held(view, query, limit, stop=None):
        if query.text == "adapter":
            running.release()
            until = time.monotonic() + 30.0
            while not stop.is_set() and time.monotonic() < until:
                time.sleep(0.001)
        return real(view, query, limit, stop)

    monkeypatch.setattr(answers_module, "rank", held)
    with trio.fail_after(30):
        async with session() as (a, _), session() as (b, _):
            await initialized(a, world)
            await initialized(b, world)
            await a.send(*(search(100 + i, "adapter") for i in range(45)))
            # A connection's searches are bulk: four compute at once, of its 16 threads.
            for _ in range(min(ANSWER_THREADS, MAX_BULK)):
                # A thread of the test's own: the default ones may all be taken.
                assert await trio.to_thread.run_sync(running.acquire, True, 10,
                                                     limiter=trio.CapacityLimiter(1))
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            world.append("a.jsonl", world.rec("sig-4", "2026-05-02T10:07:00Z", title="Fresh"))
            await a.send(req(2, "recall/refresh", deadline=FAR))
            frame = None
            with trio.move_on_after(10):
                frame = await a.recv()
            assert frame is not None and frame["result"]["indexed_count"] == 4, frame
            await b.send(search(3, "fresh"))
            frame = None
            with trio.move_on_after(10):
                frame = await b.recv()
            assert frame is not None and frame["result"]["candidates"], frame
            # No more of a connection's answers compute at once than its share.
            assert not running.acquire(blocking=False)


def _stopped(**flags: bool) -> Stop:
    stop = Stop()
    if flags.get("python", True):
        stop.set()
    else:
        stop.flag[0] = 1  # what only the compiled core reads
    return stop


@pytest.mark.parametrize("query", ["adapter review", "", "adapter " * 50])
def test_a_search_stopped_gives_up_on_both_paths(world, monkeypatch, query):
    _, generation = open_adapter([str(world.data / "a.jsonl")], None)
    with pytest.raises(Stopped):
        rank(generation.view, Query(query), 10, _stopped())
    if native.search_core() is not None:
        # The compiled core itself looks at the flag (Python checks none here).
        with pytest.raises(Stopped):
            rank(generation.view, Query(query), 10, _stopped(python=False))
    monkeypatch.setenv("STREAMD_NATIVE", "0")
    with pytest.raises(Stopped):
        rank(generation.view, Query(query), 10, _stopped())
    # Unstopped, the same search answers.
    assert rank(generation.view, Query(query), 10, Stop()).matched >= 0


def test_a_context_expand_stopped_gives_up_before_reading_its_episode(world):
    adapter, generation = open_adapter([str(world.data / "a.jsonl")], None)
    p = ExpandParams(locator="signals:v2/sig-2", detail="context", budget_bytes=0, deadline=FAR)
    with pytest.raises(Stopped):
        adapter.expand_plan(generation, p, _stopped())
    plan = adapter.expand_plan(generation, p, Stop())
    assert plan.episode  # sig-1 and sig-3 are within 15 minutes
    lines = read_spans(adapter.spans(generation, [plan.rec, *plan.episode]))
    with pytest.raises(Stopped):
        adapter.expansion(generation, p, plan, lines, _stopped())


# --- limits past every record -------------------------------------------------------


@pytest.mark.parametrize("max_candidates", [2**62, 2**63 - 1024])
async def test_a_max_candidates_past_every_record_answers_every_match(world, max_candidates):
    # The reference answers them all; the compiled core asked for room for
    # 2**62 hits and answered -32603 (capacity overflow).
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world, max_candidates=max_candidates)
            await peer.send(req(2, "recall/search", query="adapter review", filters={},
                                limit=0, deadline=FAR))
            frame = await peer.recv()
            assert "result" in frame, frame
            assert [c["candidate_id"] for c in frame["result"]["candidates"]] == [
                "v2/sig-3", "v2/sig-2"]


@pytest.mark.subprocess
async def test_a_max_candidates_of_a_billion_does_not_take_the_process_down(world, tmp_path):
    # It asked the allocator for 40 GB at the first search, which aborted
    # the process (SIGABRT): no answer, and every other client gone with it.
    with trio.fail_after(30):
        async with spawn(tmp_path) as proc:
            await proc.send(req(1, "recall/initialize", protocol_version_min=1,
                                protocol_version_max=1, workdir=str(world.work),
                                source_id="signals", location=str(world.data),
                                settings={"files": ["a.jsonl"], "max_candidates": 10**9}))
            assert "result" in (await proc.recv() or {}), proc.log()
            await proc.send(req(2, "recall/search", query="adapter", filters={}, limit=0,
                                deadline=FAR))
            frame = await proc.recv()
            assert frame is not None and len(frame["result"]["candidates"]) == 2, proc.log()
            await proc.send(req(3, "recall/shutdown"))
            assert (await proc.recv() or {}).get("result") == {}, proc.log()
            await proc.close_stdin()
            assert await proc.process.wait() == 0, proc.log()
