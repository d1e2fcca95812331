"""Answers rendered from a generation and the lines read back for it: sans-I/O.

The index holds no display fields, so the few records an answer shows are
re-read by offset: :meth:`Answers.spans` says which byte spans to read, the
caller reads them (``recall.service``, in one batch off the event loop; the
one-shot CLI, in place) and hands the lines back to :meth:`~Answers.search_result`
or :meth:`~Answers.expansion`, which check that each line is still its record
and render the wire result. ``health`` and its variants render the probe from
a generation and the adapter's flags. Nothing here opens, stats or writes a
file, takes a lock or reads a clock other than the injected one.

:class:`Answers` is the half of :class:`~streamd.recall.adapter.StreamAdapter`
that renders; the adapter (the I/O owner) supplies the state it reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from msgspec import UNSET, UnsetType

from streamd.errors import (
    DEADLINE_EXCEEDED,
    INVALID_PARAMS,
    LOCATOR_EXPIRED,
    LOCATOR_UNKNOWN,
    SOURCE_UNAVAILABLE,
    RpcError,
)
from streamd.golang import gotime
from streamd.golang.quote import quote
from streamd.recall.answer_size import Candidates
from streamd.recall.generation import Generation
from streamd.recall.index.build import Consumer
from streamd.recall.index.index import Index
from streamd.recall.index.streamfile import Span
from streamd.recall.persist.checkpoint import Checkpoint
from streamd.recall.query import render
from streamd.recall.query.rank import Hit, Query, Ranked, rank, with_relevances
from streamd.recall.query.rank import query_mode as mode_of
from streamd.recall.records import LineError, Record, parse_line, trim_space
from streamd.recall.settings import SETTINGS_SCHEMA, Settings
from streamd.recall.stop import Stop, check
from streamd.recall.wire import (
    AdapterManifest,
    Candidate,
    CandidateMetadata,
    ExpandParams,
    Expansion,
    FailureDiagnostics,
    Health,
    HealthDiagnostics,
    Indexing,
    InitializeParams,
    SearchDiagnostics,
    SearchParams,
    SearchResult,
)

ADAPTER_ID = "recall-stream/1"
DISPLAY_NAME = "JSONL Stream"
INDEX_CONFIG = "jsonl/1 tokenizer=ident-runs scoring=term-coverage"
EPISODE_WINDOW_NS = 15 * 60 * gotime.NS
PROTOCOL_VERSION = 1


def check_protocol(p: InitializeParams) -> None:
    """Refuse a handshake whose version range excludes the one this speaks."""
    offered = min(PROTOCOL_VERSION, p.protocol_version_max)
    if not p.protocol_version_min <= offered <= p.protocol_version_max:
        raise RpcError(
            INVALID_PARAMS,
            f"protocol version {offered} is outside the requested range "
            f"{p.protocol_version_min}..{p.protocol_version_max}",
        )


def manifest() -> AdapterManifest:
    return AdapterManifest(
        protocol_version=PROTOCOL_VERSION,
        adapter_id=ADAPTER_ID,
        display_name=DISPLAY_NAME,
        record_types=["event", "message"],
        query_modes=["exact", "lexical", "temporal"],
        freshness_modes=["indexed"],
        as_of_support="filter",
        relevance_basis="lexical_span",
        capabilities=["search", "expand", "checkpoint"],
        freshness_policy="indexed: the projection is caught up by byte offset before every "
        "search and on recall/refresh; a shortened file forces a full rebuild",
        sensitivity="internal",
        settings_schema=SETTINGS_SCHEMA,
    )


@dataclass(frozen=True, slots=True)
class ExpandPlan:
    """What an expansion reads: the record, then its episode (for ``context``)."""

    rec: int
    local: str
    episode: list[int]




def read_back(index: Index, rec: int, line: bytes | None) -> Record | None:
    """Record ``rec`` of ``index`` parsed from its line read back, or None when
    that line is no longer the record (its file changed under the index)."""
    try:
        parsed = parse_line(trim_space(line)) if line is not None else None
    except LineError:
        return None
    if parsed is None or parsed.id != index.ids[rec] or \
            parsed.schema != index.column("schema", rec):
        return None
    parsed.observed_at = index.observed_at(rec)
    return parsed


class Answers:
    """The rendering half of the adapter. It reads the session's settings,
    paths and flags, which :class:`~streamd.recall.adapter.StreamAdapter`
    keeps; a line that is no longer its record adds its file to ``suspect``
    (so the next build starts over), the one state it changes."""

    clock: Callable[[], int]
    source_id: str
    paths: list[str]
    settings: Settings
    prior: Checkpoint
    generation: Generation | None
    checkpoint_failed: bool
    building: Consumer | None
    suspect: frozenset[str]

    def spans(self, generation: Generation, recs: list[int]) -> list[Span]:
        # Columns taken whole: a context expand may read back 100,000 lines.
        rows = generation.view.rows()
        at = np.asarray(recs, dtype=np.int64)
        files = rows["file"][at].tolist()
        offsets = rows["offset"][at].tolist()
        lengths = rows["line_len"][at].tolist()
        return [Span(self.paths[f], o, n) for f, o, n in zip(files, offsets, lengths, strict=True)]

    def reread(self, generation: Generation, rec: int, line: bytes | None) -> Record:
        """The record ``rec`` from its re-read line, which must still be it."""
        index = generation.view.index
        parsed = read_back(index, rec, line)
        if parsed is None:
            path = self.paths[index.column("file", rec)]
            # So that the refresh asked for starts over (see ``changes``).
            self.suspect = self.suspect | {path}
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"{os.path.basename(path)} changed under the index; refresh and retry",
            )
        return parsed

    # search

    def rank(self, generation: Generation, p: SearchParams, stop: Stop | None = None) -> Ranked:
        """The search's hits and their relevances; raises ``Stopped`` once
        ``stop`` is set (see ``recall.stop``)."""
        limit = self.settings.limit
        if 0 < p.limit < limit:
            limit = p.limit
        query = Query(
            text=p.query,
            since=p.filters.since_ns,
            until=p.filters.until_ns,
            as_of=p.as_of_ns,
            record_types=tuple(p.filters.record_types or ()),
        )
        return with_relevances(generation.view, rank(generation.view, query, limit, stop), stop)

    def search_result(
        self, generation: Generation, ranked: Ranked, lines: list[bytes | None], started: int,
        max_bytes: int | None = None, stop: Stop | None = None,
    ) -> SearchResult:
        """``lines``: the lines of ``self.spans(generation, [hit.rec ...])``, in
        order; ``ranked`` as :meth:`rank` made it (with its relevances). Raises
        ``Stopped`` once ``stop`` is set: a ``max_candidates`` of millions
        renders a candidate for every match; ``AnswerTooLarge`` when the
        result would encode past ``max_bytes``, keeping no more candidates
        once it knows (:mod:`~streamd.recall.answer_size`)."""
        candidates = Candidates(max_bytes)
        rels = ranked.relevances
        assert rels is not None, "ranked by Answers.rank, which scores relevances"
        for position, (hit, line, rel) in enumerate(
                zip(ranked.hits, lines, rels, strict=True), start=1):
            check(stop)
            rec = self.reread(generation, hit.rec, line)
            candidates.add(self._candidate(generation, hit, rec, position, rel, ranked.terms))
        diagnostics = SearchDiagnostics(
            coverage=generation.coverage,
            elapsed_ms=(self.clock() - started) // 1_000_000,
            failed_records=generation.failed,
            generation=generation.name,
            indexed=generation.indexed,
            indexing=_indexing(generation),
            matched=ranked.matched,
            missing_files=generation.missing or UNSET,
            query_mode=mode_of(ranked.terms, ranked.any_exact),
            terms=len(ranked.terms),
        )
        return candidates.result(lambda kept: SearchResult(
            candidates=kept,
            diagnostics=diagnostics,
            source_watermark=generation.watermark,
            outcome="success" if generation.complete else "partial",
        ))

    def _candidate(
        self, generation: Generation, hit: Hit, rec: Record, position: int, rel: float,
        terms: list[str],
    ) -> Candidate:
        if hit.exact:
            signal = "exact_identifier"
        elif not terms:
            signal = "field"
        else:
            signal = "lexical"
        upstream = self.settings.upstream.get(rec.system) if rec.system and rec.ref else None
        index = generation.view.index
        return Candidate(
            candidate_id=rec.local,
            source_record_id=rec.id,
            locator=f"{self.source_id}:{rec.local}",
            derived_from=[f"{upstream}:{rec.ref}"] if upstream is not None else UNSET,
            record_type=rec.kind,
            title=rec.title,
            excerpt=render.clip(rec.text, render.EXCERPT_BYTES) or UNSET,
            local_rank=position,
            local_score=_number(hit.score),
            relevance=_number(rel),
            match_signals=[signal],
            observed_at=gotime.format_nano(rec.observed_at or generation.built_at),
            confirmed_at=gotime.format_nano(generation.built_at),
            event_time=gotime.format_nano(rec.event_time),
            source_revision=generation.name,
            sensitivity="internal",
            metadata=CandidateMetadata(
                actor=rec.actor or UNSET,
                byte_offset=index.column("offset", hit.rec),
                file=os.path.basename(self.paths[index.column("file", hit.rec)]),
                ref=rec.ref or UNSET,
                schema=rec.schema,
                system=rec.system or UNSET,
                upstream_revision=rec.revision or UNSET,
            ),
        )

    # expand

    def parse_locator(self, p: ExpandParams) -> tuple[int, str, str]:
        local = p.locator.split(":", 1)[1]
        version, sep, record_id = local.partition("/")
        if not sep or not version.startswith("v") or not record_id:
            raise RpcError(
                LOCATOR_UNKNOWN, f"{quote(local)} is not a stream locator, want v<schema>/<id>"
            )
        schema = _go_atoi(version[1:])
        if schema is None or schema < 1:
            raise RpcError(LOCATOR_UNKNOWN, f"{quote(local)} names no schema version")
        return schema, record_id, local

    def expand_plan(self, generation: Generation, p: ExpandParams,
                    stop: Stop | None = None) -> ExpandPlan:
        schema, record_id, local = self.parse_locator(p)
        # Identities are keyed by the canonical "v%d/%s" spelling, as in the
        # reference: "v01/x" names no held identity even though it parses.
        canonical = local == f"v{schema}/{record_id}"
        rec_no = generation.view.by_local(schema, record_id) if canonical else None
        if rec_no is None:
            other = generation.view.first_with_id(record_id)
            if other is not None:
                raise RpcError(
                    LOCATOR_EXPIRED,
                    f"{record_id} is now schema v{generation.view.index.column('schema', other)}, "
                    f"the locator names v{schema}",
                )
            raise RpcError(LOCATOR_EXPIRED, f"{generation.name} holds no record {record_id}")
        episode = []
        if p.detail == "context":
            episode = self._episode(generation, rec_no, stop,
                                    render.episode_lines_within(p.budget_bytes))
        return ExpandPlan(rec_no, local, episode)

    def expansion(
        self, generation: Generation, p: ExpandParams, plan: ExpandPlan, lines: list[bytes | None],
        stop: Stop | None = None,
    ) -> Expansion:
        """``lines``: those of ``self.spans(generation, [plan.rec, *plan.episode])``.
        Raises ``Stopped`` once ``stop`` is set: an episode may be 100,000
        records to parse."""
        rec = self.reread(generation, plan.rec, lines[0])
        episode = []
        for r, line in zip(plan.episode, lines[1:], strict=True):
            check(stop)
            episode.append(self.reread(generation, r, line))
        content = render.expansion(rec, p.detail, episode)
        truncated = p.budget_bytes > 0 and len(content.encode()) > p.budget_bytes
        index = generation.view.index
        name = os.path.basename(self.paths[index.column("file", plan.rec)])
        return Expansion(
            content=render.cut_bytes(content, p.budget_bytes) if truncated else content,
            source_revision=generation.name,
            truncated=truncated,
            truncation_boundary="budget_bytes" if truncated else UNSET,
            provenance=f"{name}@{index.column('offset', plan.rec)} ({plan.local})",
        )

    def _episode(self, generation: Generation, rec: int, stop: Stop | None,
                 most: int | None) -> list[int]:
        """Records within the episode window of ``rec``'s event time, other ids
        only, in stream order; the first ``most`` of them (all for None)."""
        sec, nsec = generation.view.columns()
        at = int(sec[rec]) * gotime.NS + int(nsec[rec])
        lo, hi = at - EPISODE_WINDOW_NS, at + EPISODE_WINDOW_NS
        ls, ln = divmod(lo, gotime.NS)
        hs, hn = divmod(hi, gotime.NS)
        mask = ((sec > ls) | ((sec == ls) & (nsec >= ln))) & (
            (sec < hs) | ((sec == hs) & (nsec <= hn))
        )
        ids = generation.view.index.ids
        own = ids[rec]
        out: list[int] = []
        for r in np.flatnonzero(mask).tolist():
            if len(out) == most:
                break
            check(stop)
            if ids[r] != own:
                out.append(r)
        return out

    # health

    def health(self, generation: Generation) -> Health:
        degraded = self.checkpoint_failed or not generation.complete or generation.rewritten
        return Health(
            status="degraded" if degraded else "healthy",
            checked_at=gotime.format_nano(self.clock()),
            last_success_at=gotime.format_nano(generation.built_at),
            source_watermark=generation.watermark,
            index_watermark=generation.watermark,
            index_generation=generation.name,
            index_config=INDEX_CONFIG,
            record_count=_count(generation.indexed + generation.failed),
            indexed_count=_count(generation.indexed),
            failed_count=_count(generation.failed),
            coverage=generation.coverage,
            diagnostics=HealthDiagnostics(
                checkpoint_unwritable=True if self.checkpoint_failed else UNSET,
                files=len(generation.files),
                indexing=_indexing(generation),
                missing_files=generation.missing or UNSET,
                stream_rewritten=True if generation.rewritten else UNSET,
            ),
        )

    def health_while_building(self) -> Health:
        """A probe answered while a build runs longer than a probe should
        wait: the published generation (if any) and how far the build has
        come, degraded and partial, without publishing anything."""
        state = self.building
        progress = Indexing(
            consumed_bytes=(state.bytes_start + state.bytes_done) if state else 0,
            total_bytes=state.bytes_total if state else 0,
        )
        generation = self.generation
        if generation is None:
            return Health(
                status="degraded",
                checked_at=gotime.format_nano(self.clock()),
                coverage="partial",
                diagnostics=HealthDiagnostics(files=len(self.paths), indexing=progress),
            )
        h = self.health(generation)
        h.status, h.coverage = "degraded", "partial"
        assert isinstance(h.diagnostics, HealthDiagnostics)
        h.diagnostics.indexing = progress
        return h

    def unhealthy(self, err: RpcError) -> Health:
        """A failed probe, still naming the generation that is answering."""
        h = Health(
            status="unavailable",
            checked_at=gotime.format_nano(self.clock()),
            coverage="unknown",
            diagnostics=FailureDiagnostics(reason=failure_reason(err)),
        )
        generation, prior = self.generation, self.prior
        if generation is not None:
            h.last_success_at = gotime.format_nano(generation.built_at)
            h.index_watermark = generation.watermark
            h.index_generation = generation.name
            h.indexed_count = _count(generation.indexed)
        elif prior.generation > 0:
            if prior.updated_at is not None:
                h.last_success_at = gotime.format_nano(prior.updated_at)
            h.index_watermark = prior.watermark or UNSET
            h.index_generation = f"gen-{prior.generation}"
        return h



def failure_reason(err: RpcError) -> str:
    if err.code == DEADLINE_EXCEEDED:
        return "deadline_exceeded"
    if err.code == SOURCE_UNAVAILABLE:
        return "unreachable"
    return "adapter_error"


def _indexing(generation: Generation) -> Indexing | UnsetType:
    if generation.indexing is None:
        return UNSET
    return Indexing(consumed_bytes=generation.indexing.consumed_bytes,
                    total_bytes=generation.indexing.total_bytes)


def _count(value: int) -> int | UnsetType:
    # The reference leaves zero counts out.
    return value or UNSET


def _number(x: float) -> float | int:
    # Go writes an integral float64 without a fraction (1, not 1.0).
    return int(x) if x.is_integer() else x


def _go_atoi(s: str) -> int | None:
    """Go's strconv.Atoi: optional sign, ASCII digits only."""
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body or not body.isascii() or not body.isdigit():
        return None
    value = int(s)
    return value if -(1 << 63) <= value < (1 << 63) else None
