"""A search of the event-log source past the frame stops keeping candidates
once that is known (:mod:`streamd.recall.answer_size`), and is refused as
the stream source's is (``recall/test_answer_size.py``).

Before, every match was rendered as a candidate and the whole answer built,
and only then refused -32603. What is held is counted through the candidates
kept, never through RSS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from support.recall import Peer, WatchedCandidates, watch_candidates

from streamd.daemon import Config, Daemon
from streamd.eventlog.model import Event
from streamd.recall.eventlog import answers as log_answers
from streamd.rpc import Server
from streamd.rpc.protocol import result_frame

from .conftest import call, init, search

EVENTS = 300
MAX_FRAME = 20_000  # some 30 candidates of the 300 fit


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> type[WatchedCandidates]:
    # raising=False: before, the source built its list without Candidates.
    return watch_candidates(monkeypatch, log_answers, raising=False)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many candidates each SearchResult the source built held."""
    sizes: list[int] = []
    real = log_answers.SearchResult

    def recorded(**fields: Any) -> Any:
        sizes.append(len(fields["candidates"]))
        return real(**fields)

    monkeypatch.setattr(log_answers, "SearchResult", recorded)
    return sizes


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The arguments of every search_result the source made: to build the
    very answer again, whole, and see what size it has."""
    seen: list[tuple[Any, ...]] = []
    real = log_answers.LogAnswers.search_result

    def recorded(self, *args):  # type: ignore[no-untyped-def]
        seen.append((self, *args[:4]))
        return real(self, *args)

    monkeypatch.setattr(log_answers.LogAnswers, "search_result", recorded)
    return seen


@asynccontextmanager
async def narrow(db: Path, workdir: Path) -> AsyncIterator[Peer]:
    """A connection with a MAX_FRAME limit to a daemon whose log holds EVENTS
    events that match ``adapter``, its event-log source initialized."""
    daemon = Daemon(Config(db=str(db), recall_source="eventlog", synchronous="NORMAL"))
    async with daemon.running():
        log = await daemon.eventlog()
        for i in range(EVENTS):
            await log.append("chat", "u1", f"s{i % 10}", Event(
                id=f"e{i}", author="user", content=f"adapter {i} " + "adapter notes " * 20))
        client, server_end = trio.testing.memory_stream_pair()
        peer = Peer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Server(daemon.methods_for, max_frame=MAX_FRAME).serve,
                               server_end, server_end)
            try:
                answer = await call(peer, init(db, workdir, max_candidates=10**9))
                assert "result" in answer, answer
                yield peer
            finally:
                await peer.close_input()


async def test_a_log_search_past_the_frame_is_refused_as_before_having_kept_what_fits(
    tmp_path: Path,
    watched: type[WatchedCandidates],
    built: list[int],
    answered: list[tuple[Any, ...]],
) -> None:
    with trio.fail_after(60):
        async with narrow(tmp_path / "events.db", tmp_path) as peer:
            refused = await call(peer, search(2, "adapter", limit=0))
    assert refused["error"]["code"] == -32603, refused
    # Before: one result of all 300, built and encoded to be refused.
    assert max(built) < EVENTS
    # What fits, and the one that told: not the 300 rendered.
    assert 0 < watched.most < EVENTS
    # The refusal is the one the whole answer gets: it names its exact size.
    [(answers, generation, ranked, rows, elapsed_ms)] = answered
    whole = answers.search_result(generation, ranked, rows, elapsed_ms)
    assert len(whole.candidates) == EVENTS
    assert refused == msgspec.json.decode(result_frame(2, whole, MAX_FRAME))
