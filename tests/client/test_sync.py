"""The blocking client from plain threads, against real ``streamd`` processes:
one it spawns on stdio, and the resident daemon, which it starts when none runs
(in a private world: ``support.resident``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.resident import World, make_world, point_clients_at

from streamd.client import Client
from streamd.client.protocol import Call
from streamd.errors import CLOSED, RpcError, is_session_locked
from streamd.eventlog.model import Entry, Event, Filter, WatchParams, WatchResult


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    with Client.spawn(["--db", str(tmp_path / "e.db"), "--synchronous", "NORMAL"]) as c:
        yield c


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


def test_threads_share_one_client_and_every_append_is_acknowledged_once(client: Client) -> None:
    seqs: list[int] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for i in range(50):
            r = client.append("app", "u", f"s{t}", ev(f"t{t}-{i}"))
            with lock:
                seqs.append(r.seq)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seqs) == 400 and len(set(seqs)) == 400
    assert client.latest_seq().seq == max(seqs)
    for t in range(8):
        got = client.get_session("app", "u", f"s{t}")
        assert [e.event.id for e in got.events] == [f"t{t}-{i}" for i in range(50)]


def test_a_blocking_watch_in_one_thread_sees_another_threads_appends(client: Client) -> None:
    client.append("app", "u", "s", ev("before"))
    seen: list[Entry] = []
    ready = threading.Event()

    def follow() -> None:
        with client.watch(0, Filter(session="s")) as w:
            for entry in w:
                seen.append(entry)
                ready.set()
                if len(seen) == 3:
                    return

    reader = threading.Thread(target=follow)
    reader.start()
    assert ready.wait(30)
    client.append("app", "u", "other", ev("elsewhere"))
    client.append("app", "u", "s", ev("after-1"))
    client.append("app", "u", "s", ev("after-2"))
    reader.join(30)
    assert [e.event.id for e in seen] == ["before", "after-1", "after-2"]


def test_a_watch_next_with_a_timeout_raises_and_the_watch_goes_on(client: Client) -> None:
    with client.watch(0) as w:
        with pytest.raises(TimeoutError):
            w.next(timeout=0.05)
        client.append("app", "u", "s", ev("late"))
        assert w.next(timeout=30).event.id == "late"


def test_a_call_that_times_out_is_cancelled_on_the_daemon(client: Client) -> None:
    hang = Call("eventlog/watch", WatchParams(from_seq=0, filter=Filter(app="none")), WatchResult)
    with pytest.raises(TimeoutError):
        client.call(hang, timeout=0.2)
    # Only a $/cancelRequest makes the daemon answer a watch; the answer is dropped.
    while client.in_flight:
        client.ping()


def test_a_lease_is_exclusive_and_lost_when_the_daemon_goes(client: Client) -> None:
    lease = client.acquire_lock("app", "u", "s")
    with pytest.raises(RpcError) as info:
        client.acquire_lock("app", "u", "s")
    assert is_session_locked(info.value)
    assert client.process is not None
    client.process.kill()
    assert lease.lost.wait(30)
    with pytest.raises(RpcError) as closed:
        client.ping()
    assert closed.value.code == CLOSED


def test_a_released_lease_can_be_taken_again_and_is_never_lost(client: Client) -> None:
    with client.acquire_lock("app", "u", "s") as lease:
        pass
    assert not lease.lost.is_set()
    client.acquire_lock("app", "u", "s").release()


def test_connect_starts_the_resident_daemon_when_none_runs_and_then_reuses_it(
    world: World, tmp_path: Path
) -> None:
    assert world.daemons() == []
    db = tmp_path / "events.db"
    with Client.connect(daemon_args=["--db", str(db), "--synchronous", "NORMAL"]) as a:
        assert a.append("app", "u", "s", ev("e1")).seq == 1
        (pid,) = world.daemons()
        with Client.connect() as b:  # finds the running daemon: no second one
            assert b.get_session("app", "u", "s").events[0].event.id == "e1"
            assert world.daemons() == [pid]
    assert db.exists()


def test_connect_without_starting_refuses_when_none_runs(world: World) -> None:
    with pytest.raises(RpcError) as info:
        Client.connect(start_daemon=False)
    assert info.value.code == -32000 and "cannot reach the streamd daemon" in info.value.message
    assert world.daemons() == []


def test_a_request_whose_write_finds_the_connection_broken_is_answered_by_its_end() -> None:
    # A daemon at its connection limit says why and closes: a request written
    # after the close fails with EPIPE, and the call is still answered by the
    # connection's end, in the daemon's words (the frame writer took the
    # request back from the core as never sent, and the call waited a second
    # to raise the bare "Broken pipe").
    import json
    import time

    refusal = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32000, "message": "the daemon serves at most 1 connections at once",
        "data": {"reason": "too_many_connections", "limit": 1}}}).encode() + b"\n"
    tried = threading.Event()
    said = [refusal]

    def receive() -> bytes:
        assert tried.wait(10)  # what the daemon said is read after the write failed
        return said.pop() if said else b""

    def send(data: bytes) -> int:
        tried.set()
        raise BrokenPipeError(32, "Broken pipe")

    with Client((send, lambda timeout: True), receive, lambda: None) as client:
        started = time.monotonic()
        with pytest.raises(RpcError) as caught:
            client.latest_seq()
    assert caught.value.code == CLOSED
    assert "serves at most 1 connections at once" in caught.value.message, caught.value
    assert caught.value.data == {"reason": "too_many_connections", "limit": 1}
    assert time.monotonic() - started < 0.9  # answered, not given up on
