"""Retention: the policy, and compaction.

No I/O here, and no trio.
"""

from __future__ import annotations

from typing import Literal

from streamd.eventlog.model.base import Count, NonEmpty, Params, Result


class RetentionPolicy(Params, kw_only=True):
    """How long an app's history is kept. Every limit is optional; a policy
    with none is no policy (``retention.set`` with none removes it).

    * ``max_age_s``: events whose timestamp is older than this are removed;
    * ``max_events``: each session keeps only its newest N events;
    * ``idle_s``: a session not updated (appended to, or created) for this long
      is removed with its events and its own state.

    What a holder of a live lease or an open watch of this daemon still needs
    is never removed (see :class:`CompactResult`)."""

    app: NonEmpty
    max_age_s: Count | None = None
    max_events: Count | None = None
    idle_s: Count | None = None

    def empty(self) -> bool:
        return self.max_age_s is None and self.max_events is None and self.idle_s is None


class RetentionGetParams(Params, kw_only=True):
    app: NonEmpty | None = None


class RetentionResult(Result):
    policies: list[RetentionPolicy]


class CompactParams(Params, kw_only=True):
    """Apply the retention policies now (of one app, or every app), then give
    the freed space back to the file system: ``vacuum`` "incremental" (the
    default: freed pages are returned, a few thousand per transaction, so
    appends go on meanwhile), "full" (a VACUUM: rewrites the file, which also
    converts a file created before streamd vacuumed incrementally; it needs
    the file's size again in free space and blocks writers while it runs) or
    "none"."""

    app: NonEmpty | None = None
    vacuum: Literal["incremental", "full", "none"] = "incremental"


class CompactResult(Result, kw_only=True):
    """What compaction removed and what the file gave back.

    ``keep_after_seq`` is the newest seq an open watch of this daemon has been
    given (null without watches): no event after it was removed, so every
    watch and every client resuming one still gets what it has not seen.
    ``leased_sessions`` were skipped whole (a live lease's holder drives them).
    Seqs are never given again. ``bytes_before``/``bytes_after`` are the
    database file plus its WAL; ``checkpointed`` says whether the WAL could be
    written back and truncated (a reader of another process can hold it)."""

    events_deleted: int
    sessions_deleted: int
    leased_sessions: int
    keep_after_seq: int | None
    pages_freed: int
    bytes_before: int
    bytes_after: int
    checkpointed: bool
