"""Write-behind for the ADK session service: one session's queued appends,
and how they are cut into ordered, all-or-none ``eventlog/append_batch`` runs.

Values, the ledger of the session copies that queued, and the few steps a
close takes on the pipelines (wait for another loop's send, stop this loop's,
count what is left): the task that sends a pipeline's runs is
:class:`~streamd.adk.session_service.StreamdSessionService`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Coroutine, Iterable
from typing import Any

import msgspec
from google.adk.sessions.session import Session

from streamd.adk.errors import adk_error
from streamd.errors import RpcError
from streamd.eventlog.model import AppendParams

PENDING = "streamd-pending:"
"""The marker of a session copy with appends queued behind it (write-behind)."""
MAX_RUN = 500
MAX_RUN_BYTES = 2 << 20
encode = msgspec.json.Encoder().encode


class Queued:
    """One queued append: the session copy it came from (``token``), its
    params, the seq it expects (the first of a copy's run only) and its size."""

    __slots__ = ("expected", "params", "size", "token")

    def __init__(self, token: str, params: AppendParams, expected: int | None, size: int) -> None:
        self.token = token
        self.params = params
        self.expected = expected
        self.size = size


class Refusal:
    """The log's refusal of a copy's run, raised at each of the copy's later
    appends and by the next ``flush``. Kept as the log's answer, and raised as
    a new exception each time: one exception raised again and again keeps
    every traceback it was raised with, and through their frames the refused
    copy and all its events, for the life of the service."""

    __slots__ = ("_answer", "_expected", "_session_id", "copy")

    def __init__(
        self, answer: RpcError, session_id: str, expected: int | None,
        copy: weakref.ref[Session] | None,
    ) -> None:
        # Its code, message and data: not the caught error, whose traceback
        # holds the frames of the send that caught it.
        self._answer = (answer.code, answer.message, answer.data)
        self._session_id = session_id
        self._expected = expected
        self.copy = copy
        """The refused copy, while it lives (its refusal is kept for it)."""

    def error(self) -> Exception:
        return adk_error(RpcError(*self._answer), self._session_id, self._expected)

    def copy_gone(self) -> bool:
        return self.copy is None or self.copy() is None


class Ledger:
    """Each session copy's standing in write-behind, by the token its marker
    carries while it has appends queued: how many are queued and not stored,
    the seq its last stored run was stored at, the copy itself (weakly), and the
    refusal a run of its met, kept while the copy lives (each of its appends
    raises it) and raised once by ``flush`` unless an append raised it first."""

    def __init__(self) -> None:
        self.owed: dict[str, int] = {}
        self.acked: dict[str, int] = {}
        self.copies: dict[str, weakref.ref[Session]] = {}
        self.refused: dict[str, Refusal] = {}
        self.unreported: list[str] = []
        """Copies whose refusal neither an append nor a flush has raised yet."""

    def refuse(self, pipe: Pipeline, first: Queued, exc: RpcError, expected: int) -> None:
        """The run ``first`` began was refused: what its copy queued after it
        was computed on it, so it is dropped, and the refusal is raised at the
        copy's next append (or by ``flush``)."""
        pipe.sending = []
        pipe.queue = [q for q in pipe.queue if q.token != first.token]
        self.owed.pop(first.token, None)
        self.acked.pop(first.token, None)
        copy = self.copies.pop(first.token, None)
        self._forget_refusals()
        self.refused[first.token] = Refusal(exc, first.params.session, expected, copy)
        self.unreported.append(first.token)

    def stored(self, token: str, count: int, last_seq: int) -> None:
        """``count`` of a copy's queued appends were stored, the last at
        ``last_seq``; settled once none is owed."""
        self.acked[token] = last_seq
        self.owed[token] -= count
        if not self.owed[token]:
            self.settle(token)

    def settle(self, token: str) -> None:
        """A copy's queued appends are all stored: its marker becomes the seq
        of the last, as a durable append leaves it (so the copy equals the
        session read back), and the token is forgotten."""
        self.owed.pop(token, None)
        seq = self.acked.pop(token)
        ref = self.copies.pop(token, None)
        copy = ref() if ref is not None else None
        if copy is not None and copy._storage_update_marker == PENDING + token:
            copy._storage_update_marker = str(seq)

    def _forget_refusals(self) -> None:
        """Drop the refusals of copies that are gone and were reported: no
        append of theirs can come, and ``flush`` has raised them."""
        for token in [t for t, r in self.refused.items()
                      if r.copy_gone() and t not in self.unreported]:
            del self.refused[token]


class Pipeline:
    """One session's queued appends and the task sending them, in order."""

    def __init__(self) -> None:
        self.queue: list[Queued] = []
        self.task: asyncio.Task[None] | None = None
        self.sending: list[Queued] = []
        """The run the task has taken out of the queue and not settled: put
        back first in line if its loop was closed under it (the task then
        never runs again)."""

    def abandoned(self) -> bool:
        """Whether the task's loop was closed without the task ending (a loop
        closed without asyncio.run's cancellation of what it still ran): its
        run goes back first in line, and the pipeline has no task."""
        task = self.task
        if task is None or task.done() or not task.get_loop().is_closed():
            return False
        self.put_back(self.sending)
        self.task = None
        return True

    def take_run(self) -> list[Queued]:
        """The next run: the first queued event and those after it from the same
        copy that follow it (no expectation of their own), within the batch
        limits (and under half a frame)."""
        run = [self.queue[0]]
        size = run[0].size
        for q in self.queue[1:]:
            if q.token != run[0].token or q.expected is not None:
                break
            if len(run) == MAX_RUN or size + q.size > MAX_RUN_BYTES:
                break
            run.append(q)
            size += q.size
        del self.queue[: len(run)]
        self.sending = run
        return run

    def put_back(self, run: list[Queued]) -> None:
        """``run``, taken and not known stored, first in line again: sent
        again, an event stored already comes back a duplicate."""
        self.queue[:0] = run
        self.sending = []


def start(
    loop: asyncio.AbstractEventLoop, send: Coroutine[Any, Any, None]
) -> asyncio.Task[None]:
    """The task sending a pipeline's runs. Its error (the log's, or a lost
    connection's) is raised by the drain that waits for it; one started by an
    append may have none waiting, and is marked read here, or asyncio logged
    "Task exception was never retrieved" for each: the queue it kept is sent,
    and its error raised, by the next drain."""
    task = loop.create_task(send)
    task.add_done_callback(_read_error)
    return task


def _read_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def unsent(pipes: Iterable[Pipeline]) -> int:
    """How many queued events are not known stored."""
    return sum(len(p.queue) + len(p.sending) for p in pipes)


def stop_sending(pipes: Iterable[Pipeline], loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the sends running on ``loop``: each puts its run back first in
    line (a cancelled close that gave up; see :mod:`~streamd.adk.lifetime`)."""
    for pipe in pipes:
        task = pipe.task
        if task is not None and task.get_loop() is loop and not task.done():
            task.cancel()


async def others_ended(pipes: Iterable[Pipeline], grace: float) -> None:
    """Once the sends running on other loops have ended there (each loop's
    own, as the queues are one loop's at a time), waiting at most ``grace``
    seconds for each; those of loops no thread runs are left as they are."""
    here = asyncio.get_running_loop()
    for pipe in pipes:
        task = pipe.task
        if task is None or task.done() or task.get_loop() is here:
            continue
        if task.get_loop().is_running():
            ended = asyncio.run_coroutine_threadsafe(asyncio.wait([task]), task.get_loop())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wrap_future(ended), grace)
