"""The rows a ``context`` expand shows around an event: its session's turns.

The index does not know which records are of one session: an event's session
name is one of its exact identifiers, and the same name may be another user's
session (``default``, ``s1``), or a user, an app, a branch or an invocation.
So the records that name it are candidates around the event, and the rows
read back decide (:func:`~streamd.recall.eventlog.answers.same_session`).
The window widens until it holds ``CONTEXT_TURNS`` turns of the session each
way or runs out: a fixed window of candidates showed no turn at all once
other sessions of that name came between the event and its neighbours.
"""

from __future__ import annotations

from streamd.eventlog.store import EventRow
from streamd.recall.eventlog.answers import CONTEXT_TURNS, LogAnswers, same_session
from streamd.recall.eventlog.build import LogGeneration
from streamd.recall.eventlog.source import LogSource

__all__ = ["MAX_CANDIDATES", "context_rows"]

#: Candidates read back each way at most (the window grows fourfold from
#: twice the turns): a bound on what one expand reads when a name is shared
#: by many sessions.
MAX_CANDIDATES = 6 * 4**5


async def context_rows(source: LogSource, answers: LogAnswers, generation: LogGeneration,
                       rec: int, row: EventRow) -> list[EventRow]:
    """The rows around ``row`` (record ``rec``) that may be its session's, by seq."""
    recs, at = answers.session_records(generation, rec, row[3])
    if not len(recs):
        return []
    span = 2 * CONTEXT_TURNS
    read: dict[int, EventRow] = {}
    while True:
        lo, hi = max(0, at - span), min(len(recs), at + span + 1)
        wanted = [generation.seq_of(r) for r in recs[lo:hi].tolist() if r != rec]
        read.update(await source.rows_at([s for s in wanted if s not in read]))
        mine = [o for o in read.values() if same_session(row, o)]
        before = lo == 0 or sum(o[0] < row[0] for o in mine) >= CONTEXT_TURNS
        after = hi == len(recs) or sum(o[0] > row[0] for o in mine) >= CONTEXT_TURNS
        if (before and after) or span >= MAX_CANDIDATES:
            return sorted(read.values())
        span *= 4
