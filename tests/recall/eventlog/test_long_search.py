"""A search of the event-log source whose ranking runs long: off the event loop,
and stopped by its cancel (as the stream source's, ``recall/test_heavy_requests.py``)."""

from __future__ import annotations

import threading
import time

import trio
from support.recall import FAR, req

from streamd.recall.eventlog import answers as log_answers
from streamd.recall.stop import Stop, Stopped

from .conftest import init, result, say, search, served


async def test_a_long_search_leaves_other_requests_answered_and_a_cancel_stops_it(
        tmp_path, monkeypatch):
    started, gave_up = threading.Event(), threading.Event()
    real = log_answers.rank

    def held(view, query, limit, stop: Stop | None = None):
        started.set()
        # A thread handshake: the cancel sets the stop. Called on the event
        # loop instead (no stop), it goes on after 5 s, and the test fails.
        until = time.monotonic() + (30.0 if stop is not None else 5.0)
        while (stop is None or not stop.is_set()) and time.monotonic() < until:
            time.sleep(0.001)
        try:
            return real(view, query, limit, stop)
        except Stopped:
            gave_up.set()
            raise

    db = tmp_path / "events.db"
    with trio.fail_after(30):
        async with served(db) as (peer, log):
            await say(log, "e1", "the checksum drill")
            await result(peer, init(db, tmp_path))
            monkeypatch.setattr(log_answers, "rank", held)
            await peer.send(search(2, "checksum"))
            assert await trio.to_thread.run_sync(started.wait, 10)
            await peer.send(req(3, "recall/health", deadline=FAR))
            frame = await peer.recv()
            assert frame["id"] == 3 and "result" in frame, frame
            await peer.send({"jsonrpc": "2.0", "method": "recall/cancel", "params": {"id": 2}})
            frame = await peer.recv()
            assert (frame["id"], frame["error"]["code"]) == (2, -32007), frame
            assert await trio.to_thread.run_sync(gave_up.wait, 10)
