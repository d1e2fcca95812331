"""The server backends' batch plan (``store/plan.py``) judging a group's
later appends, without a database: what it reads of its own planned events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamd.eventlog.model import AppendParams, Event
from streamd.eventlog.store import rows
from streamd.eventlog.store.plan import Plan, Planned, group

NOW = 1_750_000_000 * 1_000_000
VIEW = 5
"""The writer's view: the session's last seq, and the newest stored."""


class Counted(list[Planned]):
    """The plan's events, counting each one looked at."""

    def __init__(self, events: list[Planned]) -> None:
        super().__init__(events)
        self.looked = 0

    def __iter__(self) -> Iterator[Planned]:
        for e in super().__iter__():
            self.looked += 1
            yield e

    def __getitem__(self, i: Any) -> Any:
        self.looked += 1
        return super().__getitem__(i)


def pipelined(n: int) -> list[rows.Prepared]:
    return [rows.prepare(AppendParams(
        app="app", user="u", session="s", event=Event(id=f"e{i}", author="a", content=i),
        expected_seq=VIEW if i == 0 else None), NOW) for i in range(n)]


def test_a_copy_of_a_group_planned_in_the_same_commit_is_judged_in_time_linear_in_its_size(
) -> None:
    # A writer's batch sent again while the first is still queued: the group
    # commit plans both, the copy's appends all duplicates of planned events.
    n = 1000
    batch = pipelined(n)
    plan = Plan(VIEW, {}, {("app", "u", "s"): VIEW}, lambda key, seq: [VIEW])
    first = group(plan, batch)
    plan.events = events = Counted(plan.events)
    again = group(plan, batch)
    assert [(r.seq, r.duplicate) for r in again] == [(r.seq, True) for r in first]
    # Each of the copy's appends finds the next planned event of its session
    # by seq; scanned from the first planned event, the copy looked at
    # n * n / 2 of them (15-30 ms of the writer's time for n = 1000).
    assert events.looked < 40 * n
