"""The Recall methods over the wire with the real method table, and what the reference's
schemas refuse before decoding (helpers: support.recall).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from support.recall import (
    FAR,
    error,
    health,
    init,
    initialized,
    req,
    search,
    session,
)

# --- the Recall methods over the wire ---------------------------------------------------


async def test_before_the_handshake_only_health_answers(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(
                search(2),
                req(3, "recall/expand", locator="signals:v2/sig-1", detail="full",
                    budget_bytes=0, deadline=FAR),
                req(4, "recall/refresh", deadline=FAR),
                health(5),
                search(6, filters={"entities": ["x"]}),  # the handshake is checked first
            )
            frames = await peer.recv_by_id(5)
    message = "stream adapter has not completed a handshake"
    for id in (2, 3, 4, 6):
        assert error(frames[id]) == (id, -32000, message)
    h = frames[5]["result"]
    assert (h["status"], h["coverage"]) == ("unavailable", "unknown")


async def test_refresh_builds_when_asked_or_when_the_stream_changed(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            gens = []
            for i, full in enumerate([False, False, True, False], start=2):
                await peer.send(req(i, "recall/refresh", deadline=FAR, full=full))
                gens.append((await peer.recv())["result"]["index_generation"])
            world.append("a.jsonl", world.rec("sig-3", "2026-05-02T10:09:00Z", title="new"))
            await peer.send(req(9, "recall/refresh", deadline=FAR))
            gens.append((await peer.recv())["result"]["index_generation"])
    assert gens == ["gen-1", "gen-1", "gen-2", "gen-2", "gen-3"]


async def test_an_unreadable_source_reports_unavailable_and_keeps_its_generation(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(health(2))
            assert (await peer.recv())["result"]["index_generation"] == "gen-1"
            world.path("a.jsonl").unlink()
            world.path("a.jsonl").mkdir()
            await peer.send(health(3), search(4, "td-1"))
            frames = await peer.recv_by_id(2)
            h = frames[3]["result"]
            assert (h["status"], h["coverage"], h["diagnostics"]) == (
                "unavailable", "unknown", {"reason": "unreachable"},
            )
            assert h["index_generation"] == "gen-1"
            # The reference's words: it opens the directory and fails its read.
            assert error(frames[4]) == (4, -32000, "a.jsonl became unreadable")


async def test_when_every_file_is_missing_search_fails_and_health_is_unavailable(world):
    frame = init(world)
    frame["params"]["settings"]["files"] = ["x.jsonl", "y.jsonl"]
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            await peer.recv()
            await peer.send(search(2, "td-1"), health(3))
            frames = await peer.recv_by_id(2)
            assert error(frames[2]) == (
                2, -32000, "no configured stream file is readable (x.jsonl, y.jsonl)",
            )
            h = frames[3]["result"]
            assert (h["status"], h["diagnostics"]["reason"]) == ("unavailable", "unreachable")
            assert "index_generation" not in h


# --- what the reference's schemas refuse before decoding ---------------------------------------


async def test_a_version_range_with_min_above_max_is_invalid_params(world):
    frame = init(world)
    frame["params"]["protocol_version_min"] = 2
    frame["params"]["protocol_version_max"] = 1
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            assert error(await peer.recv()) == (
                1, -32602, "protocol version 1 is outside the requested range 2..1",
            )


async def test_a_wider_version_range_is_offered_version_one(world):
    frame = init(world)
    frame["params"]["protocol_version_max"] = 5
    with trio.fail_after(10):
        async with session() as (peer, _):
            await peer.send(frame)
            assert (await peer.recv())["result"]["protocol_version"] == 1


@pytest.mark.parametrize(
    "params",
    [
        {"query": "", "filters": {"since": "2026-05-02T09:15:00,5Z"}, "limit": 1,
         "deadline": FAR},
        {"query": "", "filters": {}, "limit": 1, "deadline": "2999-01-01T00:00:00+24:00"},
        {"query": "", "filters": {}, "limit": 1, "deadline": FAR,
         "as_of": "2026-05-02T09:15:00.5+23:60"},
    ],
    ids=["comma-fraction", "offset-24h", "offset-60min"],
)
async def test_wire_timestamps_must_also_pass_the_schemas_date_time_format(world, params):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send({"jsonrpc": "2.0", "id": 2, "method": "recall/search",
                             "params": params})
            assert error(await peer.recv())[:2] == (2, -32602)


async def test_a_locator_with_a_newline_in_its_local_part_is_invalid_params(world):
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(req(2, "recall/expand", locator="signals:v2/sig\n-1",
                                detail="full", budget_bytes=0, deadline=FAR))
            assert error(await peer.recv())[:2] == (2, -32602)


async def test_a_build_that_crashes_is_an_internal_error_and_the_connection_lives_on(
    world, monkeypatch
):
    from streamd.recall import adapter as adapter_module

    calls = {"n": 0}
    real = adapter_module.StreamAdapter.build

    def flaky(self, full):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ZeroDivisionError("boom")
        return real(self, full)

    monkeypatch.setattr(adapter_module.StreamAdapter, "build", flaky)
    with trio.fail_after(10):
        async with session() as (peer, _):
            await initialized(peer, world)
            await peer.send(req(2, "recall/refresh", deadline=FAR))
            code, message = error(await peer.recv())[1:3]
            assert code == -32603 and "boom" in message
            await peer.send(req(3, "recall/health", deadline=FAR))
            assert (await peer.recv())["result"]["status"] == "healthy"
