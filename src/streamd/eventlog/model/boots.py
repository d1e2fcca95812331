"""Boot records: record, update, and the recent ones.

No I/O here, and no trio.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated

import msgspec

from streamd.eventlog.model.base import MAX_INT, Params, Result, UtcTime, check_renderable


class BootRecordParams(Params):
    at: UtcTime
    attempted: list[str]

    def __post_init__(self) -> None:
        check_renderable("at", self.at)


class BootRecordResult(Result):
    id: int


class BootUpdateParams(Params):
    id: Annotated[int, msgspec.Meta(ge=-MAX_INT - 1, le=MAX_INT)]
    attempted: list[str]


class BootRecentParams(Params, kw_only=True):
    """The boots at or after ``since``, oldest first (by ``boot_at``, then
    id); ``after``: the previous page's ``next``, a boot id."""

    since: UtcTime
    after: Annotated[int, msgspec.Meta(ge=-MAX_INT - 1, le=MAX_INT)] | None = None


class Boot(Result):
    """``attempted`` is None when the stored list cannot be parsed, ``boot_at``
    when the stored time cannot be rendered: a crash-loop breaker counts boots,
    so a damaged row must still be counted, never dropped."""

    id: int
    boot_at: _dt.datetime | None
    attempted: list[str] | None


class BootRecentResult(Result, omit_defaults=True):
    """One page: the boots that fit the reply budget (always one), and,
    when more follow, ``next``, the boot id to pass as ``after``. Absent on
    the last page, so an answer that holds them all has the one key it
    always had."""

    boots: list[Boot]
    next: int | None = None
