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


class BootRecentParams(Params):
    since: UtcTime


class Boot(Result):
    """``attempted`` is None when the stored list cannot be parsed, ``boot_at``
    when the stored time cannot be rendered: a crash-loop breaker counts boots,
    so a damaged row must still be counted, never dropped."""

    id: int
    boot_at: _dt.datetime | None
    attempted: list[str] | None


class BootRecentResult(Result):
    boots: list[Boot]
