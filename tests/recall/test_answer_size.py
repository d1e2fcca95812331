"""A search answer past the frame stops keeping candidates once that is
known (:mod:`streamd.recall.answer_size`), and is refused as before.

Before, every match was rendered as a candidate and the whole answer
encoded, and only then refused -32603. What is held is counted through the
candidates kept, never through RSS."""

from __future__ import annotations

import pytest
import trio
from support.recall import initialized, req, watch_candidates

from streamd.recall import answers as answers_module
from streamd.recall.adapter import StreamAdapter
from streamd.recall.answer_size import CANDIDATE_FLOOR, AnswerTooLarge
from streamd.recall.index.streamfile import read_spans
from streamd.recall.oneshot import current
from streamd.recall.wire import Filters, InitializeParams, SearchParams
from streamd.rpc.protocol import encode_error, oversized_result, result_frame, result_room

FAR = "2999-01-01T00:00:00Z"
RECORDS = 300
MAX_FRAME = 20_000  # some 40 candidates of the 300 fit


@pytest.fixture
def world(recall_world):
    recall_world.write("a.jsonl", *[
        recall_world.rec(f"sig-{i}", title=f"adapter record {i}", text="adapter notes " * 20)
        for i in range(RECORDS)])
    return recall_world


@pytest.fixture
def watched(monkeypatch):
    return watch_candidates(monkeypatch, answers_module)


def searched(world):
    """An adapter over the world with a fixed clock, and every match ranked."""
    adapter = StreamAdapter(clock=lambda: 0, persist=False)
    adapter.initialize(InitializeParams(
        protocol_version_min=1, protocol_version_max=1, workdir=str(world.work),
        source_id="signals", location=str(world.data),
        settings={"files": [str(world.data / "a.jsonl")], "max_candidates": 10**9}))
    generation = current(adapter)
    ranked = adapter.rank(generation, SearchParams(query="adapter", filters=Filters(), limit=0,
                                                   deadline=FAR))
    lines = read_spans(adapter.spans(generation, [hit.rec for hit in ranked.hits]))
    assert len(ranked.hits) == RECORDS
    return adapter, generation, ranked, lines


def test_an_answer_refused_early_states_the_size_result_frame_would(world) -> None:
    adapter, generation, ranked, lines = searched(world)
    whole = adapter.search_result(generation, ranked, lines, 0)
    refused = result_frame(7, whole, MAX_FRAME)
    assert b'"code":-32603' in refused
    with pytest.raises(AnswerTooLarge) as early:
        adapter.search_result(generation, ranked, lines, 0,
                              max_bytes=result_room(7, MAX_FRAME))
    assert encode_error(7, oversized_result(7, early.value.size, MAX_FRAME)) == refused


def test_an_answer_past_its_room_keeps_no_more_candidates_than_fit(world, watched) -> None:
    adapter, generation, ranked, lines = searched(world)
    room = result_room(7, MAX_FRAME)
    with pytest.raises(AnswerTooLarge):
        adapter.search_result(generation, ranked, lines, 0, max_bytes=room)
    # What fits, and the one that told: not the 300 rendered.
    assert 0 < watched.most <= room // CANDIDATE_FLOOR + 1 < RECORDS


def test_an_answer_within_its_room_is_the_same_with_the_limit(world) -> None:
    adapter, generation, ranked, lines = searched(world)
    whole = adapter.search_result(generation, ranked, lines, 0)
    assert adapter.search_result(generation, ranked, lines, 0, max_bytes=1 << 30) == whole


async def test_a_search_past_the_frame_is_refused_as_before_having_kept_what_fits(
    world, watched
) -> None:
    from support.recall import session

    with trio.fail_after(30):
        async with session(max_frame=MAX_FRAME) as (peer, _):
            await initialized(peer, world, max_candidates=10**9)
            await peer.send(req(2, "recall/search", query="adapter", filters={}, limit=0,
                                deadline=FAR))
            frame = await peer.recv()
    assert frame is not None and frame["error"]["code"] == -32603, frame
    size = frame["error"]["data"]["answer_bytes"]
    assert frame["error"]["message"] == (
        f"the answer is {size} bytes, over the {MAX_FRAME} byte frame limit")
    assert size > MAX_FRAME
    assert 0 < watched.most < RECORDS
