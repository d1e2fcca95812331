"""The Recall methods on the wire, over a source's adapter and scanner.

A connection's source is its own (plain ``streamd``: one process per source,
as Recall runs the reference) or, in the resident daemon, one shared through
a :class:`~streamd.recall.sources.SourceRegistry` by every connection that
names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec
import trio

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.recall.adapter import StreamAdapter
from streamd.recall.answer_size import AnswerTooLarge
from streamd.recall.index.streamfile import Span, read_spans
from streamd.recall.scanner import Offload, Scanner, answer_threads, stoppable, to_thread
from streamd.recall.sources import Source, SourceRegistry, StreamSource
from streamd.recall.wire import (
    AdapterManifest,
    ExpandParams,
    Expansion,
    Health,
    HealthParams,
    InitializeParams,
    RefreshParams,
    SearchParams,
    SearchResult,
    SkipDiagnostics,
    deadline_of,
)
from streamd.rpc import Connection, Method, Request
from streamd.rpc.protocol import oversized_result, result_room

log = logging.getLogger("streamd.recall")

T = TypeVar("T")


class RecallService:
    """The Recall methods of one connection."""

    def __init__(
        self,
        conn: Connection,
        adapter: StreamAdapter | None = None,
        offload: Offload = to_thread,
        sources: SourceRegistry | None = None,
        client_dir: Callable[[], str | None] | None = None,
    ) -> None:
        """``client_dir``: where the peer's relative paths start, when that is
        not this process's working directory (the resident daemon runs in
        ``/``; the client says its own directory in ``streamd/hello``)."""
        self.offload = offload
        self.threads = answer_threads()  # this connection's, for its answers
        self.client_dir = client_dir
        self.sources = sources
        self.adapter = adapter or StreamAdapter()
        self.scanner = Scanner(self.adapter, offload)
        # The shared source this connection holds, in a resident daemon.
        self.source: Source[StreamSource] | None = None
        if sources is None:
            conn.start_soon(self.scanner.run)
        conn.on_close(self._close)

    async def _close(self) -> None:
        if self.source is not None:
            assert self.sources is not None  # a source is only held from a registry
            self.sources.release(self.source)
            self.source = None
        else:
            self.adapter.close()

    def methods(self) -> list[Method]:
        return [
            Method("recall/initialize", InitializeParams, self.initialize),
            # Bulk: an answer can be megabytes (rpc/server, rpc/held).
            Method("recall/search", SearchParams, self.search, deadline_of, bulk=True),
            Method("recall/expand", ExpandParams, self.expand, deadline_of, bulk=True),
            Method("recall/health", HealthParams, self.health, deadline_of),
            Method("recall/refresh", RefreshParams, self.refresh, deadline_of),
        ]

    async def initialize(self, p: InitializeParams, req: Request) -> AdapterManifest:
        if self.client_dir is not None:
            p = anchored(p, self.client_dir())
        if self.sources is None:
            return self.adapter.initialize(p)
        source, manifest = self.sources.open(p)
        if self.source is not None:
            self.sources.release(self.source)  # a second handshake names a new source
        self.source = source
        self.adapter, self.scanner = source.served.adapter, source.served.scanner
        return manifest

    async def _stall(self) -> None:
        # debug_stall_ms exists so cancellation can be recorded against a real
        # process. Even without it the request passes a checkpoint here, so a
        # deadline already in the past is honoured before any work.
        ms = self.adapter.settings.debug_stall_ms
        await trio.sleep(ms / 1000) if ms > 0 else await trio.lowlevel.checkpoint()

    async def search(self, p: SearchParams, req: Request) -> SearchResult:
        self.adapter.check_session()
        unsupported = [
            name for name, present in (
                ("entities", bool(p.filters.entities)), ("project", bool(p.filters.project)),
            ) if present
        ]
        if unsupported:
            # A broader result is not evidence for the narrower question.
            return SearchResult(
                candidates=[],
                diagnostics=SkipDiagnostics(unsupported_filters=unsupported),
                outcome="skipped",
                reason="filter_unsupported",
            )
        await self._stall()
        started = self.adapter.clock()
        generation = await self.scanner.current(deadline=req.scope.deadline)
        with self._answering():
            ranked = await self._work(self.adapter.rank, generation, p)
            recs = [hit.rec for hit in ranked.hits]
            lines = await self._read(self.adapter.spans(generation, recs))
            try:
                return await self._work(self.adapter.search_result, generation, ranked, lines,
                                        started, result_room(req.id, req.max_frame))
            except AnswerTooLarge as exc:
                raise oversized_result(req.id, exc.size, req.max_frame) from None

    async def expand(self, p: ExpandParams, req: Request) -> Expansion:
        self.adapter.check_session()
        self.adapter.parse_locator(p)
        generation = await self.scanner.current(deadline=req.scope.deadline)
        with self._answering():
            plan = await self._work(self.adapter.expand_plan, generation, p)
            lines = await self._read(self.adapter.spans(generation, [plan.rec, *plan.episode]))
            return await self._work(self.adapter.expansion, generation, p, plan, lines)

    async def health(self, p: HealthParams, req: Request) -> Health:
        try:
            generation = await self.scanner.settled(deadline=req.scope.deadline)
        except RpcError as exc:
            return self.adapter.unhealthy(exc)
        if generation is None:
            return self.adapter.health_while_building()
        return self.adapter.health(generation)

    async def refresh(self, p: RefreshParams, req: Request) -> Health:
        self.adapter.check_session()
        await self._stall()
        generation = await self.scanner.current(p.full, save=True, deadline=req.scope.deadline)
        return self.adapter.health(generation)

    async def _work(self, fn: Callable[..., T], *args: Any) -> T:
        """An answer's work in this connection's threads, stopped with its
        request (``scanner.stoppable``)."""
        return await stoppable(self.offload, self.threads, fn, *args)

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """Time an answer from a generation in hand, for the scanner's reserve
        (a request that runs out of time meanwhile is timed too: its time is
        what the reserve must learn)."""
        started = trio.current_time()
        try:
            yield
        finally:
            self.scanner.answered(trio.current_time() - started)

    async def _read(self, spans: list[Span]) -> list[bytes | None]:
        """The lines an answer renders, read in one batch off the event loop."""
        return await self.offload(read_spans, spans) if spans else []


def anchored(p: InitializeParams, base: str | None) -> InitializeParams:
    """The handshake with a relative ``location`` and ``workdir`` joined to the
    client's directory ``base``, so that they mean what they would to a
    ``streamd`` the client ran itself. Without a ``base`` a relative one is
    refused: resolved against this process's directory it would name
    somewhere the client never meant."""
    relative = {
        name: value.strip() for name, value in (("location", p.location), ("workdir", p.workdir))
        if value.strip() and not os.path.isabs(value.strip())
    }
    if not relative:
        return p
    if base is None:
        raise RpcError(
            INVALID_PARAMS,
            f"recall/initialize: a relative {' and '.join(relative)} needs the client's "
            "directory, which this connection did not give (streamd/hello's cwd); give "
            "absolute paths",
        )
    return msgspec.structs.replace(
        p, **{name: os.path.join(base, value) for name, value in relative.items()}
    )
