"""The Recall stream adapter: handshake, generations, search, expand, health.

State rules (the reference's, kept here so the Trio layer can stay thin):

* A *generation* is one published build: an index view plus the cursors,
  counts and build time that produced it. Once published it never changes;
  searches in flight keep the one they started on.
* Generation ids continue from the workdir's ``cursor.json``, so an id never
  names two builds of one workdir. A failed build publishes nothing and
  consumes no id.
* A build is needed when there is no generation yet, when ``full`` is asked,
  or when any configured file's size differs from its cursor (or it vanished
  or appeared), or it was rewritten. The incremental path appends only the
  bytes after each cursor; a file shorter than its cursor (or gone after
  being read), or whose consumed bytes changed at either end (checked at
  every catch-up) or under a line read back for an answer, was rewritten,
  and the build starts over from nothing (``changes``).
* Records first, then the checkpoint: a build's segments and manifest are
  saved in the workdir (``durable``), then ``cursor.json``. Failing to write
  either never fails a request; health reports ``checkpoint_unwritable``
  until a save succeeds. Every build saves again, and so does a refresh, or
  any catch-up at most every ``SAVE_RETRY_NS``, with nothing new to build
  (``save_again``): a disk that was full and has room again makes the
  published generation durable without waiting for an append. A failed
  save never touches what the last good one wrote. A restart adopts the
  saved index and reads only what was appended since.

Building is a generator that yields between slices of work (None) or a
future of a worker process to wait for, so the scanner task drives it
without blocking the event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

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
from streamd.recall.changes import Change, change, needs_fingerprint
from streamd.recall.index import parallel, streamfile
from streamd.recall.index.build import Consumer
from streamd.recall.index.fingerprint import fingerprint
from streamd.recall.index.index import Index, View
from streamd.recall.index.parallel import Step
from streamd.recall.index.streamfile import Cursor, Span
from streamd.recall.persist.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from streamd.recall.persist.lock import WorkdirLock
from streamd.recall.persist.manifest import DurableIndex
from streamd.recall.query import render
from streamd.recall.query.rank import Hit, Query, Ranked, rank, relevance_of
from streamd.recall.query.rank import query_mode as mode_of
from streamd.recall.records import LineError, Record, parse_line, trim_space
from streamd.recall.settings import SETTINGS_SCHEMA, Settings, parse_settings, resolve_files
from streamd.recall.tokenize import UNICODE_VERSION
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

log = logging.getLogger("streamd.recall")

ADAPTER_ID = "recall-stream/1"
DISPLAY_NAME = "JSONL Stream"
INDEX_CONFIG = "jsonl/1 tokenizer=ident-runs scoring=term-coverage"
# A saved index's tokens depend on the Unicode tables too: one built under
# other tables is rebuilt on start, not reused.
DURABLE_CONFIG = f"{INDEX_CONFIG} unicode={UNICODE_VERSION}"
EPISODE_WINDOW_NS = 15 * 60 * gotime.NS
PROTOCOL_VERSION = 1
# How often a catch-up with nothing to build retries a save that failed (a
# refresh always does): the retry may rewrite every segment held in memory,
# which a burst of searches on a still-full disk should not pay each time.
SAVE_RETRY_NS = 5 * gotime.NS
# How often a long build saves its progress (segments and manifest) for the
# next process to adopt should this one be stopped.
PROGRESS_SAVE_NS = 2 * gotime.NS
# How often a build waiting for another process's workdir lock tries again.
LOCK_POLL_S = 0.05

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


# --- generations ------------------------------------------------------------


@dataclass(slots=True)
class Generation:
    gen: int
    view: View
    files: list[Cursor]
    built_at: int
    latest: int
    consumed: int
    failed: int
    missing: list[str]
    rewritten: bool
    # Set on a prefix published while its build goes on: how far it has come.
    indexing: Progress | None = None
    # Each read file's consumed bytes, summed up (``fingerprint``), as of the
    # build: what every catch-up compares against (``changes``).
    prints: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"gen-{self.gen}"

    @property
    def indexed(self) -> int:
        return self.view.n

    @property
    def complete(self) -> bool:
        return not self.failed and not self.missing and self.indexing is None

    @property
    def coverage(self) -> str:
        return "complete" if self.complete else "partial"

    @property
    def watermark(self) -> str:
        latest = None if self.latest == gotime.ZERO_TIME else self.latest
        return render.watermark(self.consumed, self.indexed, latest)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a build has come: bytes of the stream files indexed, of all
    they held when it started."""

    consumed_bytes: int
    total_bytes: int


class _Interim:
    """What a build does between its steps (see :meth:`StreamAdapter.build`)."""

    def __init__(self, adapter: StreamAdapter, index: Index, state: Consumer, built_at: int,
                 rewritten: bool, cursors: dict[str, Cursor]) -> None:
        self.adapter = adapter
        self.index = index
        self.state = state
        self.built_at = built_at
        self.rewritten = rewritten
        self.cursors = cursors
        self.saved_at = adapter.clock()

    def cursors_now(self, files: list[Cursor], cur: Cursor) -> list[Cursor]:
        """Copies of every file's cursor as of now: the prefix consumed so far."""
        out = [dataclasses.replace(c) for c in (*files, cur)]
        for path in self.adapter.paths[len(out):]:
            old = self.cursors.get(path)
            out.append(dataclasses.replace(old) if old else Cursor(path))
        return out

    def between_steps(self, files: list[Cursor], cur: Cursor) -> None:
        adapter = self.adapter
        if adapter.publish_requested.is_set():
            adapter.publish_requested.clear()
            started = time.monotonic()
            cursors = self.cursors_now(files, cur)
            progress = Progress(sum(c.offset for c in cursors), self.state.bytes_total)
            snap = adapter.publish(self.index, cursors, self.built_at, self.state.latest,
                                   self.rewritten, indexing=progress)
            self.saved_at = adapter.clock()
            adapter.on_publish()
            log.debug("published %s, a prefix of %d records, in %.0f ms", snap.name,
                      snap.indexed, 1000 * (time.monotonic() - started))
        elif adapter.durable is not None and adapter.clock() - self.saved_at >= PROGRESS_SAVE_NS:
            self.save(files, cur)

    def save(self, files: list[Cursor], cur: Cursor) -> None:
        """Segments and manifest for the prefix so far; no generation."""
        if self.adapter.durable is None:
            return
        self.saved_at = self.adapter.clock()
        view = self.index.view(merge=False)
        self.adapter.save_index(view, self.cursors_now(files, cur), self.state.latest)


# --- the adapter ------------------------------------------------------------


def not_initialized() -> RpcError:
    return RpcError(SOURCE_UNAVAILABLE, "stream adapter has not completed a handshake")


class StreamAdapter:
    def __init__(self, clock: Callable[[], int] = time.time_ns, persist: bool = True) -> None:
        """``persist=False`` keeps the index in memory only (one-shot CLI use)."""
        self.clock = clock
        self.persist = persist
        self.durable: DurableIndex | None = None
        self.building: Consumer | None = None  # the pass in progress, for progress reports
        self.ready = False
        self.closed = False
        self.source_id = ""
        self.workdir = ""
        self.paths: list[str] = []
        self.settings = Settings()
        self.gen = 0
        self.prior = Checkpoint()
        self.snap: Generation | None = None
        self.checkpoint_failed = False
        self.saved_at = 0  # clock at the last save attempt
        # Files found rewritten since the published generation (by a catch-up's
        # fingerprints or by a line read back for an answer): the next build
        # starts over. Replaced, never mutated: the build reads it in its thread.
        self.suspect: frozenset[str] = frozenset()
        # Set (from any thread) to have the running build publish the prefix it
        # has read at its next step; on_publish runs (in the build's thread)
        # once it has.
        self.publish_requested = threading.Event()
        self.on_publish: Callable[[], None] = lambda: None

    # handshake

    def initialize(self, p: InitializeParams) -> AdapterManifest:
        offered = min(PROTOCOL_VERSION, p.protocol_version_max)
        if not p.protocol_version_min <= offered <= p.protocol_version_max:
            raise RpcError(
                INVALID_PARAMS,
                f"protocol version {offered} is outside the requested range "
                f"{p.protocol_version_min}..{p.protocol_version_max}",
            )
        settings = parse_settings(p.settings)
        paths = resolve_files(p.location, settings.files)
        if not p.workdir.strip():
            raise RpcError(
                INVALID_PARAMS,
                "stream: handshake supplied no workdir, "
                "and this adapter has nowhere else it may write",
            )
        prior = load_checkpoint(p.workdir)
        self.source_id, self.workdir, self.paths, self.settings = (
            p.source_id, p.workdir, paths, settings,
        )
        self.gen, self.prior, self.snap, self.ready = prior.generation, prior, None, True
        self.durable = DurableIndex(p.workdir, DURABLE_CONFIG) if self.persist else None
        return manifest()

    def check_session(self) -> None:
        if self.closed or not self.ready:
            raise not_initialized()

    def close(self) -> None:
        self.closed, self.ready, self.snap = True, False, None

    # building

    def needs_build(self, full: bool) -> bool:
        """Whether a catch-up must build: no generation yet, ``full`` asked,
        or a file changed (see ``changes``; every file is checked, where the
        reference stops at the first missing one). A file found rewritten is
        remembered, so the build starts over from nothing."""
        if self.snap is None or full or self.suspect:
            return True
        changed = self.changes(self.snap)
        rewritten = {path for path, what in changed.items() if what is Change.REWRITTEN}
        if rewritten:
            self.suspect = self.suspect | rewritten
        return any(what is not Change.NONE for what in changed.values())

    def changes(self, snap: Generation) -> dict[str, Change]:
        """What became of each file since ``snap`` read it (a stat, and the
        two ends of the consumed bytes of each file read)."""
        by_path = {c.path: c for c in snap.files}
        out = {}
        for path in self.paths:
            cur, size = by_path.get(path), streamfile.file_size(path)
            now = fingerprint(path, cur.offset) if cur and needs_fingerprint(cur, size) else ""
            out[path] = change(cur, size, snap.prints.get(path, ""), now)
        return out

    def build(self, full: bool) -> Generator[Step, None, Generation]:
        """Build and publish the next generation, yielding between steps.

        It first takes the workdir's lock (yielding while another process
        holds it), and holds it to its last save. Between steps it publishes
        a prefix of the stream at once when :attr:`publish_requested` is set,
        and saves its progress (segments and manifest, no generation) every
        ``PROGRESS_SAVE_NS``, and once more if it is closed before it ends:
        so a process that is stopped mid-build leaves what it sealed for the
        next one to adopt and continue from."""
        self.check_session()
        lock = WorkdirLock(self.workdir) if self.durable is not None else None
        if lock is not None:
            while not self._try_lock(lock):
                time.sleep(LOCK_POLL_S)
                yield None
        try:
            return (yield from self._build(full))
        finally:
            if lock is not None:
                lock.release()

    def _try_lock(self, lock: WorkdirLock) -> bool:
        try:
            return lock.try_acquire()
        except OSError:
            return True  # nowhere to write: nothing of ours can be clobbered either

    def _build(self, full: bool) -> Generator[Step, None, Generation]:
        built_at = self.clock()
        # Another process may have built here meanwhile: continue its generation
        # numbers, and adopt its index rather than overwrite it with ours.
        self.gen = max(self.gen, load_checkpoint(self.workdir).generation)
        if self.durable is not None and self.durable.written_by_another():
            full_from_disk = True
        else:
            full_from_disk = False
        prev = self.snap if not full and not full_from_disk else None
        cursors: dict[str, Cursor] = {c.path: c for c in prev.files} if prev else {}
        check = cursors or {c.path: c for c in self.prior.files}
        rewritten = bool(self.suspect) or any(
            change(check.get(path), streamfile.file_size(path)) is Change.REWRITTEN
            for path in self.paths)
        index, latest = None, gotime.ZERO_TIME
        if prev is not None and not rewritten:
            index, latest = prev.view.index, prev.latest
            # A failed pass may have added records past the published view.
            index.truncate(prev.view.n)
        elif prev is None and not full and not rewritten:
            index, latest, cursors, rewritten = self._adopt()
        if index is None:
            cursors = {}
            index = Index(self.durable.sink if self.durable else None)
        state = self.building = Consumer(index, built_at, latest)
        state.bytes_total = sum(streamfile.file_size(p) or 0 for p in self.paths)
        state.bytes_start = sum(c.offset for c in cursors.values())
        interim = _Interim(self, index, state, built_at, rewritten, cursors)
        files: list[Cursor] = []
        for file_no, path in enumerate(self.paths):
            old = cursors.get(path)
            cur = Cursor(path, old.offset, old.records, old.failed) if old else Cursor(path)
            with contextlib.closing(parallel.read_into(state, cur, file_no)) as steps:
                try:
                    for step in steps:
                        interim.between_steps(files, cur)
                        yield step
                except GeneratorExit:
                    interim.save(files, cur)  # stopped mid-build: keep what was sealed
                    raise
            files.append(cur)
        missing = [os.path.basename(c.path) for c in files if c.missing]
        if len(missing) == len(self.paths):
            # A source that cannot be read must never look like one with no events.
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"no configured stream file is readable ({', '.join(missing)})",
            )
        return self.publish(index, files, built_at, state.latest, rewritten)

    def publish(
        self, index: Index, files: list[Cursor], built_at: int, latest: int, rewritten: bool,
        indexing: Progress | None = None,
    ) -> Generation:
        """Publish the next generation: records first, then the checkpoint.
        ``indexing`` marks a prefix published while its build goes on."""
        view = index.view(merge=indexing is None)
        prints = {c.path: fingerprint(c.path, c.offset) for c in files if c.offset}
        durable = self.save_index(view, files, latest, prints)
        if rewritten:
            self.suspect = frozenset()  # this build started over: it read them anew
        snap = Generation(
            gen=self.gen + 1,
            view=view,
            files=files,
            built_at=built_at,
            latest=latest,
            consumed=sum(c.offset for c in files),
            failed=sum(c.failed for c in files),
            missing=[os.path.basename(c.path) for c in files if c.missing],
            rewritten=rewritten,
            indexing=indexing,
            prints=prints,
        )
        self.snap, self.gen = snap, snap.gen
        self._checkpoint(snap, durable)
        return snap

    def _adopt(self) -> tuple[Index | None, int, dict[str, Cursor], bool]:
        """Resume from the index a previous process saved in the workdir."""
        if self.durable is None:
            return None, gotime.ZERO_TIME, {}, False
        loaded, rewritten = self.durable.load(self.paths)
        if loaded is None:
            return None, gotime.ZERO_TIME, {}, rewritten
        index = Index(self.durable.sink)
        index.adopt(loaded.segments, loaded.kinds)
        return index, loaded.latest, {c.path: c for c in loaded.files}, False

    def save_due(self, asked: bool) -> bool:
        """Whether to retry a failed save of the published generation now."""
        if self.snap is None or not self.checkpoint_failed:
            return False
        return asked or self.clock() - self.saved_at >= SAVE_RETRY_NS

    def save_again(self) -> None:
        """Save the published generation again: its segments still held in
        memory, the manifest, ``cursor.json``. Its View is swapped for one
        over the segments now mapped from disk: the same records and
        postings, so the generation is unchanged for every reader."""
        snap = self.snap
        if snap is None:
            return
        index = snap.view.index
        # Only the scanner builds and it is not building: anything past the
        # view is a failed pass's leftovers, which the next pass drops too.
        index.truncate(snap.view.n)
        index.flush()
        snap.view = View(index, snap.view.n, index.segments)
        self._checkpoint(snap, self.save_index(snap.view, snap.files, snap.latest, snap.prints))

    def save_index(self, view: View, files: list[Cursor], latest: int,
                   prints: dict[str, str] | None = None) -> bool:
        """Records first: the segments (written as they were sealed, or by
        the flush at publication) and the manifest naming them (with the
        files' ``prints`` when known). True if the index is durable."""
        self.saved_at = self.clock()
        if self.durable is None or not view.on_disk:
            return False
        try:
            self.durable.save(view.segments, files, view.index.kinds, latest, view.n, prints)
        except OSError:
            return False
        return True

    def _checkpoint(self, snap: Generation, durable: bool = True) -> None:
        try:
            save_checkpoint(
                self.workdir,
                Checkpoint(snap.gen, snap.built_at, snap.watermark, snap.files),
            )
            self.checkpoint_failed = not durable
        except OSError:
            self.checkpoint_failed = True

    # reading records back: the index holds no display fields, so the few
    # records an answer shows are re-read by offset. The caller reads the
    # spans (one batch, off the event loop) and hands back the lines.

    def spans(self, snap: Generation, recs: list[int]) -> list[Span]:
        index = snap.view.index
        return [
            Span(self.paths[index.column("file", r)], index.column("offset", r),
                 index.column("line_len", r))
            for r in recs
        ]

    def reread(self, snap: Generation, rec: int, line: bytes | None) -> Record:
        """The record ``rec`` from its re-read line, which must still be it."""
        index = snap.view.index
        try:
            parsed = parse_line(trim_space(line)) if line is not None else None
        except LineError:
            parsed = None
        if (
            parsed is None
            or parsed.id != index.ids[rec]
            or parsed.schema != index.column("schema", rec)
        ):
            path = self.paths[index.column("file", rec)]
            # So that the refresh asked for starts over (see ``changes``).
            self.suspect = self.suspect | {path}
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"{os.path.basename(path)} changed under the index; refresh and retry",
            )
        parsed.observed_at = index.observed_at(rec)
        return parsed

    # search

    def rank(self, snap: Generation, p: SearchParams) -> Ranked:
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
        return rank(snap.view, query, limit)

    def search_result(
        self, snap: Generation, ranked: Ranked, lines: list[bytes | None], started: int
    ) -> SearchResult:
        """``lines``: the lines of ``self.spans(snap, [hit.rec ...])``, in order."""
        candidates = []
        for position, (hit, line) in enumerate(zip(ranked.hits, lines, strict=True), start=1):
            rec = self.reread(snap, hit.rec, line)
            rel = relevance_of(snap.view, hit.rec, ranked.terms, ranked.variants)
            candidates.append(self._candidate(snap, hit, rec, position, rel, ranked.terms))
        diagnostics = SearchDiagnostics(
            coverage=snap.coverage,
            elapsed_ms=(self.clock() - started) // 1_000_000,
            failed_records=snap.failed,
            generation=snap.name,
            indexed=snap.indexed,
            indexing=_indexing(snap),
            matched=ranked.matched,
            missing_files=snap.missing or UNSET,
            query_mode=mode_of(ranked.terms, ranked.any_exact),
            terms=len(ranked.terms),
        )
        return SearchResult(
            candidates=candidates,
            diagnostics=diagnostics,
            source_watermark=snap.watermark,
            outcome="success" if snap.complete else "partial",
        )

    def _candidate(
        self, snap: Generation, hit: Hit, rec: Record, position: int, rel: float,
        terms: list[str],
    ) -> Candidate:
        if hit.exact:
            signal = "exact_identifier"
        elif not terms:
            signal = "field"
        else:
            signal = "lexical"
        upstream = self.settings.upstream.get(rec.system) if rec.system and rec.ref else None
        index = snap.view.index
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
            observed_at=gotime.format_nano(rec.observed_at or snap.built_at),
            confirmed_at=gotime.format_nano(snap.built_at),
            event_time=gotime.format_nano(rec.event_time),
            source_revision=snap.name,
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

    def expand_plan(self, snap: Generation, p: ExpandParams) -> ExpandPlan:
        schema, record_id, local = self.parse_locator(p)
        # Identities are keyed by the canonical "v%d/%s" spelling, as in the
        # reference: "v01/x" names no held identity even though it parses.
        canonical = local == f"v{schema}/{record_id}"
        rec_no = snap.view.by_local(schema, record_id) if canonical else None
        if rec_no is None:
            other = snap.view.first_with_id(record_id)
            if other is not None:
                raise RpcError(
                    LOCATOR_EXPIRED,
                    f"{record_id} is now schema v{snap.view.index.column('schema', other)}, "
                    f"the locator names v{schema}",
                )
            raise RpcError(LOCATOR_EXPIRED, f"{snap.name} holds no record {record_id}")
        episode = self._episode(snap, rec_no) if p.detail == "context" else []
        return ExpandPlan(rec_no, local, episode)

    def expansion(
        self, snap: Generation, p: ExpandParams, plan: ExpandPlan, lines: list[bytes | None]
    ) -> Expansion:
        """``lines``: those of ``self.spans(snap, [plan.rec, *plan.episode])``."""
        rec = self.reread(snap, plan.rec, lines[0])
        episode = [self.reread(snap, r, line)
                   for r, line in zip(plan.episode, lines[1:], strict=True)]
        content = render.expansion(rec, p.detail, episode)
        truncated = p.budget_bytes > 0 and len(content.encode()) > p.budget_bytes
        index = snap.view.index
        name = os.path.basename(self.paths[index.column("file", plan.rec)])
        return Expansion(
            content=render.cut_bytes(content, p.budget_bytes) if truncated else content,
            source_revision=snap.name,
            truncated=truncated,
            truncation_boundary="budget_bytes" if truncated else UNSET,
            provenance=f"{name}@{index.column('offset', plan.rec)} ({plan.local})",
        )

    def _episode(self, snap: Generation, rec: int) -> list[int]:
        """Records within the episode window of ``rec``'s event time, other ids only."""
        import numpy as np

        sec, nsec = snap.view.columns()
        at = int(sec[rec]) * gotime.NS + int(nsec[rec])
        lo, hi = at - EPISODE_WINDOW_NS, at + EPISODE_WINDOW_NS
        ls, ln = divmod(lo, gotime.NS)
        hs, hn = divmod(hi, gotime.NS)
        mask = ((sec > ls) | ((sec == ls) & (nsec >= ln))) & (
            (sec < hs) | ((sec == hs) & (nsec <= hn))
        )
        ids = snap.view.index.ids
        own = ids[rec]
        return [int(r) for r in np.flatnonzero(mask) if ids[r] != own]

    # health

    def health(self, snap: Generation) -> Health:
        degraded = self.checkpoint_failed or not snap.complete or snap.rewritten
        return Health(
            status="degraded" if degraded else "healthy",
            checked_at=gotime.format_nano(self.clock()),
            last_success_at=gotime.format_nano(snap.built_at),
            source_watermark=snap.watermark,
            index_watermark=snap.watermark,
            index_generation=snap.name,
            index_config=INDEX_CONFIG,
            record_count=_count(snap.indexed + snap.failed),
            indexed_count=_count(snap.indexed),
            failed_count=_count(snap.failed),
            coverage=snap.coverage,
            diagnostics=HealthDiagnostics(
                checkpoint_unwritable=True if self.checkpoint_failed else UNSET,
                files=len(snap.files),
                indexing=_indexing(snap),
                missing_files=snap.missing or UNSET,
                stream_rewritten=True if snap.rewritten else UNSET,
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
        snap = self.snap
        if snap is None:
            return Health(
                status="degraded",
                checked_at=gotime.format_nano(self.clock()),
                coverage="partial",
                diagnostics=HealthDiagnostics(files=len(self.paths), indexing=progress),
            )
        h = self.health(snap)
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
        snap, prior = self.snap, self.prior
        if snap is not None:
            h.last_success_at = gotime.format_nano(snap.built_at)
            h.index_watermark = snap.watermark
            h.index_generation = snap.name
            h.indexed_count = _count(snap.indexed)
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


def _indexing(snap: Generation) -> Indexing | UnsetType:
    if snap.indexing is None:
        return UNSET
    return Indexing(consumed_bytes=snap.indexing.consumed_bytes,
                    total_bytes=snap.indexing.total_bytes)


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
