"""The Recall methods on the wire, and the refresh scanner that owns builds.

The scanner is the only task that ever builds a generation. A request that
needs a caught-up generation asks it and awaits what it publishes; requests
that arrive while a build runs are answered together by the next round, so
two concurrent searches never both walk the files, and a search that is
cancelled while waiting leaves the build to finish for everyone else.
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from streamd.errors import INTERNAL_ERROR, RpcError
from streamd.recall.adapter import Generation, StreamAdapter
from streamd.recall.wire import (
    ExpandParams,
    HealthParams,
    InitializeParams,
    RefreshParams,
    SearchParams,
    deadline_of,
)
from streamd.rpc import Connection, Method, Request

log = logging.getLogger("streamd.recall")


@dataclass(slots=True)
class _Ask:
    full: bool
    save: bool  # a refresh: also retry a failed save at once
    done: trio.Event = field(default_factory=trio.Event)
    result: Generation | None = None
    error: RpcError | None = None


class Scanner:
    def __init__(self, adapter: StreamAdapter) -> None:
        self.adapter = adapter
        self._pending: list[_Ask] = []
        self._wake = trio.Event()
        self.builds = 0

    async def current(self, full: bool = False, save: bool = False) -> Generation:
        """A generation that has consumed every complete line the files hold."""
        self.adapter.check_session()
        ask = _Ask(full, save)
        self._pending.append(ask)
        self._wake.set()
        await ask.done.wait()
        if ask.error is not None:
            raise ask.error
        assert ask.result is not None
        return ask.result

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            batch, self._pending = self._pending, []
            full = any(a.full for a in batch)
            save = any(a.save for a in batch)
            try:
                result, error = await self._catch_up(full, save), None
            except RpcError as exc:
                result, error = None, exc
            except Exception as exc:
                # A bug in a build must not take the scanner (and with it the
                # connection) down: the published generation still answers.
                log.exception("index build failed")
                result, error = None, RpcError(INTERNAL_ERROR, f"index build failed: {exc}")
            for ask in batch:
                ask.result, ask.error = result, error
                ask.done.set()

    async def _catch_up(self, full: bool, save: bool) -> Generation:
        adapter = self.adapter
        adapter.check_session()
        if not adapter.needs_build(full):
            assert adapter.snap is not None
            if adapter.save_due(save):
                adapter.save_again()
            return adapter.snap
        steps = adapter.build(full)
        self.builds += 1
        while True:
            try:
                step = next(steps)
            except StopIteration as done:
                return done.value
            if step is not None:
                # Worker processes are building a chunk; wait without the loop.
                await trio.to_thread.run_sync(
                    concurrent.futures.wait, [step], abandon_on_cancel=True
                )
            else:
                # Let requests and cancellations through between slices of work.
                await trio.sleep(0)


class RecallService:
    """One adapter per connection, as one recall-stream process per source."""

    def __init__(self, conn: Connection, adapter: StreamAdapter | None = None) -> None:
        self.adapter = adapter or StreamAdapter()
        self.scanner = Scanner(self.adapter)
        conn.start_soon(self.scanner.run)
        conn.on_close(self._close)

    async def _close(self) -> None:
        self.adapter.close()

    def methods(self) -> list[Method]:
        return [
            Method("recall/initialize", InitializeParams, self.initialize),
            Method("recall/search", SearchParams, self.search, deadline_of),
            Method("recall/expand", ExpandParams, self.expand, deadline_of),
            Method("recall/health", HealthParams, self.health, deadline_of),
            Method("recall/refresh", RefreshParams, self.refresh, deadline_of),
        ]

    async def initialize(self, p: InitializeParams, req: Request) -> dict[str, Any]:
        return self.adapter.initialize(p)

    async def _stall(self) -> None:
        # debug_stall_ms exists so cancellation can be recorded against a real
        # process. Even without it the request passes a checkpoint here, so a
        # deadline already in the past is honoured before any work.
        ms = self.adapter.settings.debug_stall_ms
        await trio.sleep(ms / 1000) if ms > 0 else await trio.lowlevel.checkpoint()

    async def search(self, p: SearchParams, req: Request) -> dict[str, Any]:
        self.adapter.check_session()
        unsupported = [
            name for name, present in (
                ("entities", bool(p.filters.entities)), ("project", bool(p.filters.project)),
            ) if present
        ]
        if unsupported:
            # A broader result is not evidence for the narrower question.
            return {
                "candidates": [],
                "diagnostics": {"unsupported_filters": unsupported},
                "outcome": "skipped",
                "reason": "filter_unsupported",
            }
        await self._stall()
        started = self.adapter.clock()
        snap = await self.scanner.current()
        return self.adapter.search(snap, p, started)

    async def expand(self, p: ExpandParams, req: Request) -> dict[str, Any]:
        self.adapter.check_session()
        self.adapter.parse_locator(p)
        snap = await self.scanner.current()
        return self.adapter.expand(snap, p)

    async def health(self, p: HealthParams, req: Request) -> dict[str, Any]:
        try:
            snap = await self.scanner.current()
        except RpcError as exc:
            return self.adapter.unhealthy(exc)
        return self.adapter.health(snap)

    async def refresh(self, p: RefreshParams, req: Request) -> dict[str, Any]:
        self.adapter.check_session()
        await self._stall()
        snap = await self.scanner.current(p.full, save=True)
        return self.adapter.health(snap)
