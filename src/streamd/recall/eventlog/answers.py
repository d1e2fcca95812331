"""The event-log source's answers, rendered from a generation and rows read back: sans-I/O.

The index holds no display fields, so the few events an answer shows are
read back from the log by seq (the Trio layer reads them; see ``source``)
and projected again, which gives the very line that was indexed. A row that
is gone, or holds another event, was deleted: a search leaves it out (and
the index masks it from then on), an expand answers the protocol's expired
locator error.

Locators are ``<source_id>:v2/<event id>``: an event id is the log's own
unique name for an event, so a locator survives restarts and rebuilds.
``context`` shows the event's neighbours in its session, ``CONTEXT_TURNS``
before and after (the same invocation's, when the event has one and it has
neighbours), each as one line, within the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from msgspec import UNSET

from streamd.errors import LOCATOR_EXPIRED, LOCATOR_UNKNOWN, RpcError
from streamd.eventlog.store import EventRow
from streamd.golang import gotime
from streamd.recall.answer_size import Candidates
from streamd.recall.answers import failure_reason
from streamd.recall.eventlog.build import LogGeneration
from streamd.recall.eventlog.project import line
from streamd.recall.eventlog.settings import INDEX_CONFIG, SENSITIVITY, LogSettings
from streamd.recall.query import render
from streamd.recall.query.rank import Hit, Query, Ranked, rank
from streamd.recall.query.rank import query_mode as mode_of
from streamd.recall.records import Record, parse_line, trim_space
from streamd.recall.stop import Stop, check
from streamd.recall.tokenize import fold
from streamd.recall.wire import (
    Candidate,
    ExpandParams,
    Expansion,
    FailureDiagnostics,
    Health,
    LogCandidateMetadata,
    LogHealthDiagnostics,
    SearchDiagnostics,
    SearchParams,
    SearchResult,
)

__all__ = ["CONTEXT_TURNS", "ExpandPlan", "LogAnswers", "same_session", "unavailable"]

CONTEXT_TURNS = 3
_SCHEMA = 2  # every projected record's


@dataclass(frozen=True, slots=True)
class ExpandPlan:
    rec: int
    local: str


def record_of_row(row: EventRow) -> Record:
    """The record a row projects to (the line format's own parser reads it)."""
    return parse_line(trim_space(line(row)))


class LogAnswers:
    def __init__(self, source_id: str, settings: LogSettings) -> None:
        self.source_id = source_id
        self.settings = settings

    # search

    def rank(self, generation: LogGeneration, p: SearchParams,
             gone: frozenset[int] = frozenset(), stop: Stop | None = None) -> Ranked:
        """The best records, never a removed one (nor one of ``gone``, found
        deleted while this answer was read back); raises ``Stopped`` once
        ``stop`` is set (``recall.stop``)."""
        limit = self.settings.limit
        if 0 < p.limit < limit:
            limit = p.limit
        removed = generation.removed
        if gone:
            removed = removed.copy()
            removed[np.fromiter(gone, dtype=np.int64)] = True
        query = Query(
            text=p.query, since=p.filters.since_ns, until=p.filters.until_ns,
            as_of=p.as_of_ns, record_types=tuple(p.filters.record_types or ()),
            removed=removed,
        )
        return rank(generation.view, query, limit, stop)

    def gone(self, generation: LogGeneration, recs: list[int],
             rows: dict[int, EventRow]) -> list[int]:
        """Which of ``recs`` the rows read back show deleted."""
        ids = generation.view.index.ids
        out = []
        for rec in recs:
            row = rows.get(generation.seq_of(rec))
            if row is None or row[4] != ids[rec]:
                out.append(rec)
        return out

    def search_result(self, generation: LogGeneration, ranked: Ranked,
                      rows: dict[int, EventRow], elapsed_ms: int,
                      max_bytes: int | None = None, stop: Stop | None = None) -> SearchResult:
        """``rows``: the hits' rows by seq, every one present (see ``gone``);
        ``ranked`` with the relevances of its hits (``with_relevances``).
        Raises ``Stopped`` once ``stop`` is set; ``AnswerTooLarge`` when the
        result would encode past ``max_bytes``, keeping no more candidates
        once it knows (:mod:`~streamd.recall.answer_size`), as the stream
        source does."""
        candidates = Candidates(max_bytes)
        rels = ranked.relevances
        assert rels is not None and len(rels) == len(ranked.hits), "relevances of these hits"
        for position, (hit, rel) in enumerate(zip(ranked.hits, rels, strict=True), start=1):
            check(stop)
            row = rows[generation.seq_of(hit.rec)]
            candidates.add(self._candidate(generation, hit, row, position, rel, ranked.terms))
        diagnostics = SearchDiagnostics(
            coverage=generation.coverage,
            elapsed_ms=elapsed_ms,
            failed_records=generation.failed,
            generation=generation.name,
            indexed=generation.indexed,
            matched=ranked.matched,
            query_mode=mode_of(ranked.terms, ranked.any_exact),
            terms=len(ranked.terms),
        )
        return candidates.result(lambda kept: SearchResult(
            candidates=kept,
            diagnostics=diagnostics,
            source_watermark=generation.watermark,
            outcome="success" if generation.complete else "partial",
        ))

    def _candidate(self, generation: LogGeneration, hit: Hit, row: EventRow, position: int,
                   rel: float, terms: list[str]) -> Candidate:
        rec = record_of_row(row)
        seq, app, user, session, _, invocation, author, branch = row[:8]
        signal = "exact_identifier" if hit.exact else "lexical" if terms else "field"
        when = gotime.format_nano(rec.event_time)
        return Candidate(
            candidate_id=rec.local,
            source_record_id=rec.id,
            locator=f"{self.source_id}:{rec.local}",
            record_type=rec.kind,
            title=rec.title,
            excerpt=render.clip(rec.text, render.EXCERPT_BYTES) or UNSET,
            local_rank=position,
            local_score=_number(hit.score),
            relevance=_number(rel),
            match_signals=[signal],
            observed_at=when,
            confirmed_at=gotime.format_nano(generation.built_at),
            event_time=when,
            source_revision=generation.name,
            sensitivity=SENSITIVITY,
            metadata=LogCandidateMetadata(
                actor=author or UNSET, app=app, branch=branch or UNSET,
                invocation=invocation or UNSET, seq=seq, session=session, user=user,
            ),
        )

    # expand

    def expand_target(self, generation: LogGeneration, p: ExpandParams) -> ExpandPlan:
        """The record a locator names; the session's records come once its
        row says which session it is (``session_records``)."""
        local = p.locator.split(":", 1)[1]
        version, sep, event_id = local.partition("/")
        if not sep or not version.startswith("v") or not event_id:
            raise RpcError(LOCATOR_UNKNOWN,
                           f"{local!r} is not an event locator, want v{_SCHEMA}/<event id>")
        rec = generation.view.by_local(_SCHEMA, event_id) if version == f"v{_SCHEMA}" else None
        if rec is None or generation.removed[rec]:
            raise RpcError(LOCATOR_EXPIRED, f"{generation.name} holds no event {event_id}")
        return ExpandPlan(rec, local)

    def session_records(self, generation: LogGeneration, rec: int,
                        session: str) -> tuple[np.ndarray, int]:
        """Records that may be of ``rec``'s session, sorted, and where ``rec``
        is among them (an empty array when it is not). Only may: the session's
        name is an identifier that also names other users' sessions of that
        name, and any app, user, branch or invocation so named; the rows read
        back decide (:func:`same_session`)."""
        recs = generation.view.identified(fold(session))
        recs = recs[~generation.removed[recs]]
        at = int(np.searchsorted(recs, rec))
        if at == len(recs) or recs[at] != rec:
            return recs[:0], 0
        return recs, at

    def expansion(self, generation: LogGeneration, p: ExpandParams, plan: ExpandPlan,
                  row: EventRow | None, around: list[EventRow]) -> Expansion:
        """``row``: the event's row read back (None when it is gone);
        ``around``: its neighbours' rows, for ``context``."""
        if row is None or row[4] != generation.view.index.ids[plan.rec]:
            raise RpcError(LOCATOR_EXPIRED, f"event {plan.local.partition('/')[2]} was deleted")
        rec = record_of_row(row)
        content = render.expansion(rec, "full" if p.detail == "context" else p.detail, [])
        if p.detail == "context":
            content += _context(row, around)
        truncated = p.budget_bytes > 0 and len(content.encode()) > p.budget_bytes
        return Expansion(
            content=render.cut_bytes(content, p.budget_bytes) if truncated else content,
            source_revision=generation.name,
            truncated=truncated,
            truncation_boundary="budget_bytes" if truncated else UNSET,
            provenance=f"event log seq {row[0]} ({plan.local})",
        )

    # health

    def health(self, generation: LogGeneration, now: int, checkpoint_failed: bool,
               behind: int = 0) -> Health:
        behind = max(behind, generation.behind)
        degraded = checkpoint_failed or bool(generation.failed) or bool(behind)
        return Health(
            status="degraded" if degraded else "healthy",
            checked_at=gotime.format_nano(now),
            last_success_at=gotime.format_nano(generation.built_at),
            source_watermark=generation.watermark,
            index_watermark=generation.watermark,
            index_generation=generation.name,
            index_config=INDEX_CONFIG,
            record_count=(generation.indexed + generation.failed) or UNSET,
            indexed_count=generation.indexed or UNSET,
            failed_count=generation.failed or UNSET,
            coverage="partial" if behind or generation.failed else "complete",
            diagnostics=LogHealthDiagnostics(
                behind=behind or UNSET,
                checkpoint_unwritable=True if checkpoint_failed else UNSET,
                removed=generation.removed_count or UNSET,
                seq=generation.seq,
            ),
        )

    def while_building(self, generation: LogGeneration | None, now: int) -> Health:
        """A probe answered while a round runs longer than a probe waits: the
        published generation, if any, degraded and partial."""
        if generation is None:
            return Health(status="degraded", checked_at=gotime.format_nano(now),
                          coverage="partial", diagnostics=LogHealthDiagnostics(seq=0))
        h = self.health(generation, now, False)
        h.status, h.coverage = "degraded", "partial"
        return h

    def unhealthy(self, err: RpcError, now: int, generation: LogGeneration | None) -> Health:
        """An unreachable log is unavailable, never an empty success; the
        generation that would answer is still named."""
        h = unavailable(err, now)
        if generation is not None:
            h.last_success_at = gotime.format_nano(generation.built_at)
            h.index_watermark = generation.watermark
            h.index_generation = generation.name
            h.indexed_count = generation.indexed or UNSET
        return h


def unavailable(err: RpcError, now: int) -> Health:
    """A probe that found no log to answer from (``err`` says why)."""
    return Health(
        status="unavailable",
        checked_at=gotime.format_nano(now),
        coverage="unknown",
        diagnostics=FailureDiagnostics(reason=failure_reason(err)),
    )


def same_session(row: EventRow, other: EventRow) -> bool:
    """Whether ``other`` is of ``row``'s session (its app, user and name)."""
    return other[3] == row[3] and other[1] == row[1] and other[2] == row[2]


def _context(row: EventRow, others: list[EventRow]) -> str:
    seq, session, invocation = row[0], row[3], row[5]
    same = [o for o in others if same_session(row, o)]
    if invocation:
        mine = [o for o in same if o[5] == invocation]
        if mine:
            same = mine
    before = [o for o in same if o[0] < seq][-CONTEXT_TURNS:]
    after = [o for o in same if o[0] > seq][:CONTEXT_TURNS]
    lines = [f"\n\nSession {session}:"]
    for o in before:
        lines.append(_turn(o))
    lines.append(f"\n> this event (seq {seq})")
    for o in after:
        lines.append(_turn(o))
    return "".join(lines)


def _turn(row: EventRow) -> str:
    rec = record_of_row(row)
    return (f"\n- {rec.local} {gotime.format_seconds(rec.event_time)} {rec.actor or '-'}: "
            f"{render.clip(rec.title, render.CONTEXT_TITLE_BYTES)}")


def _number(x: float) -> float | int:
    return int(x) if x.is_integer() else x
