"""The three clients behind one face, for the client contract suite.

A test is written once, as Trio code, against :class:`Driver`; the ``client``
fixture of ``client/test_contract.py`` gives it the blocking client (its calls
run in a worker thread), the asyncio client (on an asyncio event loop of its
own, in a thread, as a program of the asyncio world runs it: no trio-asyncio
bridge) or the Trio client (in the test's own loop). The daemon is this
process's RPC server and event log on a Unix socket, with ``test/hang``: a
method that waits forever and records how it ended.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from streamd.client import AsyncClient, Client, TrioClient
from streamd.client.protocol import Call
from streamd.eventlog import EventLog
from streamd.eventlog.model import Empty, Entry, Filter, PingParams
from streamd.eventlog.service import eventlog_methods
from streamd.rpc import Method, Request, Server

KINDS = ["sync", "asyncio", "trio"]


@dataclass
class Hang:
    started: trio.Event = field(default_factory=trio.Event)
    cancelled: trio.Event = field(default_factory=trio.Event)

    async def handler(self, p: PingParams, request: Request) -> Empty:
        self.started.set()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")


HANG = Call("test/hang", PingParams(), Empty)


@dataclass
class Daemon:
    """The RPC server on ``path``; :meth:`drop_peers` ends every connection
    from the daemon's side, as a daemon that stops does."""

    log: EventLog
    path: str
    hang: Hang
    _scopes: list[trio.CancelScope] = field(default_factory=list)

    async def handle(self, server: Server, stream: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._scopes.append(scope)
            try:
                await server.serve(stream, stream)
            finally:
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    def drop_peers(self) -> None:
        for scope in self._scopes:
            scope.cancel()


@asynccontextmanager
async def serving(log: EventLog, path: str) -> AsyncIterator[Daemon]:
    hang = Hang()
    methods = [*eventlog_methods(lambda: log), Method("test/hang", PingParams, hang.handler)]
    server = Server(lambda conn: {m.name: m for m in methods})
    daemon = Daemon(log, path, hang)
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen()
    listener = trio.SocketListener(sock)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(trio.serve_listeners, functools.partial(daemon.handle, server),
                              [listener])
        )
        yield daemon
        nursery.cancel_scope.cancel()


class Watch:
    """A watch of any client: ``await w.next()`` is the next entry, or None
    where the client's iteration stops; the watch's error is raised."""

    def __init__(self, watch: Any, step: Callable[[Any], Coroutine[Any, Any, Any]]) -> None:
        self._watch = watch
        self._step = step

    async def next(self) -> Entry | None:
        result: Entry | None = await self._step(self._watch)
        return result

    @property
    def last_seq(self) -> int:
        return int(self._watch.last_seq)


class Lease:
    def __init__(self, lease: Any, driver: Driver) -> None:
        self.lease = lease
        self.lock: str = lease.lock
        self._driver = driver

    def is_lost(self) -> bool:
        return bool(self.lease.lost.is_set())

    async def wait_lost(self) -> None:
        await self._driver.wait_event(self.lease.lost)

    async def release(self) -> None:
        await self._driver.run(self.lease.release)


class Driver:
    """One client of one kind, driven from Trio code."""

    kind: str
    client: Any

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the client's side: its result, awaited
        there when it is a coroutine."""
        raise NotImplementedError

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self.run(getattr(self.client, name), *args, **kwargs)

    async def call_within(self, call: Call[Any], seconds: float) -> Any:
        """``call`` given ``seconds``, cancelled the client's way when they
        pass (TimeoutError)."""
        raise NotImplementedError

    async def wait_event(self, event: Any) -> None:
        raise NotImplementedError

    def watch(
        self, from_seq: int = 0, filter: Filter | None = None, **kw: Any
    ) -> AbstractAsyncContextManager[Watch]:
        raise NotImplementedError

    async def acquire_lock(self, *args: Any, **kwargs: Any) -> Lease:
        return Lease(await self.call("acquire_lock", *args, **kwargs), self)

    @property
    def in_flight(self) -> int:
        return int(self.client.in_flight)

    @property
    def held_leases(self) -> frozenset[str]:
        return frozenset(self.client.held_leases)


class SyncDriver(Driver):
    kind = "sync"

    def __init__(self, client: Client) -> None:
        self.client = client

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def call_within(self, call: Call[Any], seconds: float) -> Any:
        return await self.run(self.client.call, call, timeout=seconds)

    async def wait_event(self, event: Any) -> None:
        assert await self.run(event.wait, 30)

    @asynccontextmanager
    async def watch(
        self, from_seq: int = 0, filter: Filter | None = None, **kw: Any
    ) -> AsyncIterator[Watch]:
        w = await self.run(self.client.watch, from_seq, filter, **kw)
        try:
            yield Watch(w, lambda w: self.run(next, w, None))
        finally:
            w.close()


class AsyncioDriver(Driver):
    kind = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop, client: AsyncClient) -> None:
        self.loop = loop
        self.client = client

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await in_loop(self.loop, fn, *args, **kwargs)

    async def call_within(self, call: Call[Any], seconds: float) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(seconds):
                return await self.client.call(call)

        return await self.run(bounded)

    async def wait_event(self, event: Any) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(30):
                await event.wait()

        await self.run(bounded)

    @asynccontextmanager
    async def watch(
        self, from_seq: int = 0, filter: Filter | None = None, **kw: Any
    ) -> AsyncIterator[Watch]:
        w = await self.run(self.client.watch, from_seq, filter, **kw)
        try:
            yield Watch(w, lambda w: self.run(anext, w, None))
        finally:
            await self.run(w.close)


class TrioDriver(Driver):
    kind = "trio"

    def __init__(self, client: TrioClient) -> None:
        self.client = client

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if isinstance(result, Coroutine):
            result = await result
        return result

    async def call_within(self, call: Call[Any], seconds: float) -> Any:
        try:
            with trio.fail_after(seconds):
                return await self.client.call(call)
        except trio.TooSlowError:
            raise TimeoutError(f"{call.method}: no answer within {seconds:g} s") from None

    async def wait_event(self, event: Any) -> None:
        with trio.fail_after(30):
            await event.wait()

    @asynccontextmanager
    async def watch(
        self, from_seq: int = 0, filter: Filter | None = None, **kw: Any
    ) -> AsyncIterator[Watch]:
        async with self.client.watch(from_seq, filter, **kw) as w:

            async def step(w: Any) -> Entry | None:
                return await anext(w, None)

            yield Watch(w, step)


async def in_loop(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    async def there() -> Any:
        result = fn(*args, **kwargs)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    future = asyncio.run_coroutine_threadsafe(there(), loop)
    return await trio.to_thread.run_sync(future.result)


@asynccontextmanager
async def asyncio_loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    """An asyncio event loop running in a thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="asyncio-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        await trio.to_thread.run_sync(thread.join)
        loop.close()


@asynccontextmanager
async def connected(kind: str, path: str) -> AsyncIterator[Driver]:
    """A client of ``kind`` on the daemon's socket, closed at the end."""
    if kind == "sync":
        client = await trio.to_thread.run_sync(Client.connect_socket, path)
        try:
            yield SyncDriver(client)
        finally:
            await trio.to_thread.run_sync(client.close)
    elif kind == "asyncio":
        async with asyncio_loop() as loop:
            aclient = await in_loop(loop, AsyncClient.connect_socket, path)
            try:
                yield AsyncioDriver(loop, aclient)
            finally:
                await in_loop(loop, aclient.aclose)
    else:
        async with TrioClient.connect_socket(path) as tclient:
            yield TrioDriver(tclient)
