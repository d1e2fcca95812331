"""What one bounded retention step may do and what it did: values the
storage core and the backends share with the policy loop
(:mod:`~streamd.eventlog.retention`), kept here so that the store never
imports the loop that drives it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_BOUNDS", "Bounds", "KeepAfter", "SessionCursor", "Step", "kept_after"]

KeepAfter = int | None | Callable[[], int | None]
"""What a step may not remove: the events after this seq (None: no limit),
or a callable the step asks inside its transaction. The log passes the
callable (:meth:`~streamd.eventlog.watch_hub.WatchHub.retention_step`), so
that a watch opened while the step waited for the writer is counted: the
horizon read before the wait let the step remove what another process
committed after that watch opened."""


def kept_after(keep: KeepAfter) -> int | None:
    """The seq after which nothing is removed, read now (inside the step's
    transaction, where no other writer commits on SQLite)."""
    return keep() if callable(keep) else keep


SessionCursor = tuple[str, str]
"""(user, session): where a rule that pages through sessions goes on."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one retention transaction may do."""

    events: int = 5000
    """Rows deleted per transaction: events, and a dropped session's state deltas."""
    sessions: int = 100
    """Sessions looked at per transaction."""

    def __post_init__(self) -> None:
        if self.events < 1 or self.sessions < 1:
            raise ValueError("retention bounds must be positive")


DEFAULT_BOUNDS = Bounds()


@dataclass(frozen=True, slots=True)
class Step:
    """What one retention transaction removed, and whether its rule goes on."""

    events: int
    """Events deleted."""
    rows: int
    """Rows of history deleted in all: ``events`` plus state deltas (session
    rows not counted); never more than :attr:`Bounds.events`."""
    sessions: int = 0
    """Sessions dropped whole (their row deleted)."""
    more: bool = False
    """The rule has more to do: run another step."""
    cursor: SessionCursor | None = None
    """The session the next step starts with (``max_events``: the first it
    looks at; ``idle_s``: the one it was dropping)."""
    after_seq: int = 0
    """What this step finished up to: every event the rule removes, up to this
    seq, in ``cursor``'s session (``max_age_s``: in the app), is gone. The next
    step scans after it, not over what was just deleted (on PostgreSQL, dead
    rows an index still lists until a vacuum)."""
