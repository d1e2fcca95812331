"""``streamd attach --eventlog``: Recall's life cycle against an event log, real processes.

A Recall core spawns its adapter for each command, in its own directory, and
talks in lockstep: initialize, a health probe, a search or an expand,
shutdown. The events are written meanwhile by ``streamd log append``, another
process, and each search must find what was appended before it.
"""

from __future__ import annotations

import time

import pytest
from support.resident import FAR_DEADLINE, Attached, World, make_world, req

pytestmark = pytest.mark.subprocess


@pytest.fixture
def world(attach_kind: str):
    yield from make_world(attach_kind)


def append(world: World, event_id: str, text: str, session: str = "s1") -> None:
    done = world.run("log", "--db", str(world.root / "events.db"), "append", "--app", "chat",
                     "--user", "u1", "--session", session, "--author", "user", "--text", text,
                     "--id", event_id)
    assert done.returncode == 0, done.stderr


def deadline(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds + 1))


def command(world: World, *requests: bytes) -> list[dict]:
    """One Recall command: spawn, handshake, the requests, shutdown; the answers."""
    proc = world.attach("--eventlog", cwd=str(world.root))
    session = Attached(proc)
    try:
        # Relative paths, as a Recall config in a project directory has them.
        init = req(1, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
                   workdir="work", source_id="agents", location="events.db", settings={})
        answers = [session.ask(init)]
        answers += [session.ask(r) for r in requests]
        answers.append(session.ask(req(99, "recall/shutdown")))
        assert session.at_eof(30)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdin.close()
    assert proc.returncode == 0, session.stderr()
    return answers


def test_recall_finds_and_expands_events_appended_by_another_process(world: World) -> None:
    append(world, "e1", "what did we decide about the checksum drill")
    append(world, "e2", "we run the checksum drill weekly")
    init, health, found, _ = command(
        world,
        req(2, "recall/health", deadline=deadline(5)),
        req(3, "recall/search", query="checksum drill", filters={}, limit=5,
            deadline=deadline(5)),
    )
    assert init["result"]["adapter_id"] == "streamd-eventlog/1"
    assert health["result"]["status"] == "healthy", health
    assert sorted(c["source_record_id"] for c in found["result"]["candidates"]) == ["e1", "e2"]
    # The next command, just after another append: found at once, and shown.
    append(world, "e3", "the drill moved to fridays", session="s2")
    _, found, shown, _ = command(
        world,
        req(2, "recall/search", query="fridays", filters={}, limit=5, deadline=deadline(5)),
        req(3, "recall/expand", locator="agents:v2/e3", detail="full", budget_bytes=0,
            deadline=FAR_DEADLINE),
    )
    assert [c["source_record_id"] for c in found["result"]["candidates"]] == ["e3"]
    assert "the drill moved to fridays" in shown["result"]["content"]
    # The daemon kept its own log apart: it never created the client's one elsewhere.
    assert not (world.state / "streamd" / "events.db").exists()


def test_the_stream_adapter_is_still_what_plain_attach_serves(world: World) -> None:
    proc = world.attach()
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    assert b'"adapter_id":"recall-stream/1"' in out.replace(b" ", b"")
