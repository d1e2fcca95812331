"""In-memory server ends for the RPC layer's tests: one that counts the
server's writes, and one whose peer has stopped reading."""

from __future__ import annotations

import trio


class CountingStream(trio.abc.HalfCloseableStream):
    """One end of an in-memory pair that counts the server's writes."""

    def __init__(self, inner: trio.StapledStream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class StalledStream(CountingStream):
    """A peer that stopped reading: the server's writes block until released."""

    def __init__(self, inner: trio.StapledStream) -> None:
        super().__init__(inner)
        self.release = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        await self.release.wait()
        await self.inner.send_all(data)
