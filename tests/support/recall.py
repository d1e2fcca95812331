"""A Recall adapter served in process: a scratch world, a peer and its requests."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from streamd.daemon import Daemon
from streamd.golang import gotime
from streamd.recall.answer_size import Candidates
from streamd.recall.wire import Candidate
from streamd.rpc import Server

FAR = "2999-01-01T00:00:00Z"


# Wall time at virtual time 0 in the mock-clock tests: 2026-05-02T00:00:00Z.
WALL0 = 1_777_680_000 * gotime.NS


class Peer:
    """The core's side of the connection: writes frames, reads frames."""

    def __init__(self, stream: trio.StapledStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, *frames: dict[str, Any]) -> None:
        await self.raw(b"".join(json.dumps(f).encode() + b"\n" for f in frames))

    async def recv(self) -> dict[str, Any] | None:
        """The next frame, or None at end of stream."""
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(1 << 16)
            if not chunk:
                assert not self.buf, f"unterminated output at EOF: {bytes(self.buf)!r}"
                return None
            self.buf += chunk
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return json.loads(line)

    async def recv_by_id(self, n: int) -> dict[Any, dict[str, Any]]:
        """The next ``n`` frames, keyed by id: concurrent answers come in any order."""
        frames = {}
        for _ in range(n):
            frame = await self.recv()
            assert frame is not None and frame["id"] not in frames, frame
            frames[frame["id"]] = frame
        return frames

    async def drain(self) -> list[dict[str, Any]]:
        frames = []
        while (frame := await self.recv()) is not None:
            frames.append(frame)
        return frames

    async def close_input(self) -> None:
        await self.stream.send_stream.aclose()


async def inline(fn, *args, limiter=None):
    """Blocking work done on the event loop: Trio's mock clock cannot see a
    thread, so with it a build in a thread would look like idle time."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


@asynccontextmanager
async def session(*, offload: Any = None, **server_options: Any):
    """Yields (peer, ended): ``ended`` is set when Server.serve returns."""
    client, server_end = trio.testing.memory_stream_pair()
    daemon = Daemon() if offload is None else Daemon(offload=offload)
    server = Server(daemon.methods_for, **server_options)
    ended = trio.Event()

    async def serve() -> None:
        await server.serve(server_end, server_end)
        ended.set()

    peer = Peer(client)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            yield peer, ended
        finally:
            # However the test ended, end the session so the nursery can close.
            await peer.close_input()


def req(id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def init(world, id: Any = 1, **settings: Any) -> dict[str, Any]:
    return req(
        id, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
        workdir=str(world.work), source_id="signals", location=str(world.data),
        settings={"files": ["a.jsonl"], **settings},
    )


def search(id: Any, query: str = "", deadline: str = FAR, **extra: Any) -> dict[str, Any]:
    return req(id, "recall/search", query=query, filters=extra.pop("filters", {}), limit=10,
               deadline=deadline, **extra)


def health(id: Any, deadline: str = FAR) -> dict[str, Any]:
    return req(id, "recall/health", deadline=deadline)


def error(frame: dict[str, Any]) -> tuple[Any, int, str]:
    assert "result" not in frame, frame
    return frame["id"], frame["error"]["code"], frame["error"]["message"]


@pytest.fixture
def world(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("sig-1", "2026-05-02T10:00:00Z", title="Deploy td-1", ref="td-1", system="tasks"),
        w.rec("sig-2", "2026-05-02T10:05:00Z", title="Review", text="adapter transcripts"),
    )
    return w


async def initialized(peer: Peer, world, **settings: Any) -> None:
    await peer.send(init(world, **settings))
    frame = await peer.recv()
    assert frame["id"] == 1 and frame["result"]["adapter_id"] == "recall-stream/1", frame


class WatchedCandidates(Candidates):
    """An answer's candidates that remember the most any answer kept at once."""

    most = 0

    def add(self, candidate: Candidate) -> None:
        super().add(candidate)
        WatchedCandidates.most = max(WatchedCandidates.most, len(self.kept))


def watch_candidates(
    monkeypatch: pytest.MonkeyPatch, module: Any, *, raising: bool = True
) -> type[WatchedCandidates]:
    """``module``'s answers built with :class:`WatchedCandidates`, counted from 0."""
    WatchedCandidates.most = 0
    monkeypatch.setattr(module, "Candidates", WatchedCandidates, raising=raising)
    return WatchedCandidates

