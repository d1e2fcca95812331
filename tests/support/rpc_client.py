"""A JSON-RPC test client with raw newline-delimited frames over a trio stream.

Shared by the eventlog tests (in-memory streams and Unix sockets alike), so they
see exactly the bytes a client would. Imported as a plain module: pytest puts
``tests/`` on ``sys.path`` for the test modules there (rootdir conftest, no
``__init__.py``).
"""

from __future__ import annotations

import json
from typing import Any

import trio


def rpc(request_id: int, method: str, params: Any) -> bytes:
    """One request frame, newline included."""
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(body).encode() + b"\n"


class Client:
    """One connection; responses are matched by id, notifications are kept aside."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""
        self.ids = iter(range(1, 1_000_000))
        self.notifications: list[dict[str, Any]] = []
        self.responses: dict[Any, dict[str, Any]] = {}

    async def send(self, frame: dict[str, Any]) -> None:
        await self.stream.send_all(json.dumps(frame).encode() + b"\n")

    async def frame(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    async def _pump(self) -> None:
        frame = await self.frame()
        if "method" in frame:
            self.notifications.append(frame)
        else:
            self.responses[frame["id"]] = frame

    async def start(self, method: str, params: Any) -> int:
        request_id = next(self.ids)
        await self.stream.send_all(rpc(request_id, method, params))
        return request_id

    async def response(self, request_id: int) -> dict[str, Any]:
        while request_id not in self.responses:
            await self._pump()
        return self.responses.pop(request_id)

    async def first_responses(
        self, request_ids: list[int], count: int
    ) -> dict[int, dict[str, Any]]:
        """The first ``count`` of ``request_ids`` to be answered, whichever they
        are (the daemon runs a connection's requests as tasks, in no set order)."""
        while sum(i in self.responses for i in request_ids) < count:
            await self._pump()
        return {i: self.responses.pop(i) for i in request_ids if i in self.responses}

    async def hang_up(self) -> None:
        """End input, as a client that goes away, and read until the daemon
        ends the connection too (it has cleaned up by then)."""
        await self.stream.send_eof()
        while True:
            try:
                await self._pump()
            except EOFError:
                return

    async def notification(self) -> dict[str, Any]:
        while not self.notifications:
            await self._pump()
        return self.notifications.pop(0)

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        return await self.response(await self.start(method, params))

    async def result(self, method: str, params: Any) -> Any:
        reply = await self.call(method, params)
        assert "result" in reply, reply
        return reply["result"]

    async def error(self, method: str, params: Any) -> dict[str, Any]:
        reply = await self.call(method, params)
        assert "error" in reply, reply
        return reply["error"]
