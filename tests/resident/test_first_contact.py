"""First contact, the way the Recall core makes it.

Every command spawns a fresh ``streamd attach``: initialize, a health probe
with a 5 s deadline, a search with the deadline the core computed before the
probe (2 s from the handshake by default; 3 s here, so a loaded CI machine
still has a second to publish a prefix), shutdown. On a stream whose first
build outlasts those deadlines every spawn must still be answered in time,
honestly partial, and the spawns must converge on complete coverage because
the build goes on in the daemon.
"""

from __future__ import annotations

import json
import time

import pytest
from support.resident import Attached, World, make_world, req

pytestmark = pytest.mark.subprocess

RECORDS = 500_000  # ~100 MB: about 7 s of build on the plain path on this 2-core machine


@pytest.fixture
def world(attach_kind: str):
    yield from make_world(attach_kind)


def deadline_in(seconds: float) -> str:
    t = time.time() + seconds
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def a_command(world: World) -> tuple[dict, dict, float, float]:
    """One Recall command through a fresh attach: (health, search, their seconds)."""
    proc = world.attach()
    attached = Attached(proc)
    try:
        assert "result" in attached.ask(world.initialize(1), 30)
        started = time.monotonic()
        health = attached.ask(req(2, "recall/health", deadline=deadline_in(5)), 30)
        probed = time.monotonic() - started
        search_deadline = deadline_in(3)
        started = time.monotonic()
        search = attached.ask(req(3, "recall/search", query="deploy", filters={}, limit=5,
                                  deadline=search_deadline), 30)
        searched = time.monotonic() - started
        assert attached.ask(req(4, "recall/shutdown"), 30) == {
            "jsonrpc": "2.0", "id": 4, "result": {}}
        assert attached.at_eof(30)
        assert proc.wait(30) == 0, attached.stderr()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stdin.close()
    if "result" not in health or "result" not in search:
        daemon_log = world.log.read_text() if world.log.exists() else "(no daemon log)"
        raise AssertionError(f"health {health}, search {search}; daemon log:\n{daemon_log[-4000:]}")
    return health["result"], search["result"], probed, searched


def test_a_fresh_big_stream_answers_every_spawn_in_time_and_converges(world: World) -> None:
    # The plain (pure Python) build path, so that the first build outlasts the
    # probe's patience whatever the compiled core would make of this stream.
    world.env["STREAMD_NATIVE"] = "0"
    world.stream.write_bytes(b"".join(
        json.dumps({"schema": 2, "id": f"evt-{i}", "event_time": "2026-05-02T10:00:00Z",
                    "title": f"deploy {i % 97} of service {i % 1013}",
                    "text": "the pipeline shipped " * (1 + i % 7)}).encode() + b"\n"
        for i in range(RECORDS)
    ))
    health, search, probed, searched = a_command(world)
    # The first build outlasts the probe: the probe reports on it instead of
    # waiting for it.
    assert health["status"] == "degraded" and health["coverage"] == "partial", health
    indexing = health["diagnostics"]["indexing"]
    assert indexing["consumed_bytes"] < indexing["total_bytes"] == world.stream.stat().st_size
    assert probed < 5 and searched < 3
    # The search waited as its deadline allowed: answered from a prefix, or
    # whole if the build finished meanwhile (a quiet machine may be that fast).
    assert search["outcome"] in ("partial", "success")
    if search["outcome"] == "partial":
        assert search["diagnostics"]["indexing"]["consumed_bytes"] > 0
    generations = [int(search["diagnostics"]["generation"].removeprefix("gen-"))]
    # Later spawns find the build further along, in the same daemon, until it is done.
    give_up = time.monotonic() + 240
    while health["coverage"] != "complete":
        assert time.monotonic() < give_up, "the spawns never reached complete coverage"
        health, search, probed, searched = a_command(world)
        assert probed < 5 and searched < 3
        assert health["status"] in ("healthy", "degraded")
        generations.append(int(search["diagnostics"]["generation"].removeprefix("gen-")))
    assert health["status"] == "healthy" and health["indexed_count"] == RECORDS
    assert search["outcome"] == "success" and search["candidates"]
    assert generations == sorted(generations)  # monotonic across connections
    assert len(world.daemons()) == 1
