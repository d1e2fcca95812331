"""Recall sources shared by every connection of a resident daemon.

Recall spawns an adapter per command and shuts it down after a few requests.
Through ``streamd attach`` each of those is one connection to the resident
daemon, and this registry is what lets the work outlive it:

* A source is what one handshake names: the same workdir, source id, files
  and settings are the same source, whichever connection asks. It has one
  adapter and one refresh scanner, hosted here, not by any connection, so a
  build goes on after the request (and the connection) that started it is
  gone, the next connection finds the index warm, and generation numbers stay
  monotonic per source.
* A source no connection holds is closed after ``idle_close`` seconds (its
  build, if any, is stopped and saves its progress; its index is dropped, its
  workdir keeps it). At most ``max_open`` sources stay open: opening one more
  closes the least recently used idle one first, which is what bounds the
  memory the daemon keeps per source (the index of a source's records:
  about 250 MB of ids and columns per million records, plus mapped segment
  pages the kernel may reclaim).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import trio

from streamd.recall.adapter import StreamAdapter
from streamd.recall.scanner import Offload, Scanner, to_thread
from streamd.recall.wire import AdapterManifest, InitializeParams

log = logging.getLogger("streamd.recall")

DEFAULT_IDLE_CLOSE = 600.0
DEFAULT_MAX_OPEN = 8


class Hosted(Protocol):
    """What a registry hosts for a source: its tasks, and how it refuses
    requests once closed."""

    async def run(self) -> None: ...

    def close(self) -> None: ...


H = TypeVar("H", bound=Hosted)


@dataclass(eq=False, slots=True)
class StreamSource:
    """A stream source: its adapter and the scanner that builds for it."""

    adapter: StreamAdapter
    scanner: Scanner

    async def run(self) -> None:
        await self.scanner.run()

    def close(self) -> None:
        self.adapter.close()


@dataclass(eq=False, slots=True)
class Source(Generic[H]):
    key: tuple[str, ...]
    served: H
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    users: int = 0
    idle_since: float = math.inf  # Trio time when the last user left


class SourceRegistry:
    def __init__(
        self,
        *,
        idle_close: float = DEFAULT_IDLE_CLOSE,
        max_open: int = DEFAULT_MAX_OPEN,
        offload: Offload = to_thread,
    ) -> None:
        self.idle_close = idle_close
        self.max_open = max_open
        self.offload = offload
        # Least recently used first.
        self._open: OrderedDict[tuple[str, ...], Source[Any]] = OrderedDict()
        self._nursery_cm: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def sources(self) -> list[Source[Any]]:
        """The open sources, least recently used first."""
        return list(self._open.values())

    async def __aenter__(self) -> SourceRegistry:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._close_idle)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._nursery is not None and self._nursery_cm is not None
        for source in list(self._open.values()):
            self._close(source)
        self._nursery.cancel_scope.cancel()
        self._nursery = None
        return await self._nursery_cm.__aexit__(exc_type, exc, tb)

    def open(self, p: InitializeParams) -> tuple[Source[StreamSource], AdapterManifest]:
        """The stream source this handshake names, opened if it is not yet,
        and held for the caller until :meth:`release`. Raises what the
        handshake's validation raises (RpcError), opening nothing."""
        adapter = StreamAdapter()
        manifest = adapter.initialize(p)
        key = ("stream", p.workdir, p.source_id, *adapter.paths,
               json.dumps(p.settings, sort_keys=True, default=str))
        return self.hold(key, lambda: StreamSource(adapter, Scanner(adapter, self.offload))), \
            manifest

    def hold(self, key: tuple[str, ...], make: Callable[[], H]) -> Source[H]:
        """The source of ``key``, made and hosted if it is not open yet, and
        held for the caller until :meth:`release`."""
        if self._nursery is None:
            raise RuntimeError("SourceRegistry.hold outside `async with registry`")
        source = self._open.get(key)
        if source is None:
            self._make_room()
            source = Source(key, make())
            self._open[key] = source
            self._nursery.start_soon(self._host, source)
        self._open.move_to_end(key)
        source.users += 1
        source.idle_since = math.inf
        return source

    def close_idle(self, superseded: Callable[[tuple[str, ...]], bool]) -> None:
        """Close now every source no connection holds whose key ``superseded``
        says another has taken the place of (its log's file replaced at the
        path, say), rather than after its idle time: it would only save an
        index of what is gone over the newer source's."""
        for source in [s for s in self._open.values() if s.users == 0 and superseded(s.key)]:
            self._close(source)

    def release(self, source: Source[Any]) -> None:
        source.users -= 1
        if source.users == 0:
            source.idle_since = trio.current_time()
            self._changed.set()

    async def _host(self, source: Source[Any]) -> None:
        with source.scope:
            await source.served.run()

    def _make_room(self) -> None:
        while len(self._open) >= self.max_open:
            idle = next((s for s in self._open.values() if s.users == 0), None)
            if idle is None:
                log.warning("more than %d Recall sources in use at once", self.max_open)
                return
            self._close(idle)

    def _close(self, source: Source[Any]) -> None:
        if self._open.get(source.key) is source:
            del self._open[source.key]
        # The scanner's build (if any) is told to stop, saves its progress
        # and kills its workers; the adapter refuses further requests.
        source.scope.cancel()
        source.served.close()
        log.info("closed Recall source %s", source.key[2])

    async def _close_idle(self) -> None:
        while True:
            now = trio.current_time()
            due = [s for s in self._open.values()
                   if s.users == 0 and now - s.idle_since >= self.idle_close]
            for source in due:
                self._close(source)
            wake = min((s.idle_since + self.idle_close for s in self._open.values()
                        if s.users == 0), default=math.inf)
            self._changed = trio.Event()
            with trio.move_on_at(wake):
                await self._changed.wait()
