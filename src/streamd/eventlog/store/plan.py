"""The batch plan of a server backend: a group commit decided in Python before
anything is written.

PostgreSQL and MySQL give seq from a counter row the writing transaction holds
(commit order is seq order), so the batch can be planned whole, each event's
seq, duplicate or conflict known from one read, and then written in bulk
statements; a refused group (or event) is rolled back out of the plan as a
savepoint would roll it back out of the database. What a database cannot
store (U+0000 in PostgreSQL text, a key longer than a MySQL column) is the
backend's ``check``, run on each new event before it is numbered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamd.errors import EVENT_CONFLICT, RpcError
from streamd.eventlog.model import AppendResult, StateDelta
from streamd.eventlog.store import rows, rules

__all__ = ["Check", "Plan", "Planned", "in_group"]

Check = Callable[[rows.Prepared], None]
"""Raises the database's refusal of an event it cannot store, before it is sent."""


@dataclass
class Planned:
    """One event the batch will insert, in :data:`rows.ENTRY_COLUMNS` order plus
    its digest, and its state delta."""

    row: tuple[Any, ...]
    digest: bytes
    delta: StateDelta | None


_MISSING = object()


@dataclass
class Plan:
    """A batch decided in Python before anything is written: which events are
    new and their seqs, which are duplicates or conflicts, what ``expected_seq``
    says. ``mark``/``undo`` roll a refused group (or, in the one-by-one path, a
    refused event) back out of the plan, as a savepoint would."""

    last_seq: int
    known: dict[str, tuple[int, bytes]]
    """event id -> (seq, digest), stored or planned in this batch."""
    session_seq: dict[tuple[str, str, str], int | None]
    """sessions.last_seq of the sessions ``expected_seq`` asks about (None: no
    such session), moved along by the planned events."""
    check: Check | None = None
    events: list[Planned] = field(default_factory=list)
    _undo: list[tuple[dict[Any, Any], Any, Any]] = field(default_factory=list)

    def mark(self) -> tuple[int, int, int]:
        return self.last_seq, len(self.events), len(self._undo)

    def undo(self, mark: tuple[int, int, int]) -> None:
        self.last_seq, n_events, n_undo = mark
        del self.events[n_events:]
        while len(self._undo) > n_undo:
            d, key, old = self._undo.pop()
            if old is _MISSING:
                d.pop(key, None)
            else:
                d[key] = old

    def _set(self, d: dict[Any, Any], key: Any, value: Any) -> None:
        self._undo.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    def add(self, item: rows.Prepared) -> AppendResult:
        p, ev = item.params, item.params.event
        seen = self.known.get(ev.id)
        if seen is not None:
            seq, digest = seen
            if digest == item.digest:
                return AppendResult(seq=seq, duplicate=True)
            raise RpcError(
                EVENT_CONFLICT,
                f"event {ev.id!r} was already appended with different content (seq {seq})",
                {"event_id": ev.id, "seq": seq},
            )
        if self.check is not None:
            self.check(item)
        key = (p.app, p.user, p.session)
        if p.expected_seq is not None:
            found = self.session_seq.get(key)
            if found is None:
                raise rules.not_found(*key)
            if found != p.expected_seq:
                raise rules.stale(p.session, p.expected_seq, found)
        self.last_seq += 1
        seq = self.last_seq
        self._set(self.known, ev.id, (seq, item.digest))
        if key in self.session_seq:
            self._set(self.session_seq, key, seq)
        self.events.append(
            Planned(
                (seq, p.app, p.user, p.session, ev.id, ev.invocation_id, ev.author, ev.branch,
                 item.event_time, item.content, item.metadata, item.state_delta_text),
                item.digest,
                item.state_delta,
            )
        )
        return AppendResult(seq=seq, duplicate=False)


def in_group(plan: Plan, item: rows.Prepared, index: int) -> AppendResult:
    try:
        return plan.add(item)
    except RpcError as exc:
        raise rules.refused_in_group(exc, index) from None

