"""The refresh scanner: the one task that builds a source's generations.

A request that needs a caught-up generation asks it and awaits what it
publishes; requests that arrive while a build runs are answered together by
the next round, so two concurrent searches never both walk the files, and a
search that is cancelled while waiting leaves the build to finish for
everyone else.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import trio

from streamd.errors import INTERNAL_ERROR, RpcError
from streamd.recall.adapter import StreamAdapter
from streamd.recall.generation import Generation
from streamd.recall.index.parallel import drive
from streamd.recall.reserve import AnswerReserve
from streamd.recall.stop import Stop

log = logging.getLogger("streamd.recall")

T = TypeVar("T")


@dataclass(slots=True)
class _Ask:
    full: bool
    save: bool  # a refresh: also retry a failed save at once
    done: trio.Event = field(default_factory=trio.Event)
    result: Generation | None = None
    error: RpcError | None = None


Offload = Callable[..., Awaitable[Any]]
"""How blocking work (a build, the reads an answer renders) leaves the event
loop: ``offload(fn, *args, limiter=None)`` returns ``fn(*args)``, computed
in a thread of ``limiter`` (a CapacityLimiter; None: Trio's default).
:func:`to_thread` by default; tests on Trio's mock clock, which cannot see
a thread and would jump past it, run the work inline."""


async def to_thread(fn: Callable[..., Any], *args: Any,
                    limiter: trio.CapacityLimiter | None = None) -> Any:
    """``fn(*args)`` in a thread of ``limiter`` (Trio's default one, which
    builds and reads share, when None)."""
    # Abandoned on cancel: a build notices its stop flag by itself.
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=limiter)


# Threads one connection's answers hold at once (``stoppable``), from a
# limiter of the connection's own: forty searches that each rank for
# minutes took every thread of Trio's default limiter, so no build, no read
# and no other client's search got one until they ended. Past this many long
# answers a connection's next request waits for one of them (its cancel or
# deadline ends it): a bound on threads per connection, which the in-flight
# bound (256) would leave at hundreds.
ANSWER_THREADS = 16


def answer_threads() -> trio.CapacityLimiter:
    """A connection's own threads for its answers (see ``ANSWER_THREADS``)."""
    return trio.CapacityLimiter(ANSWER_THREADS)


async def stoppable(offload: Offload, threads: trio.CapacityLimiter, fn: Callable[..., T],
                    *args: Any) -> T:
    """``fn(*args, stop)`` off the event loop, in one of ``threads``: a
    search or an expand can cost seconds to minutes of CPU on hostile
    params, during which the connection's other requests (and every other
    connection's, in the resident daemon) must still be served, and a
    cancel or a deadline answered at once. Then ``stop`` is set, so the
    work, which the offload abandons, gives up at its next step instead of
    running on for nobody (``recall.stop``)."""
    stop = Stop()
    try:
        return cast(T, await offload(fn, *args, stop, limiter=threads))
    finally:
        stop.set()


# What a request leaves the running build, on top of what it keeps for its
# answer (``reserve``), to publish the prefix it asks for: the build publishes
# at its next step, within a tenth of a second on either path.
PUBLISH_ALLOWANCE = 0.75
# How long a health probe waits for a running build before it reports on it.
HEALTH_PATIENCE = 1.0
# How long a stopped build gets to close (save its progress, kill its
# workers) before the process may go on without it.
STOP_GRACE = 0.4


class Scanner:
    """The only task that builds a source's generations.

    Builds belong to the scanner, never to a request: a request waits for
    the build only as long as its own deadline allows (less what it keeps for
    its answer, learnt from the answers before it: ``reserve``, and
    ``PUBLISH_ALLOWANCE``), and a request that gives up, or is cancelled,
    leaves the build running for the next one. A request that runs out of patience
    during a long build is answered from a prefix the build publishes on
    demand (coverage partial, with how far indexing has come), so a fresh big
    stream answers honestly within Recall's 5 s health probe instead of
    failing it. When every build finishes in time, generations are exactly
    the reference's.
    """

    def __init__(self, adapter: StreamAdapter, offload: Offload = to_thread) -> None:
        self.adapter = adapter
        self.offload = offload
        self._pending: list[_Ask] = []
        self._wake = trio.Event()
        # Set (and replaced) whenever something is published: a prefix, or
        # the end of a round.
        self._published = trio.Event()
        self.builds = 0
        # What the answers from this source's generations take; the requests
        # that say so (``answered``) are the source's, whichever connection.
        self.reserve = AnswerReserve()

    def answered(self, seconds: float) -> None:
        """A request answered from a generation in ``seconds`` once it had it."""
        self.reserve.observe(seconds)

    async def current(
        self, full: bool = False, save: bool = False, deadline: float = math.inf
    ) -> Generation:
        """A generation that has consumed every complete line the files hold,
        or, once ``deadline`` (Trio time) is near, a prefix of the running build."""
        keep = self.reserve.seconds
        ask = await self._ask(full, save, deadline - keep - PUBLISH_ALLOWANCE)
        while not ask.done.is_set():
            # Still building: have the build publish what it has read, then
            # answer from that. A build that cannot get to its next step in
            # time (a progress save's fsync on a loaded disk, say) must not
            # cost the answer: with what the answer needs of the deadline
            # still left, the generation published before, if any, answers.
            published = self._published
            self.adapter.publish_requested.set()
            log.debug("asked the running build for a prefix (keeping %.2f s to answer)", keep)
            with trio.move_on_at(deadline - keep) as late:
                await published.wait()
            generation = self.adapter.generation
            if not ask.done.is_set() and generation is not None:
                return generation
            if late.cancelled_caught:
                # Nothing published yet at all: only the prefix can answer
                # (the request's own scope bounds this wait).
                await published.wait()
        if ask.error is not None:
            raise ask.error
        assert ask.result is not None
        return ask.result

    async def settled(self, deadline: float = math.inf) -> Generation | None:
        """For a probe: the caught-up generation if the build finishes within
        ``HEALTH_PATIENCE`` (and the deadline's margins), else None at once: a
        probe reports on the build, it does not wait for it, because Recall
        computes a search's deadline before its probe and a probe that waits
        spends the search's budget."""
        margin = self.reserve.seconds + PUBLISH_ALLOWANCE
        ask = await self._ask(False, False, min(deadline - margin,
                                                trio.current_time() + HEALTH_PATIENCE))
        if not ask.done.is_set():
            return None
        if ask.error is not None:
            raise ask.error
        return ask.result

    async def _ask(self, full: bool, save: bool, patience_until: float) -> _Ask:
        """Queue a request for the next round; wait for it until ``patience_until``."""
        self.adapter.check_session()
        ask = _Ask(full, save)
        self._pending.append(ask)
        self._wake.set()
        with trio.move_on_at(patience_until):
            await ask.done.wait()
        return ask

    def _notify_published(self) -> None:
        self._published.set()
        self._published = trio.Event()

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()

        def on_publish() -> None:  # called in the build's thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._notify_published)

        self.adapter.on_publish = on_publish
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
            # A request asking for a prefix just as the round ended must not
            # leave it to the next build.
            self.adapter.publish_requested.clear()
            for ask in batch:
                ask.result, ask.error = result, error
                ask.done.set()
            self._notify_published()

    async def _catch_up(self, full: bool, save: bool) -> Generation:
        adapter = self.adapter
        adapter.check_session()
        if not adapter.needs_build(full):
            assert adapter.generation is not None
            if adapter.save_due(save):
                await self.offload(adapter.save_again)
            return adapter.generation
        self.builds += 1
        # The build reads stream files and waits on worker processes, so it
        # runs in a thread, driven by the same loop as the CLI's builds. If
        # this task is cancelled (its source closes, its process stops) the
        # build is told to stop and gets STOP_GRACE to do so at its next step:
        # it saves what it sealed and kills its workers.
        stop = threading.Event()
        finished = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def build() -> Generation:
            try:
                return drive(adapter.build(full), None, stop)
            finally:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(finished.set)

        try:
            return await self.offload(build)
        finally:
            stop.set()
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_GRACE):
                await finished.wait()
