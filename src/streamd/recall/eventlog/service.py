"""The Recall methods of one connection, over an event-log source.

``streamd --eventlog`` and ``streamd attach --eventlog`` serve these in place
of the stream adapter's. The handshake's ``location`` is the log, read by
the same parser as ``--db`` (:mod:`~streamd.eventlog.dbtarget`): a SQLite
file, or a server's URL or connection string. A relative SQLite path starts
at the client's directory, as the stream adapter's paths do. A SQLite file
that does not exist is refused rather than created (a typo would otherwise
index an empty log and answer every search with nothing), unless
``debug_seed`` builds it. ``location`` is never repeated in an answer: it
may hold a password.

A connection's source is its own (``streamd --eventlog``), or in the
resident daemon one shared through the
:class:`~streamd.recall.sources.SourceRegistry` by every connection that
names the same log, workdir, source id and settings.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import msgspec
import trio

from streamd.errors import INVALID_PARAMS, SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import dbtarget
from streamd.eventlog.dbtarget import DbTarget
from streamd.eventlog.requests import LogRequests
from streamd.recall.answer_size import AnswerTooLarge
from streamd.recall.answers import check_protocol
from streamd.recall.eventlog.answers import LogAnswers, unavailable
from streamd.recall.eventlog.context import context_rows
from streamd.recall.eventlog.settings import LogSettings, manifest, parse_settings
from streamd.recall.eventlog.source import LogSource
from streamd.recall.query.rank import with_relevances
from streamd.recall.scanner import Offload, answer_threads, stoppable, to_thread
from streamd.recall.sources import Source, SourceRegistry
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

__all__ = ["LogOpener", "LogRecallService", "log_target", "same_log"]

Hosting = Callable[[], AbstractAsyncContextManager[Any]]
LogOpener = Callable[[DbTarget], Awaitable[tuple[LogRequests, Hosting | None]]]
"""The log a target names: its operations, and how to host it for as long
as a source runs (None for a log already hosted, such as the daemon's own)."""

T = TypeVar("T")

# How many times a search ranks again after finding hits deleted under it.
_RERANKS = 3


def not_initialized() -> RpcError:
    return RpcError(SOURCE_UNAVAILABLE, "eventlog adapter has not completed a handshake")


def log_target(location: str, base: str | None, settings: LogSettings) -> DbTarget:
    """The log ``location`` names (see the module docstring)."""
    if not location.strip():
        raise RpcError(INVALID_PARAMS, "eventlog: handshake supplied no location (the log: "
                       "a SQLite file, or a postgresql:// or mysql:// URL)")
    try:
        target = dbtarget.classify(location.strip(), origin="argument")
    except dbtarget.DbTargetError as exc:
        raise RpcError(INVALID_PARAMS, f"eventlog location: {exc}") from None
    if target.path is None:
        return target
    path = os.path.expanduser(str(target.path))
    if not os.path.isabs(path):
        if base is None:
            raise RpcError(INVALID_PARAMS, "eventlog location: a relative path needs the "
                           "client's directory, which this connection did not give "
                           "(streamd/hello's cwd); give an absolute path")
        path = os.path.join(base, path)
    target = dbtarget.classify(os.fspath(os.path.normpath(path)), origin="argument")
    assert target.path is not None
    if settings.debug_seed:
        problem = target.file_error()
        if problem:
            raise RpcError(INVALID_PARAMS, f"eventlog location: {problem}")
    elif not target.path.is_file():
        raise RpcError(SOURCE_UNAVAILABLE, "eventlog location: no event log database there "
                       "(a file path that does not exist is refused, not created)")
    return target


def _file_identity(target: DbTarget) -> str:
    """The SQLite file at the target's path as the system knows it (device
    and inode), "" for a server's database."""
    if target.path is None:
        return ""
    try:
        st = os.stat(target.path)
    except OSError:
        return ""  # gone: the open that follows says so
    return f"{st.st_dev}:{st.st_ino}"


def same_log(a: DbTarget, b: DbTarget) -> bool:
    """Whether two targets are one database (the same file, or the same
    connection string)."""
    if a.path is not None and b.path is not None:
        return os.path.realpath(a.path) == os.path.realpath(b.path)
    return a.kind == b.kind and a.conninfo == b.conninfo


class LogRecallService:
    """The Recall methods of one connection over an event log."""

    def __init__(
        self,
        conn: Connection,
        open_log: LogOpener,
        *,
        offload: Offload = to_thread,
        sources: SourceRegistry | None = None,
        client_dir: Callable[[], str | None] | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.conn = conn
        self.open_log = open_log
        self.offload = offload
        self.threads = answer_threads()  # this connection's, for its answers
        self.sources = sources
        self.client_dir = client_dir
        self.clock = clock
        self.source: LogSource | None = None
        self.answers: LogAnswers | None = None
        self._held: Source[LogSource] | None = None
        self._scope: trio.CancelScope | None = None  # our own source's, without a registry
        conn.on_close(self._close)

    def methods(self) -> list[Method]:
        return [
            Method("recall/initialize", InitializeParams, self.initialize),
            # Bulk: an answer can be megabytes (rpc/server, rpc/held).
            Method("recall/search", SearchParams, self.search, deadline_of, bulk=True),
            Method("recall/expand", ExpandParams, self.expand, deadline_of, bulk=True),
            Method("recall/health", HealthParams, self.health, deadline_of),
            Method("recall/refresh", RefreshParams, self.refresh, deadline_of),
        ]

    async def _close(self) -> None:
        self._let_go()

    def _let_go(self) -> None:
        if self._held is not None:
            assert self.sources is not None
            self.sources.release(self._held)
            self._held = None
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
        self.source = None

    async def initialize(self, p: InitializeParams, req: Request) -> AdapterManifest:
        check_protocol(p)
        settings = parse_settings(p.settings)
        base = self.client_dir() if self.client_dir is not None else os.getcwd()
        target = log_target(p.location, base, settings)
        workdir = p.workdir.strip()
        if not workdir:
            raise RpcError(INVALID_PARAMS, "eventlog: handshake supplied no workdir, "
                           "and this adapter has nowhere else it may write")
        if not os.path.isabs(workdir):
            if base is None:
                raise RpcError(INVALID_PARAMS, "eventlog workdir: a relative path needs the "
                               "client's directory; give an absolute path")
            workdir = os.path.join(base, workdir)
        requests, hosting = await self.open_log(target)

        def make() -> LogSource:
            return LogSource(requests, settings, workdir, hosting=hosting, offload=self.offload)

        self._let_go()  # a second handshake names a new source
        if self.sources is not None:
            identity = os.path.realpath(target.path) if target.path else target.conninfo
            named = ("eventlog", workdir, p.source_id, identity,
                    msgspec.json.encode(msgspec.to_builtins(settings)).decode())
            # A log the source opens itself is the file it found at the path:
            # once another file is renamed there (a restore), the open source
            # answers source_unavailable for good, so the next handshake opens
            # a source of its own on the file there now, and the old one goes.
            key = (*named, _file_identity(target) if hosting is not None else "")
            self.sources.close_idle(lambda other: other[:-1] == named and other != key)
            self._held = self.sources.hold(key, make)
            self.source = self._held.served
        else:
            self.source = source = make()
            self._scope = scope = trio.CancelScope()

            async def host() -> None:
                with scope:
                    await source.run()

            self.conn.start_soon(host)
        self.answers = LogAnswers(p.source_id, settings)
        return manifest()

    def _session(self) -> tuple[LogSource, LogAnswers]:
        if self.source is None or self.answers is None or self.source.closed:
            raise not_initialized()
        return self.source, self.answers

    async def _stall(self, settings: LogSettings) -> None:
        ms = settings.debug_stall_ms
        await trio.sleep(ms / 1000) if ms > 0 else await trio.lowlevel.checkpoint()

    async def search(self, p: SearchParams, req: Request) -> SearchResult:
        source, answers = self._session()
        unsupported = [name for name, present in (
            ("entities", bool(p.filters.entities)), ("project", bool(p.filters.project)),
        ) if present]
        if unsupported:
            return SearchResult(
                candidates=[], diagnostics=SkipDiagnostics(unsupported_filters=unsupported),
                outcome="skipped", reason="filter_unsupported",
            )
        await self._stall(answers.settings)
        started = self.clock()
        generation = await source.current(deadline=req.scope.deadline)
        with self._answering(source):
            gone: set[int] = set()
            for _ in range(_RERANKS):
                ranked = await self._work(answers.rank, generation, p,
                                         frozenset(gone))
                recs = [hit.rec for hit in ranked.hits]
                rows = await source.rows_at([generation.seq_of(r) for r in recs])
                lost = answers.gone(generation, recs, rows)
                if not lost:
                    break
                # Deleted after this generation was published: never shown,
                # and masked from the next generation on.
                gone.update(lost)
                source.forget(lost)
            else:
                ranked.hits = [hit for hit in ranked.hits if hit.rec not in gone]
            ranked = await self._work(with_relevances, generation.view, ranked)
            elapsed_ms = (self.clock() - started) // 1_000_000
            try:
                return await self._work(answers.search_result, generation, ranked, rows,
                                        elapsed_ms, result_room(req.id, req.max_frame))
            except AnswerTooLarge as exc:
                raise oversized_result(req.id, exc.size, req.max_frame) from None

    async def expand(self, p: ExpandParams, req: Request) -> Expansion:
        source, answers = self._session()
        generation = await source.current(deadline=req.scope.deadline)
        with self._answering(source):
            plan = answers.expand_target(generation, p)
            seq = generation.seq_of(plan.rec)
            row = (await source.rows_at([seq])).get(seq)
            around = []
            if row is not None and p.detail == "context":
                around = await context_rows(source, answers, generation, plan.rec, row)
            if row is None or row[4] != generation.view.index.ids[plan.rec]:
                source.forget([plan.rec])
            return answers.expansion(generation, p, plan, row, around)

    async def health(self, p: HealthParams, req: Request) -> Health:
        try:
            source, answers = self._session()
        except RpcError as exc:
            # A probe is answered before the handshake too, as the stream
            # adapter and the reference answer it: unavailable, not an error.
            return unavailable(exc, self.clock())
        try:
            generation = await source.settled(deadline=req.scope.deadline)
        except RpcError as exc:
            return answers.unhealthy(exc, self.clock(), source.generation)
        if generation is None:
            return answers.while_building(source.generation, self.clock())
        return answers.health(generation, self.clock(), source.checkpoint_failed)

    async def refresh(self, p: RefreshParams, req: Request) -> Health:
        source, answers = self._session()
        await self._stall(answers.settings)
        generation = await source.current(full=p.full, deadline=req.scope.deadline)
        return answers.health(generation, self.clock(), source.checkpoint_failed)

    async def _work(self, fn: Callable[..., T], *args: Any) -> T:
        """An answer's work in this connection's threads, stopped with its
        request (``scanner.stoppable``)."""
        return await stoppable(self.offload, self.threads, fn, *args)

    @contextlib.contextmanager
    def _answering(self, source: LogSource) -> Iterator[None]:
        started = trio.current_time()
        try:
            yield
        finally:
            source.answered(trio.current_time() - started)
