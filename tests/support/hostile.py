"""Hostile frames and a peer that sends them."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

FAR = "2999-01-01T00:00:00Z"


HEALTH = b'{"jsonrpc":"2.0","id":"ping","method":"recall/health","params":{"deadline":"' + (
    FAR.encode() + b'"}}\n'
)


# Frames that ended the process before (exit 1, every client dropped), with the
# answer each gets now: (id, code).
INVALID_UTF8 = {
    "method": (b'{"jsonrpc":"2.0","id":1,"method":"\xff"}', (None, -32700)),
    "id": (b'{"jsonrpc":"2.0","id":"\xff","method":"recall/health"}', (None, -32700)),
    "params key": (
        b'{"jsonrpc":"2.0","id":3,"method":"recall/health","params":{"\xff":1}}', (3, -32602),
    ),
    "params value": (
        b'{"jsonrpc":"2.0","id":4,"method":"recall/health","params":{"deadline":"\xed\xa0\x80"}}',
        (4, -32602),
    ),
    "event content": (
        b'{"jsonrpc":"2.0","id":5,"method":"eventlog/append","params":{"app":"a","user":"u",'
        b'"session":"s","event":{"id":"e","author":"x","content":"\xc3"}}}',
        (5, -32602),
    ),
    "cancel params": (b'{"jsonrpc":"2.0","method":"recall/cancel","params":{"id":"\xff"}}', None),
    "shutdown params": (
        b'{"jsonrpc":"2.0","id":7,"method":"recall/shutdown","params":{"\xff":1}}', (7, -32602),
    ),
}


DEEP = {
    "985 arrays in params": (
        b'{"jsonrpc":"2.0","id":1,"method":"recall/health","params":'
        + b"[" * 985 + b"]" * 985 + b"}"
    ),
    "100k objects at the top": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "100k arrays, never closed": b"[" * 100_000,
}


def frames_of(*frames: bytes) -> bytes:
    return b"".join(f + b"\n" for f in frames)


class Peer:
    """The client's side of a connection: raw bytes out, frames in."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = b""

    async def raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, *frames: dict[str, Any]) -> None:
        await self.raw(frames_of(*(json.dumps(f).encode() for f in frames)))

    async def recv(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(1 << 16)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    async def pinged(self) -> None:
        """The connection is alive: a health request is answered."""
        await self.raw(HEALTH)
        frame = await self.recv()
        assert frame["id"] == "ping" and "result" in frame, frame


def answer(frame: dict[str, Any]) -> tuple[Any, int]:
    assert "error" in frame, frame
    return frame["id"], frame["error"]["code"]


def request(id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}

