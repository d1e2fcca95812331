"""The Recall stream adapter: handshake, builds, publishing and saving.

This module is the adapter's one I/O owner: it reads and writes the workdir
(``cursor.json``, the saved segments and manifest), stats and fingerprints
the stream files, reads them through a build, and polls the workdir lock.
What an answer looks like is :mod:`~streamd.recall.answers`'s (sans-I/O),
which :class:`StreamAdapter` extends.

State rules (the reference's, kept here so the Trio layer can stay thin):

* A *generation* (:mod:`~streamd.recall.generation`) is one published build.
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
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Generator

import numpy as np

from streamd import heap
from streamd.errors import (
    INVALID_PARAMS,
    SOURCE_UNAVAILABLE,
    RpcError,
)
from streamd.golang import gotime
from streamd.recall.answers import INDEX_CONFIG, Answers, check_protocol, manifest, read_back
from streamd.recall.changes import Change, change, needs_fingerprint
from streamd.recall.generation import Generation, Progress
from streamd.recall.index import parallel, streamfile
from streamd.recall.index.build import Consumer
from streamd.recall.index.fingerprint import fingerprint
from streamd.recall.index.index import Index, View
from streamd.recall.index.parallel import Step
from streamd.recall.index.segment import Damaged
from streamd.recall.index.streamfile import Cursor, Span, read_spans
from streamd.recall.persist.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from streamd.recall.persist.lock import WorkdirLock
from streamd.recall.persist.manifest import DurableIndex
from streamd.recall.settings import Settings, parse_settings, resolve_files
from streamd.recall.tokenize import UNICODE_VERSION
from streamd.recall.wire import (
    AdapterManifest,
    InitializeParams,
)

log = logging.getLogger("streamd.recall")

# A saved index's tokens depend on the Unicode tables too: one built under
# other tables is rebuilt on start, not reused.
DURABLE_CONFIG = f"{INDEX_CONFIG} unicode={UNICODE_VERSION}"
# How often a catch-up with nothing to build retries a save that failed (a
# refresh always does): the retry may rewrite every segment held in memory,
# which a burst of searches on a still-full disk should not pay each time.
SAVE_RETRY_NS = 5 * gotime.NS
# How often a long build saves its progress (segments and manifest) for the
# next process to adopt should this one be stopped.
PROGRESS_SAVE_NS = 2 * gotime.NS
# How often a build waiting for another process's workdir lock tries again.
LOCK_POLL_S = 0.05
# Passes a build makes before it gives up on files replaced while they are read.
REPLACED_PASSES = 3


class _Interim:
    """What a build does between its steps (see :meth:`StreamAdapter.build`)."""

    def __init__(self, adapter: StreamAdapter, index: Index, state: Consumer, built_at: int,
                 rewritten: bool, cursors: dict[str, Cursor], read_from: int) -> None:
        self.adapter = adapter
        self.read_from = read_from  # where the records this pass reads start
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
            # Not read by this pass yet: no file of this pass to hold it to.
            out.append(dataclasses.replace(old, identity=None) if old else Cursor(path))
        return out

    def between_steps(self, files: list[Cursor], cur: Cursor) -> None:
        adapter = self.adapter
        if adapter.publish_requested.is_set():
            adapter.publish_requested.clear()
            started = time.monotonic()
            cursors = self.cursors_now(files, cur)
            progress = Progress(sum(c.offset for c in cursors), self.state.bytes_total)
            try:
                generation = adapter.publish(self.index, cursors, self.built_at,
                                             self.state.latest, self.rewritten, indexing=progress,
                                             read_from=self.read_from)
            except streamfile.Replaced:
                adapter.publish_requested.set()  # asked still: the next pass's first step
                raise
            self.saved_at = adapter.clock()
            adapter.on_publish()
            log.debug("published %s, a prefix of %d records, in %.0f ms", generation.name,
                      generation.indexed, 1000 * (time.monotonic() - started))
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


def _why(exc: OSError | None) -> str:
    """What the system said of a failed write ("No space left on device")."""
    if exc is None or not exc.errno:
        return ""
    return os.strerror(exc.errno)


def not_initialized() -> RpcError:
    return RpcError(SOURCE_UNAVAILABLE, "stream adapter has not completed a handshake")


class StreamAdapter(Answers):
    def __init__(self, clock: Callable[[], int] = time.time_ns, persist: bool = True,
                 locked_check: Callable[[], None] | None = None) -> None:
        """``persist=False`` keeps the index in memory only (one-shot CLI use).
        ``locked_check`` runs at the start of every build, once the workdir's
        lock is held, and may refuse the workdir by raising: a command for
        people that refuses an index of other files must look again there,
        since the workdir it looked at before may have been filled by the
        process it then waited for."""
        self.clock = clock
        self.persist = persist
        self.locked_check = locked_check
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
        self.generation: Generation | None = None
        self.checkpoint_failed = False
        # Why the last save failed, in the system's words ("No space left on
        # device"); "" when it did not, or nothing says.
        self.save_error = ""
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
        check_protocol(p)
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
        self.gen, self.prior, self.generation, self.ready = prior.generation, prior, None, True
        self.durable = DurableIndex(p.workdir, DURABLE_CONFIG) if self.persist else None
        return manifest()

    def check_session(self) -> None:
        if self.closed or not self.ready:
            raise not_initialized()

    def close(self) -> None:
        self.closed, self.ready, self.generation = True, False, None

    # building

    def needs_build(self, full: bool) -> bool:
        """Whether a catch-up must build: no generation yet, ``full`` asked,
        or a file changed (see ``changes``; every file is checked, where the
        reference stops at the first missing one). Whether a file was
        rewritten is the build's to find (``_pass``), as it then is: one seen
        gone, or cut short, may be back as it was by then (a copy put back),
        and a build that failed meanwhile (it was the only file) must not
        leave it marked rewritten for good."""
        if self.generation is None or full or self.suspect:
            return True
        changed = self.changes(self.generation)
        return any(what is not Change.NONE for what in changed.values())

    def changes(self, generation: Generation) -> dict[str, Change]:
        """What became of each file since ``generation`` read it (a stat, and the
        two ends of the consumed bytes of each file read)."""
        by_path = {c.path: c for c in generation.files}
        out = {}
        for path in self.paths:
            cur, size = by_path.get(path), streamfile.file_size(path)
            now = fingerprint(path, cur.offset) if cur and needs_fingerprint(cur, size) else ""
            out[path] = change(cur, size, generation.prints.get(path, ""), now)
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
        before = self.generation.indexed if self.generation is not None else 0
        try:
            if self.locked_check is not None:
                self.locked_check()
            generation = yield from self._build(full)
        finally:
            if lock is not None:
                lock.release()
        # A rebuild counts from nothing: all its records were allocated anew.
        heap.after_build(generation.indexed - (0 if full else min(before, generation.indexed)))
        return generation

    def _try_lock(self, lock: WorkdirLock) -> bool:
        try:
            return lock.try_acquire()
        except OSError as exc:
            if exc.errno != errno.EISDIR:
                # No workdir, nowhere to write, or no flock on this file
                # system: nothing of ours can be clobbered, or nothing to do.
                return True
            # A directory at the lock's path: the index could still be
            # written, by two processes at once.
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"the workdir's lock file {lock.path} cannot be used: {_why(exc)}",
            ) from None

    def _build(self, full: bool) -> Generator[Step, None, Generation]:
        """:meth:`_pass`, started over from nothing when a file was replaced
        while it was read (what the pass read would be of two files): as for
        a file found rewritten, the next pass reads it anew and reports it."""
        for _ in range(REPLACED_PASSES - 1):
            try:
                return (yield from self._pass(full))
            except streamfile.Replaced as exc:
                log.info("%s was replaced while it was read; reading it anew",
                         os.path.basename(exc.path))
                self.suspect = self.suspect | {exc.path}
        try:
            return (yield from self._pass(full))
        except streamfile.Replaced as exc:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"{os.path.basename(exc.path)} was replaced while it was read,"
                f" {REPLACED_PASSES} times in a row",
            ) from None

    def _pass(self, full: bool) -> Generator[Step, None, Generation]:
        built_at = self.clock()
        # Another process may have built here meanwhile: continue its generation
        # numbers, and adopt its index rather than overwrite it with ours.
        self.gen = max(self.gen, load_checkpoint(self.workdir).generation)
        if self.durable is not None and self.durable.written_by_another():
            full_from_disk = True
        else:
            full_from_disk = False
        prev = self.generation if not full and not full_from_disk else None
        cursors: dict[str, Cursor] = {c.path: c for c in prev.files} if prev else {}
        now: list[Change]
        if prev is not None:
            # The ends of what was read are compared too (``changes``), as
            # at every catch-up.
            now = list(self.changes(prev).values())
        else:
            check = cursors or {c.path: c for c in self.prior.files}
            now = [change(check.get(path), streamfile.file_size(path)) for path in self.paths]
        rewritten = bool(self.suspect) or Change.REWRITTEN in now
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
        read_from = len(index)
        state = self.building = Consumer(index, built_at, latest)
        state.bytes_total = sum(streamfile.file_size(p) or 0 for p in self.paths)
        state.bytes_start = sum(c.offset for c in cursors.values())
        interim = _Interim(self, index, state, built_at, rewritten, cursors, read_from)
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
                    # Stopped mid-build: keep what was sealed (unless the file
                    # was replaced meanwhile: then it is of another file).
                    with contextlib.suppress(streamfile.Replaced):
                        interim.save(files, cur)
                    raise
            files.append(cur)
        missing = [os.path.basename(c.path) for c in files if c.missing]
        if len(missing) == len(self.paths):
            # A source that cannot be read must never look like one with no events.
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"no configured stream file is readable ({', '.join(missing)})",
            )
        return self.publish(index, files, built_at, state.latest, rewritten, read_from=read_from)

    def publish(
        self, index: Index, files: list[Cursor], built_at: int, latest: int, rewritten: bool,
        indexing: Progress | None = None, read_from: int = 0,
    ) -> Generation:
        """Publish the next generation: records first, then the checkpoint.
        ``indexing`` marks a prefix published while its build goes on;
        ``read_from`` is where the records this pass read start."""
        view = index.view(merge=indexing is None)
        prints = {c.path: fingerprint(c.path, c.offset, c.identity) for c in files if c.offset}
        # After the prints: a rewrite after this check shows against them.
        self._check_still_read(view, read_from)
        # A file's identity belongs to the pass that read it: a later save of
        # this generation (``save_again``) must not hold the file to it.
        files = [dataclasses.replace(c, identity=None) for c in files]
        durable = self.save_index(view, files, latest, prints)
        if rewritten:
            self.suspect = frozenset()  # this build started over: it read them anew
        generation = Generation(
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
        self.generation, self.gen = generation, generation.gen
        self._checkpoint(generation, durable)
        return generation

    def _check_still_read(self, view: View, read_from: int) -> None:
        """Raise ``Replaced`` for a file rewritten in place (truncated and
        written again: the same file, so its identity does not tell) after
        this pass read it: the first and last records the pass took of each
        file must still be the lines at their offsets. Else the generation
        would hold the old bytes' records under the new bytes' prints, and no
        catch-up would notice. (What earlier passes read was compared at this
        pass's start, ``changes``.)"""
        rows = view.index.columns.view(view.n)[read_from:]
        for file_no, path in enumerate(self.paths):
            mine = rows["file"] == file_no
            if not mine.any():
                continue
            recs = sorted({int(np.argmax(mine)), len(mine) - 1 - int(np.argmax(mine[::-1]))})
            spans = [Span(path, int(rows["offset"][r]), int(rows["line_len"][r])) for r in recs]
            try:
                lines = read_spans(spans)
            except RpcError:
                continue  # unreadable just now: the next catch-up says so
            for r, line in zip(recs, lines, strict=True):
                if read_back(view.index, read_from + r, line) is None:
                    raise streamfile.Replaced(path)

    def _adopt(self) -> tuple[Index | None, int, dict[str, Cursor], bool]:
        """Resume from the index a previous process saved in the workdir."""
        if self.durable is None:
            return None, gotime.ZERO_TIME, {}, False
        try:
            loaded, rewritten = self.durable.load(self.paths)
            if loaded is None:
                return None, gotime.ZERO_TIME, {}, rewritten
            index = Index(self.durable.sink)
            index.adopt(loaded.segments, loaded.kinds)
        except Damaged as exc:
            log.warning("the saved index is damaged (%s): indexing anew", exc)
            return None, gotime.ZERO_TIME, {}, False
        return index, loaded.latest, {c.path: c for c in loaded.files}, False

    def save_due(self, asked: bool) -> bool:
        """Whether to retry a failed save of the published generation now."""
        if self.generation is None or not self.checkpoint_failed:
            return False
        return asked or self.clock() - self.saved_at >= SAVE_RETRY_NS

    def save_again(self) -> None:
        """Save the published generation again: its segments still held in
        memory, the manifest, ``cursor.json``. Its View is swapped for one
        over the segments now mapped from disk: the same records and
        postings, so the generation is unchanged for every reader."""
        generation = self.generation
        if generation is None:
            return
        # The workdir has one writer at a time (``persist.lock``), this save
        # too: it removes the segments its manifest does not name, which
        # while another process builds are that build's fresh ones.
        lock = WorkdirLock(self.workdir) if self.durable is not None else None
        try:
            if lock is not None and not self._try_lock(lock):
                self.saved_at = self.clock()  # another's turn: retry later
                return
        except RpcError:
            return  # the lock cannot be used: the next build says so, by name
        try:
            if self._saved_by_another(generation):
                # Ours is older than what is saved: written again, it would
                # undo that save (its segments removed, the checkpoint's
                # generation gone back, so ids would be handed out twice).
                # The workdir holds a whole index; the next build adopts it.
                self.checkpoint_failed, self.save_error = False, ""
                return
            index = generation.view.index
            # Only the scanner builds and it is not building: anything past the
            # view is a failed pass's leftovers, which the next pass drops too.
            index.truncate(generation.view.n)
            index.flush()
            generation.view = View(index, generation.view.n, index.segments)
            saved = self.save_index(generation.view, generation.files, generation.latest,
                                    generation.prints)
            self._checkpoint(generation, saved)
        finally:
            if lock is not None:
                lock.release()

    def _saved_by_another(self, generation: Generation) -> bool:
        """Whether another process saved the workdir since ``generation``
        was published here: a manifest we did not write, or a checkpoint of a
        later generation."""
        if self.durable is not None and self.durable.saved_by_another():
            return True
        return load_checkpoint(self.workdir).generation > generation.gen

    def save_index(self, view: View, files: list[Cursor], latest: int,
                   prints: dict[str, str] | None = None) -> bool:
        """Records first: the segments (written as they were sealed, or by
        the flush at publication) and the manifest naming them (with the
        files' ``prints`` when known). True if the index is durable."""
        self.saved_at = self.clock()
        if self.durable is None:
            return False
        if not view.on_disk:
            self.save_error = _why(view.index.sink_error)
            return False
        try:
            self.durable.save(view.segments, files, view.index.kinds, latest, view.n, prints)
        except OSError as exc:
            self.save_error = _why(exc)
            return False
        return True

    def _checkpoint(self, generation: Generation, durable: bool = True) -> None:
        try:
            save_checkpoint(
                self.workdir,
                Checkpoint(generation.gen, generation.built_at, generation.watermark,
                           generation.files),
            )
            self.checkpoint_failed = not durable
        except OSError as exc:
            self.checkpoint_failed = True
            self.save_error = _why(exc)
        if not self.checkpoint_failed:
            self.save_error = ""
