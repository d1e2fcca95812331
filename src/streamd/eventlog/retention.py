"""Retention as short transactions: how a policy is cut into steps.

A retention policy can remove millions of rows, and every step runs on the
log's one writer connection, so a step is also how long appends wait. The
rules, the same for SQLite and PostgreSQL:

* **Every step is bounded by rows, whatever the policy.** One transaction
  deletes at most :attr:`Bounds.events` rows (events, and the state history of
  a session being dropped) and looks at no more than :attr:`Bounds.sessions`
  sessions; a ``max_events`` step also reads no more than that many index
  entries to find where each session is cut (what the session holds, up to
  ``max_events + 1``; one session a step at least). A session of 300,000
  events is 60 steps, never one; appends queued on the writer run between
  them. The one exemption is an explicit full
  ``VACUUM`` (``compact`` with ``vacuum: "full"``), which rewrites the file as
  one operation and says so where it is offered.
* **A session being dropped goes from the old end.** An idle session loses
  its own state history (the deltas a read "as of a seq" folds; its current
  state stays in its row), then its events from the oldest, and its row goes
  in the transaction that deletes its newest event. A reader between steps
  sees the session with its newest events, or no session, never a session
  row without them. Each step checks again that the session is still idle,
  unleased and not needed by a watch: one appended to (or leased) while it
  was being dropped stays, with the newest events it had left.
* **The result is the one-transaction algorithm's.** Rules run in the order
  ``idle_s``, ``max_age_s``, ``max_events``, each until its step reports
  nothing more to do; with nothing appended meanwhile, what is kept is what a
  single transaction per rule would have kept.
* **Each step reports what it removed** (:class:`Step`) to an optional
  observer, which is how a test checks the bound without timing anything.

Sans-I/O: :func:`apply` awaits the ``run`` it is given and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from streamd.eventlog.model import RetentionPolicy
from streamd.eventlog.store.steps import DEFAULT_BOUNDS, Bounds, KeepAfter, SessionCursor, Step

if TYPE_CHECKING:
    from streamd.eventlog.store.backend import Backend

__all__ = [
    "DEFAULT_BOUNDS",
    "EARLIEST_US",
    "Bounds",
    "Observer",
    "Rule",
    "SessionCursor",
    "Step",
    "apply",
    "cutoff",
]

Rule = Literal["idle_s", "max_age_s", "max_events"]


Observer = Callable[[str, Rule, Step], None]
"""Called with (app, rule, step) after each retention transaction commits."""
StepOp = Callable[["Backend", int, KeepAfter], Step]
"""One step as a store call, given the time and the watch horizon (``keep``,
which the step reads inside its transaction)."""
RunStep = Callable[[StepOp], Awaitable[Step]]


EARLIEST_US = -(2**63)
"""The earliest time a store compares with: the smallest 64-bit integer, in
which every backend holds its times."""


def cutoff(now_us: int, seconds: int) -> int:
    """``seconds`` before ``now_us``, in microseconds, or :data:`EARLIEST_US`
    when that is earlier. A policy takes any count of seconds up to
    2**63 - 1, and so many seconds in microseconds is no 64-bit integer: the
    store refused the cutoff (OverflowError), which failed ``compact`` for
    every app, and took down the log (its background task's error)."""
    return max(now_us - seconds * 1_000_000, EARLIEST_US)


async def apply(
    policy: RetentionPolicy,
    run: RunStep,
    bounds: Bounds = DEFAULT_BOUNDS,
    observe: Observer | None = None,
) -> tuple[int, int]:
    """Apply ``policy`` step by step through ``run``; (events, sessions) deleted."""
    app = policy.app
    events = sessions = 0

    async def until_done(rule: Rule, make: Callable[[Step | None], StepOp]) -> None:
        nonlocal events, sessions
        previous: Step | None = None
        while True:
            step = await run(make(previous))
            events += step.events
            sessions += step.sessions
            if observe is not None:
                observe(app, rule, step)
            if not step.more:
                return
            previous = step

    if (idle_s := policy.idle_s) is not None:
        await until_done("idle_s", lambda prev: lambda store, now, keep: store.drop_idle_sessions(
            app, cutoff(now, idle_s), keep, now, prev, bounds))
    if (max_age_s := policy.max_age_s) is not None:
        await until_done("max_age_s", lambda prev: lambda store, now, keep: store.drop_old_events(
            app, cutoff(now, max_age_s), keep, now, prev, bounds))
    if (max_events := policy.max_events) is not None:
        await until_done(
            "max_events",
            lambda prev: lambda store, now, keep: store.trim_sessions(
                app, max_events, keep, now, prev, bounds),
        )
    return events, sessions
