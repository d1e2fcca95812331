"""A request keeps, of its deadline, what answering has been taking.

When the build it waits for cannot publish in time, a search answers from the
generation published before; it must stop waiting while enough of its
deadline is left for the answer itself, which on a loaded machine takes far
longer than on a quiet one.
"""

from __future__ import annotations

import time

import trio
from support.recall import WALL0, initialized, search, session

from streamd.golang import gotime
from streamd.recall import reserve
from streamd.recall.adapter import StreamAdapter
from streamd.recall.index.streamfile import read_spans
from streamd.recall.reserve import AnswerReserve
from streamd.recall.scanner import to_thread


def test_the_reserve_is_twice_the_longest_recent_answer_within_its_bounds():
    r = AnswerReserve()
    assert r.seconds == reserve.FLOOR  # nothing learnt yet
    r.observe(0.01)
    assert r.seconds == reserve.FLOOR
    r.observe(0.4)
    r.observe(0.1)
    assert r.seconds == 0.8
    r.observe(30.0)  # one stall does not make every request give up at once
    assert r.seconds == reserve.CEILING
    for _ in range(reserve.KEEP):
        r.observe(0.2)
    assert r.seconds == 0.4  # what is no longer recent is forgotten


async def test_a_search_whose_build_cannot_publish_answers_in_time_however_slow_answers_are(
    recall_world, autojump_clock, monkeypatch
):
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r-{i}", title=f"record {i}") for i in range(20)))

    def wall_ns() -> int:
        return WALL0 + round(trio.current_time() * 1e9)

    threaded = False

    async def offload(fn, *args, limiter=None):
        if fn is read_spans:
            # A loaded machine: rendering an answer takes 0.6 s.
            await trio.sleep(0.6)
            return fn(*args)
        if threaded and fn.__name__ == "build":
            return await to_thread(fn, *args, limiter=limiter)
        # Inline, so that the mock clock sees the build's time (none), and
        # the ranking's (none: the answer's time is the read's).
        await trio.lowlevel.checkpoint()
        return fn(*args)

    def stuck(self, full):
        # A build that never gets to a step where it could publish. It runs
        # in a thread, which the mock clock does not wait for: every wait of
        # the search is on its timers alone.
        while True:
            time.sleep(0.001)
            yield None

    with trio.fail_after(60):
        async with session(offload=offload, wall_ns=wall_ns) as (peer, _):
            await initialized(peer, w)
            await peer.send(search(2, "record"))
            first = await peer.recv()
            assert first["result"]["diagnostics"]["generation"] == "gen-1", first
            # More to read, and the build that reads it is stuck.
            w.append("a.jsonl", w.rec("r-new", title="record new"))
            monkeypatch.setattr(StreamAdapter, "build", stuck)
            threaded = True
            sent = trio.current_time()
            deadline = gotime.format_nano(wall_ns() + 3 * gotime.NS)
            await peer.send(search(3, "record", deadline=deadline))
            second = await peer.recv()
            answered = trio.current_time() - sent
    assert "result" in second, second
    assert second["result"]["diagnostics"]["generation"] == "gen-1"
    assert answered < 3
