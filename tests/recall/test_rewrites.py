"""A stream rewritten in place without getting shorter is rebuilt, as a shrunk one is.

The reference decides by size alone. A process that holds an index (a
resident daemon keeps one warm across commands) must notice what a fresh
process notices at adoption, the two ends of the consumed bytes, at every
catch-up; and a line read back for an answer that is no longer the record
indexed there (``changed under the index; refresh and retry``) must make the
refresh it asks for start over. Either way the rebuild says
``stream_rewritten``.
"""

from __future__ import annotations

import os

import pytest
import trio
from support.recall import init, req, session

from streamd.errors import RpcError
from streamd.recall.changes import Change, change, needs_fingerprint
from streamd.recall.index.parallel import drive
from streamd.recall.index.streamfile import Cursor
from streamd.recall.oneshot import current


def line(w, i: int, word: str = "alpha") -> bytes:
    # Same length whatever the word (five letters), so a rewrite keeps the
    # size; the id starts with the word's letter: a rewritten line is another record.
    return w.rec(f"{word[0]}{i:04d}", f"2026-05-02T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
                 title=f"{word} {i:04d}", text="x" * 80)


def write(w, words: dict[int, str], n: int) -> None:
    w.write("a.jsonl", *(line(w, i, words.get(i, "alpha")) for i in range(n)))


def hits(w, adapter, query: str) -> list[str]:
    return [c["source_record_id"] for c in w.search(adapter, query)["candidates"]]


# --- what a change means -------------------------------------------------------------------


@pytest.mark.parametrize(("cur", "size", "then", "now", "expected"), [
    (Cursor("a", 100), 100, "h", "h", Change.NONE),
    (Cursor("a", 100), 150, "h", "h", Change.GREW),
    (Cursor("a", 100), 100, "h", "other", Change.REWRITTEN),  # same length, new bytes
    (Cursor("a", 100), 150, "h", "other", Change.REWRITTEN),  # grown, but not by appending
    (Cursor("a", 100), 99, "h", "h", Change.REWRITTEN),  # shorter
    (Cursor("a", 100), None, "h", "", Change.REWRITTEN),  # gone after being read
    (Cursor("a", 0), None, "", "", Change.VANISHED),
    (Cursor("a", missing=True), None, "", "", Change.NONE),
    (Cursor("a", missing=True), 10, "", "", Change.APPEARED),
    (None, 10, "", "", Change.APPEARED),
    (Cursor("a", 100), 100, "h", "", Change.NONE),  # unreadable now: the length decides
    (Cursor("a", 100), 100, "", "h", Change.NONE),  # never taken: the length decides
])
def test_what_a_stat_and_the_fingerprints_mean(cur, size, then, now, expected):
    assert change(cur, size, then, now) is expected


def test_a_fingerprint_is_needed_only_for_bytes_read_that_are_still_there():
    assert needs_fingerprint(Cursor("a", 10), 10) and needs_fingerprint(Cursor("a", 10), 11)
    assert not needs_fingerprint(Cursor("a", 10), 9)
    assert not needs_fingerprint(Cursor("a", 0), 10)
    assert not needs_fingerprint(Cursor("a", 10), None)
    assert not needs_fingerprint(None, 10)


# --- rewrites a catch-up finds ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_same_length_rewrite_at_either_end_is_rebuilt_by_the_next_catch_up(
    recall_world, where
):
    w = recall_world
    n = 2_000  # about 300 KB: the ends are two separate 64 KiB
    write(w, {}, n)
    adapter = w.adapter()
    size = w.path("a.jsonl").stat().st_size
    assert hits(w, adapter, "omega") == []
    changed = 0 if where == "first" else n - 1
    write(w, {changed: "omega"}, n)
    assert w.path("a.jsonl").stat().st_size == size
    # No full refresh asked: the catch-up before the search notices.
    result = w.search(adapter, "omega")
    assert [c["source_record_id"] for c in result["candidates"]] == [f"o{changed:04d}"]
    assert result["diagnostics"]["generation"] == "gen-2"
    health = w.health(adapter)
    assert health["diagnostics"].get("stream_rewritten") is True
    assert (health["status"], health["coverage"]) == ("degraded", "complete")
    # A warm index now answers what a fresh process answers.
    assert hits(w, w.adapter(workdir=str(w.root / "fresh")), "omega") == hits(w, adapter, "omega")


def test_a_rewrite_that_also_grew_is_a_rebuild_not_an_append(recall_world):
    w = recall_world
    write(w, {}, 50)
    adapter = w.adapter()
    assert hits(w, adapter, "alpha")
    write(w, {i: "omega" for i in range(60)}, 60)  # every line new, and ten more
    assert hits(w, adapter, "alpha") == []
    assert w.search(adapter, "omega")["diagnostics"]["matched"] == 60
    assert w.health(adapter)["diagnostics"].get("stream_rewritten") is True
    assert adapter.generation.indexed == 60


def test_a_file_touched_but_not_changed_is_not_rebuilt(recall_world):
    w = recall_world
    write(w, {}, 50)
    adapter = w.adapter()
    first = current(adapter)
    os.utime(w.path("a.jsonl"), ns=(1, 1))
    assert current(adapter) is first  # no build, no new generation
    assert "stream_rewritten" not in w.health(adapter)["diagnostics"]


def test_an_ordinary_append_after_the_rebuild_is_an_ordinary_generation(recall_world):
    w = recall_world
    write(w, {}, 50)
    adapter = w.adapter()
    current(adapter)
    write(w, {0: "omega"}, 50)
    assert current(adapter).rewritten
    w.append("a.jsonl", line(w, 50))
    generation = current(adapter)
    assert not generation.rewritten and generation.indexed == 51
    assert w.health(adapter)["status"] == "healthy"


# --- rewrites an answer finds ----------------------------------------------------------------


@pytest.mark.parametrize("native", ["0", "1"])
def test_a_stream_rewritten_in_place_while_a_build_reads_it_is_read_anew(
    recall_world, monkeypatch, native
):
    # Truncated and written again (the same file, so no ``Replaced`` by its
    # identity) after the build read it and before it published. Before, the
    # generation held the old records under the new bytes' fingerprint:
    # nothing noticed until an answer read a line back.
    monkeypatch.setenv("STREAMD_NATIVE", native)
    w = recall_world
    write(w, {}, 3000)
    adapter = w.adapter()
    steps = adapter.build(False)
    assert next(steps) is None  # a first slice of lines read
    write(w, {i: "omega" for i in range(3000)}, 3000)  # same length, in place
    generation = drive(steps)
    assert generation.rewritten
    assert len(hits(w, adapter, "omega")) == 50 and hits(w, adapter, "alpha") == []
    assert w.health(adapter)["diagnostics"]["stream_rewritten"] is True


def test_a_rewrite_inside_the_file_found_by_expand_is_rebuilt_by_a_plain_refresh(recall_world):
    w = recall_world
    n = 2_000
    write(w, {}, n)
    adapter = w.adapter()
    mid = n // 2  # far from both 64 KiB ends: no fingerprint shows it
    assert w.expand(adapter, f"v2/a{mid:04d}")["content"]
    write(w, {mid: "omega"}, n)
    assert current(adapter).name == "gen-1"  # the ends are as they were
    with pytest.raises(RpcError) as err:
        w.expand(adapter, f"v2/a{mid:04d}")
    assert err.value.message == "a.jsonl changed under the index; refresh and retry"
    # The refresh it asks for (not a full one) is enough.
    generation = current(adapter)
    assert generation.rewritten and generation.name == "gen-2"
    assert "omega" in w.expand(adapter, f"v2/o{mid:04d}")["content"]
    assert w.health(adapter)["diagnostics"].get("stream_rewritten") is True


async def test_a_refresh_over_the_wire_reports_the_rewrite_it_rebuilt(recall_world):
    w = recall_world
    write(w, {}, 100)
    with trio.fail_after(60):
        async with session() as (peer, _):
            await peer.send(init(w))
            assert "result" in await peer.recv()
            await peer.send(req(2, "recall/refresh", deadline="2999-01-01T00:00:00Z"))
            first = (await peer.recv())["result"]
            assert first["status"] == "healthy" and first["index_generation"] == "gen-1"
            write(w, {0: "omega"}, 100)
            await peer.send(req(3, "recall/refresh", deadline="2999-01-01T00:00:00Z"))
            second = (await peer.recv())["result"]
    assert second["index_generation"] == "gen-2"
    assert second["diagnostics"]["stream_rewritten"] is True
    assert second["status"] == "degraded" and second["coverage"] == "complete"
