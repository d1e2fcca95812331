"""The Trio layer of one event-log source: its builder, its follower and its workdir.

A :class:`LogSource` indexes one event log for one Recall source. Its rules:

* **One builder.** Only the builder task (:meth:`LogSource.run`) changes
  the index. A request asks it for a round and waits for what it publishes;
  requests that arrive during a round are answered by the next one, so two
  searches never both read the log. A round is a few queries when nothing
  changed: where the log stands (newest seq, removal marks), the events
  after the index's seq in pages, and the removal marks after its mark.
* **Fresh at the next query.** Every search asks for a round, so an append
  acknowledged before it is found. Between queries the follower keeps the
  index warm: it holds a watch on the log, which this process's commits
  reach through the in-process fan-out and other writers' through the
  log's change source, and each batch it receives wakes the builder. The
  watch is only the signal; the builder reads the rows by seq.
* **Deadlines.** A request waits for the round only as long as its deadline
  allows, less what it keeps to answer (learnt, as the stream adapter's
  scanner does); then the builder publishes the prefix it has read at its
  next page, which answers with coverage ``partial``.
* **A log replaced under it.** A newest seq below the index's, removal
  marks that went back or were pruned past the index's mark, or another
  event id at the index's seq, mean the database is not the one indexed:
  the index starts over.
* **Durable like the stream index.** Segments are written as they seal; the
  manifest records the position (``SavedPosition``) at most every
  ``SAVE_EVERY_NS`` and when the source closes. A restart adopts it when the
  log still holds the event at the saved seq (or has recorded removals
  since), and reads only what came after.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import msgspec
import trio

from streamd import heap, regular_files
from streamd.errors import INTERNAL_ERROR, INVALID_PARAMS, RpcError
from streamd.eventlog.model import AppendParams, WatchParams
from streamd.eventlog.requests import LogRequests
from streamd.eventlog.store import EventRow, EventRows
from streamd.golang import gotime
from streamd.recall.eventlog.build import LogGeneration, LogIndex, SavedPosition
from streamd.recall.eventlog.settings import INDEX_CONFIG, LogSettings
from streamd.recall.index.segment import Damaged
from streamd.recall.persist.lock import WorkdirLock
from streamd.recall.persist.manifest import DurableIndex
from streamd.recall.reserve import AnswerReserve
from streamd.recall.scanner import PUBLISH_ALLOWANCE, Offload, to_thread
from streamd.recall.tokenize import UNICODE_VERSION

__all__ = ["PAGE", "LogSource"]

log = logging.getLogger("streamd.recall.eventlog")

# Rows one read takes: a page is indexed in ~50 ms, the step at which a
# long build can publish a prefix.
PAGE = 10_000
SAVE_EVERY_NS = 5 * gotime.NS
# How long the follower waits before watching again after its watch failed
# (the log unreachable, a server restarting).
FOLLOW_RETRY = 1.0
HEALTH_PATIENCE = 1.0


@dataclass(slots=True)
class _Ask:
    done: trio.Event = field(default_factory=trio.Event)
    result: LogGeneration | None = None
    error: RpcError | None = None


class LogSource:
    """One event log, indexed (see the module docstring).

    ``requests`` is the log's operations; ``hosting`` enters the log for as
    long as the source runs (a log the source opened itself), or is None
    for a log someone else hosts (the daemon's own)."""

    def __init__(
        self,
        requests: LogRequests,
        settings: LogSettings,
        workdir: str,
        *,
        hosting: Callable[[], AbstractAsyncContextManager[object]] | None = None,
        offload: Offload = to_thread,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.requests = requests
        self.settings = settings
        self.hosting = hosting
        self.offload = offload
        self.clock = clock
        config = f"{INDEX_CONFIG} unicode={UNICODE_VERSION} settings={settings.identity()}"
        self.durable = DurableIndex(workdir, config)
        self.lock = WorkdirLock(workdir)
        self.index = LogIndex(settings, clock, self.durable.sink)
        self.reserve = AnswerReserve()
        self.checkpoint_failed = False
        self.closed = False
        self.error: RpcError | None = None  # the last round's, for health
        self.rounds = 0
        self._started = False
        self._saved_at = 0
        self._unsaved = False  # a generation was published since the last save
        self._pending: list[_Ask] = []
        self._wake = trio.Event()
        self._published = trio.Event()
        self._publish_requested = False
        self._full_requested = False

    @property
    def generation(self) -> LogGeneration | None:
        return self.index.generation

    # -- what requests ask --

    async def current(self, full: bool = False, deadline: float = math.inf) -> LogGeneration:
        """A generation caught up with everything committed before the call,
        or, once ``deadline`` (Trio time) is near, the prefix the running round
        publishes. ``full``: index the whole log again, from nothing."""
        self._full_requested |= full
        keep = self.reserve.seconds
        ask = await self._ask(deadline - keep - PUBLISH_ALLOWANCE)
        while not ask.done.is_set():
            published = self._published
            self._publish_requested = True
            with trio.move_on_at(deadline - keep) as late:
                await published.wait()
            if not ask.done.is_set() and self.generation is not None:
                return self.generation
            if late.cancelled_caught:
                await published.wait()
        if ask.error is not None:
            raise ask.error
        assert ask.result is not None
        return ask.result

    async def settled(self, deadline: float = math.inf) -> LogGeneration | None:
        """For a probe: the caught-up generation if the round ends soon, else None."""
        margin = self.reserve.seconds + PUBLISH_ALLOWANCE
        ask = await self._ask(min(deadline - margin, trio.current_time() + HEALTH_PATIENCE))
        if not ask.done.is_set():
            return None
        if ask.error is not None:
            raise ask.error
        return ask.result

    async def next_publication(self) -> None:
        """Return once the next generation (or a round's end) is published."""
        await self._published.wait()

    def close(self) -> None:
        """Refuse requests from now on (the tasks end with their scope)."""
        self.closed = True

    def answered(self, seconds: float) -> None:
        self.reserve.observe(seconds)

    async def rows_at(self, seqs: Sequence[int]) -> dict[int, EventRow]:
        """The rows still stored at ``seqs``, by seq (what an answer shows)."""
        out: dict[int, EventRow] = {}
        wanted = sorted(set(seqs))
        for i in range(0, len(wanted), 500):
            for row in await self.requests.event_rows_at(wanted[i:i + 500]):
                out[row[0]] = row
        return out

    def forget(self, recs: Sequence[int]) -> None:
        """Records found deleted while an answer read them back: masked from
        the next generation on (the next round publishes it)."""
        for rec in recs:
            self.index.forget(rec)
        if recs:
            self._wake.set()

    async def _ask(self, patience_until: float) -> _Ask:
        ask = _Ask()
        self._pending.append(ask)
        self._wake.set()
        with trio.move_on_at(patience_until):
            await ask.done.wait()
        return ask

    def _notify_published(self) -> None:
        self._published.set()
        self._published = trio.Event()

    # -- the tasks --

    async def run(self) -> None:
        """The builder and the follower, until cancelled; then a last save."""
        async with contextlib.AsyncExitStack() as stack:
            if self.hosting is not None:
                await stack.enter_async_context(self.hosting())
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._rounds)
                    nursery.start_soon(self._follow)
            finally:
                self.closed = True
                with trio.CancelScope(shield=True):
                    await self._final_save()

    async def _rounds(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            batch, self._pending = self._pending, []
            try:
                result, error = await self._round(), None
            except RpcError as exc:
                result, error = None, exc
            except Exception as exc:
                # A bug in a round must not take the source down: the
                # published generation still answers. What the index holds
                # is unknown (its seq had moved past a page it never
                # indexed, and the next round published it without that
                # page's events, complete), so the next round starts over.
                log.exception("event-log index round failed")
                result, error = None, RpcError(INTERNAL_ERROR, f"index round failed: {exc}")
                self._full_requested = True
            self.error = error
            self._publish_requested = False
            for ask in batch:
                ask.result, ask.error = result, error
                ask.done.set()
            self._notify_published()

    async def _follow(self) -> None:
        # Watching starts once the first round has read the log: a watch from
        # seq 0 would read the whole log a second time.
        while self.generation is None:
            await self._published.wait()
        while True:
            try:
                watch = self.requests.watch(WatchParams(from_seq=self.index.seq))
                async with watch:
                    while True:
                        await watch.receive_batch()
                        self._wake.set()
            except (RpcError, StopAsyncIteration) as exc:
                log.debug("event-log follower: %s; watching again", exc)
            await trio.sleep(FOLLOW_RETRY)

    # -- a round --

    async def _round(self) -> LogGeneration:
        self.rounds += 1
        if not self._started:
            # First: a saved index found damaged there is replaced by a fresh
            # one, which is the one this round must build (taken before, the
            # half-adopted one was built on: 3 events counted as 5).
            await self._start()
        requests, index = self.requests, self.index
        newest, removal_max, removal_min = await requests.index_position()
        replaced = self._replaced(newest, removal_max, removal_min)
        if not replaced and index.seq:
            # A log restored from an older backup (or a server failed over to
            # a replica behind it) and appended to again before this round
            # has its newest seq past the index's and no removal to show:
            # only the event at the index's seq says so, by its id.
            at_seq = await requests.event_rows_at([index.seq])
            replaced = bool(at_seq) and at_seq[0][4] != index.last_id
        if replaced:
            log.warning("the event log is not the one indexed (restored or replaced): "
                        "indexing it again")
        if replaced or self._full_requested:
            self._full_requested = False
            gen = index.gen  # generation names continue: one never names two builds
            self.index = index = LogIndex(self.settings, self.clock, self.durable.sink)
            index.gen = gen
        before = index.generation.indexed if index.generation is not None else 0
        rows = await requests.event_page(index.seq, PAGE)
        while rows:
            following = await self._consume_reading_on(index, rows)
            if len(rows) < PAGE:
                break
            rows = following
            if self._publish_requested:
                self._publish_requested = False
                index.publish(behind=max(0, newest - index.seq))
                self._notify_published()
        while True:
            removals = await requests.removed_after(index.mark, PAGE)
            index.remove(removals)
            if len(removals) < PAGE:
                break
        if index.dirty or index.generation is None:
            with trio.CancelScope(shield=True):
                published = await self.offload(index.publish)
            heap.after_build(published.indexed - before)
            self._unsaved = True
            if self.clock() - self._saved_at >= SAVE_EVERY_NS:
                await self.offload(self._save)
        generation = index.generation
        assert generation is not None
        return generation

    async def _consume_reading_on(self, index: LogIndex, rows: EventRows) -> EventRows:
        """Index ``rows`` while the page after them is read (the compiled
        core and the database both work without the GIL, so the two share
        the cores); the page read, empty after a short page."""
        following: list[EventRows] = [[]]

        async def read_on() -> None:
            following[0] = await self.requests.event_page(rows[len(rows) - 1][0], PAGE)

        async with trio.open_nursery() as nursery:
            if len(rows) == PAGE:
                nursery.start_soon(read_on)
            # Shielded: a page is short, and a cancelled thread left running
            # would race the last save for the index.
            with trio.CancelScope(shield=True):
                await self.offload(index.consume, rows)
        return following[0]

    def _replaced(self, newest: int, removal_max: int, removal_min: int) -> bool:
        index = self.index
        if newest < index.seq or removal_max < index.mark:
            return True
        # Marks the index never read were pruned: it cannot know what they took.
        return removal_min > index.mark + 1

    async def _start(self) -> None:
        """Seed the log (conformance cases), then adopt a saved index if it is
        still this log's."""
        if self.settings.debug_seed:
            await self._seed(self.settings.debug_seed)
        # Whatever becomes of the saved index (adopted, or not this log's,
        # built under other settings, damaged), the names go on from its
        # generation, as they do when a log is replaced under a running
        # source: each not adopted started again at gen-1, and the first
        # builds after it reused names the saved one's answers had given.
        saved_gen = await self.offload(self._saved_generation)
        self.index.gen = saved_gen
        try:
            loaded = await self.offload(self.durable.load_position)
        except Damaged as exc:
            loaded = None
            log.warning("the saved event-log index is damaged (%s): indexing it again", exc)
        self._started = True
        if loaded is None or "eventlog" not in loaded.position:
            return
        try:
            at = msgspec.convert(loaded.position["eventlog"], SavedPosition)
        except msgspec.ValidationError:
            return
        newest, removal_max, removal_min = await self.requests.index_position()
        usable = newest >= at.seq and removal_max >= at.mark and (
            removal_min == 0 or removal_min <= at.mark + 1)
        if usable and at.seq:
            rows = await self.requests.event_rows_at([at.seq])
            usable = (rows[0][4] == at.last_id) if rows else removal_max > at.mark
        if not usable:
            log.info("the saved event-log index is not this log's: indexing it again")
            return
        try:
            self.index.adopt(loaded.segments, loaded.kinds, at)
        except Damaged as exc:
            log.warning("the saved event-log index is damaged (%s): indexing it again", exc)
            self.index = LogIndex(self.settings, self.clock, self.durable.sink)
            self.index.gen = saved_gen
            return
        log.info("adopted the saved event-log index at seq %d", at.seq)

    def _saved_generation(self) -> int:
        """The generation the workdir's last save published (0 for none), in a thread."""
        saved = self.durable.saved_position().get("eventlog")
        gen = saved.get("gen") if isinstance(saved, dict) else None
        return gen if type(gen) is int and gen > 0 else 0

    async def _seed(self, path: str) -> None:
        decode = msgspec.json.Decoder(AppendParams).decode
        try:
            data = await self.offload(_read_seed, path)
        except OSError as exc:
            raise RpcError(INVALID_PARAMS,
                           f"eventlog settings: debug_seed: {exc.strerror or exc}") from None
        lines = [line for line in data.splitlines() if line.strip()]
        for n, line in enumerate(lines, start=1):
            try:
                params = decode(line)
            except msgspec.DecodeError as exc:
                raise RpcError(INVALID_PARAMS,
                               f"eventlog settings: debug_seed line {n}: {exc}") from None
            await self.requests.append(params)  # a second seed is answered duplicate

    # -- saving --

    def _save(self) -> None:
        """The published generation's segments and position (in a thread)."""
        generation = self.index.generation
        if generation is None:
            return
        self._saved_at = self.clock()
        self._unsaved = False
        try:
            if not self.lock.try_acquire():
                return  # another process saves here; ours would clobber it
        except OSError:
            self.checkpoint_failed = True
            return
        try:
            view = generation.view
            segments = view.segments
            if not view.on_disk:
                # Written now (the disk had no room when they sealed, say):
                # the same records, mapped back from disk.
                view.index.flush()
                segments = view.index.segments
            if not all(s.path for s in segments):
                self.checkpoint_failed = True
                return
            position = msgspec.to_builtins(self.index.position())
            self.durable.save_position(segments, view.index.kinds, generation.latest,
                                       view.n, {"eventlog": position})
            self.checkpoint_failed = False
        except OSError:
            self.checkpoint_failed = True
        finally:
            self.lock.release()

    async def _final_save(self) -> None:
        if self._unsaved:
            with trio.move_on_after(2.0):
                await self.offload(self._save)


def _read_seed(path: str) -> bytes:
    """A seed file's bytes (in a thread). A regular file only: a FIFO there
    blocked a plain open on the event loop for good, and the process (a
    resident daemon serving every client) answered nothing, SIGTERM included;
    ``/dev/zero`` was read without end."""
    fd = regular_files.open_fd(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as file:
        return file.read()
