"""The batch plan of a server backend: a group commit decided in Python before
anything is written.

PostgreSQL and MySQL give seq from a counter row the writing transaction holds
(commit order is seq order), so the batch can be planned whole, each event's
seq, duplicate or conflict known from one read, and then written in bulk
statements; a refused group (or event) is rolled back out of the plan as a
savepoint would roll it back out of the database. What a database cannot
store (U+0000 in PostgreSQL text, a key longer than a MySQL column) is the
backend's ``check``, run on every event of the batch before anything is sent.

**Session rows are locked in key order.** A retention drop step locks the
idle sessions it chose in key order (app, user, session); a group commit that
locked its sessions in the order its events came could hold one the step
waits for while waiting for one the step holds, and the server broke that
deadlock by failing the step or every append of the group. So the sessions a
``known`` read locks (all of the batch's, when any ``expected_seq`` needs one
locked) and the rows the write upserts come in key order: code-point order,
which is the order of both servers' binary collations and of Python's ``<``.

:func:`commit_planned` is the whole group commit of such a backend, written
once: the counter locked, the plan made from one read, the bulk write, and,
should the database still refuse one event's value, the batch written again
one event per savepoint so that event fails alone. A backend gives it a
:class:`PlannedWrite`: its transaction, savepoint, counter and bulk statements.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamd.errors import RpcError, invalid_params
from streamd.eventlog.model import AppendResult, StateDelta
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.backend import CommitOutcome
from streamd.eventlog.store.chain import Chain, FromSeq, SessionKey
from streamd.eventlog.store.sql import Sql
from streamd.eventlog.store.state import apply_delta

__all__ = [
    "Check", "Known", "Plan", "Planned", "PlannedWrite", "Prepared", "SessionKey",
    "commit_planned", "event_ids", "expected_sessions", "fold_deltas", "group",
    "session_heads", "sessions_to_lock",
]

Prepared = list[rows.Prepared | list[rows.Prepared] | RpcError]
"""A batch as :func:`~streamd.eventlog.store.rules.prepare_all` gives it."""
Known = tuple[dict[str, tuple[int, bytes]], dict[tuple[str, str, str], int | None]]
"""What a plan starts from: stored (seq, digest) by event id, and ``last_seq``
of the sessions whose ``expected_seq`` is checked (None: no such session)."""

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
    stored_from: FromSeq
    """The database's read of a session's first two stored seqs from a given one."""
    events: list[Planned] = field(default_factory=list)
    _undo: list[tuple[dict[Any, Any], Any, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stored_up_to = self.last_seq  # planned seqs are all after it

    def from_seq(self, key: SessionKey, seq: int) -> list[int]:
        """The session's first two seqs from ``seq`` on, stored or planned (a
        planned event may be written already: the one-by-one path)."""
        held = set(self.stored_from(key, seq)) if seq <= self._stored_up_to else set()
        # Planned events are in seq order: looked for from ``seq`` on, not from
        # the first. From the first, a writer's group of 1000 sent again while
        # the first was still queued (both in one commit) looked at 500,000
        # planned events to judge its duplicates, 15-30 ms of the writer's time.
        for i in range(bisect.bisect_left(self.events, seq, key=lambda e: e.row[0]),
                       len(self.events)):
            e = self.events[i]
            if len(held) >= 2 and e.row[0] > sorted(held)[1]:
                break
            if (e.row[1], e.row[2], e.row[3]) == key:
                held.add(e.row[0])
        return sorted(held)[:2]

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
            return rules.retried(item, *seen)
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


def group(plan: Plan, items: list[rows.Prepared]) -> list[AppendResult]:
    """A group's appends planned in order, each later append of a session
    expecting it where the earlier ones left it
    (:mod:`~streamd.eventlog.store.chain`); the first refusal names its index."""
    chain = Chain()
    out = []
    for index, item in enumerate(items):
        item = chain.expecting(item)
        try:
            result = plan.add(item)
        except RpcError as exc:
            raise rules.refused_in_group(exc, index) from None
        chain.took(item, result, plan.from_seq)
        out.append(result)
    return out


# --- what every backend's statements derive from a plan ---------------------------


def event_ids(items: list[rows.Prepared]) -> list[str]:
    """The batch's event ids, once each, in order: what ``known`` looks up."""
    return list(dict.fromkeys(one.params.event.id for one in items))


def expected_sessions(items: list[rows.Prepared]) -> list[SessionKey]:
    """The sessions whose ``last_seq`` an ``expected_seq`` checks, once each."""
    return list(dict.fromkeys((one.params.app, one.params.user, one.params.session)
                              for one in items if one.params.expected_seq is not None))


def sessions_to_lock(items: list[rows.Prepared]) -> list[SessionKey]:
    """What a ``known`` read locks: every session of the batch, in key order
    (see the module docstring), when an ``expected_seq`` needs its session
    locked; none otherwise (the write's upsert locks them, in the same order)."""
    if not any(one.params.expected_seq is not None for one in items):
        return []
    return sorted({(one.params.app, one.params.user, one.params.session) for one in items})


def session_heads(events: list[Planned]) -> dict[SessionKey, tuple[int, int]]:
    """Each session's newest planned event: its seq and its time (what the
    session row's ``last_seq`` and ``last_event_time`` become), one per
    session, as an upsert may touch a row only once per statement; in key
    order, the order the upsert locks them in (see the module docstring)."""
    heads = {(e.row[1], e.row[2], e.row[3]): (e.row[0], e.row[8]) for e in events}
    return dict(sorted(heads.items()))


def fold_deltas(sql: Sql, events: list[Planned], now_us: int) -> None:
    """The planned events' state deltas, folded in seq order."""
    for e in events:
        if e.delta is not None:
            seq, app, user, session = e.row[:4]
            apply_delta(sql, app, user, session, e.delta, seq, now_us)


class PlannedWrite(Protocol):
    """What a server backend gives :func:`commit_planned`, on one connection."""

    def transaction(self) -> AbstractContextManager[object]:
        """One write transaction (rolled back when the block raises)."""
        ...

    def savepoint(self) -> AbstractContextManager[object]:
        """A savepoint inside it (rolled back to when the block raises)."""
        ...

    def locked_seq(self) -> int:
        """The newest seq given, its counter row locked until the commit."""
        ...

    def known(self, items: list[rows.Prepared]) -> Known:
        """What the plan needs from the database about these appends."""
        ...

    def from_seq(self, key: SessionKey, seq: int) -> list[int]:
        """The session's first two stored event seqs from ``seq`` on."""
        ...

    def write(self, events: list[Planned], now_us: int) -> None:
        """Insert the planned events, their sessions and their state deltas."""
        ...

    def advance(self, newest: int) -> None:
        """Write the counter's new newest seq (and whatever announces it)."""
        ...

    def refusal(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database refusing a value (not failing)."""
        ...

    def describe(self, exc: BaseException) -> str:
        """The database's words for ``exc``, without secrets."""
        ...


class _Rewrite(Exception):
    """The bulk write was refused for one event: write it again one by one."""


def commit_planned(
    db: PlannedWrite, prepared: Prepared, now_us: int, capture: bool, check: Check | None
) -> CommitOutcome:
    """The group commit of a server backend (see the module docstring)."""
    prepared = _checked(prepared, check)
    try:
        return _commit(db, prepared, now_us, capture, one_by_one=False)
    except _Rewrite:
        return _commit(db, prepared, now_us, capture, one_by_one=True)


def _checked(prepared: Prepared, check: Check | None) -> Prepared:
    """Each item the backend's ``check`` refuses replaced by its refusal, before
    any of the batch is sent: the batch's duplicate lookup sends every event
    id to the server, and one it cannot hold (PostgreSQL and U+0000) failed
    the whole transaction, every other client's appends with it."""
    if check is None:
        return prepared
    out: Prepared = []
    for item in prepared:
        if isinstance(item, list):
            for i, one in enumerate(item):
                try:
                    check(one)
                except RpcError as exc:
                    # As the plan says a refused member: which one, and that
                    # nothing of its group was written.
                    out.append(rules.refused_in_group(exc, i))
                    break
            else:
                out.append(item)
        elif not isinstance(item, RpcError):
            try:
                check(item)
            except RpcError as exc:
                out.append(exc)
                continue
            out.append(item)
        else:
            out.append(item)
    return out


def _commit(
    db: PlannedWrite, prepared: Prepared, now_us: int, capture: bool, one_by_one: bool,
) -> CommitOutcome:
    out: list[AppendResult | list[AppendResult] | RpcError] = []
    with db.transaction():
        before = db.locked_seq()
        items = [one for item in prepared if not isinstance(item, RpcError)
                 for one in (item if isinstance(item, list) else [item])]
        plan = Plan(before, *db.known(items), stored_from=db.from_seq)
        for item in prepared:
            if isinstance(item, RpcError):
                out.append(item)
                continue
            mark = plan.mark()
            try:
                result: AppendResult | list[AppendResult] = (
                    group(plan, item) if isinstance(item, list) else plan.add(item)
                )
                if one_by_one:
                    _write_alone(db, plan.events[mark[1]:], now_us, isinstance(item, list))
            except RpcError as exc:
                plan.undo(mark)
                out.append(exc)
                continue
            out.append(result)
        if not one_by_one:
            try:
                db.write(plan.events, now_us)
            except Exception as exc:
                if not db.refusal(exc):
                    raise
                raise _Rewrite from exc
        if plan.last_seq != before:
            db.advance(plan.last_seq)
    return CommitOutcome(
        results=out,
        before_seq=before,
        after_seq=plan.last_seq,
        entries=rows.just_written(e.row for e in plan.events) if capture else None,
    )


def _write_alone(db: PlannedWrite, events: list[Planned], now_us: int, group: bool) -> None:
    """One item's events in a savepoint, each in one of its own, so the
    database's refusal fails that item alone and names the event."""
    with db.savepoint():
        for i, e in enumerate(events):
            try:
                with db.savepoint():
                    db.write([e], now_us)
            except Exception as exc:
                if not db.refusal(exc):
                    raise
                error = exc if isinstance(exc, RpcError) else invalid_params(
                    f"event rejected by the database: {db.describe(exc)}"
                )
                raise rules.refused_in_group(error, i) if group else error from None
