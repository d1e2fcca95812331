"""The deletion signal an index of the log reads, and its row reads: every backend.

Deletes never move seq, so each one is recorded in ``removed_events`` (a
trigger on ``events``): a session delete and each retention rule record what
they took, in removal order, and ``removed_after`` hands out the marks after
the one an index has read. The rows an index reads (``event_rows``,
``event_page``, ``event_rows_at``) are the events as stored.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support.server_locks import started
from support.store_contract import T0, Fixture, ap, ev

from streamd.eventlog.retention import Bounds


def fill(fx: Fixture, session: str, n: int) -> list[int]:
    return [fx.store.append(ap(ev(f"{session}-{i}", {"text": f"t{i}"}), session=session),
                            T0).seq for i in range(n)]


def removed(fx: Fixture, after: int = 0) -> list[int]:
    return [seq for _, seq in fx.store.removed_after(after, 1000)]


def test_a_session_delete_records_every_event_it_removed(fx: Fixture) -> None:
    kept = fill(fx, "keep", 2)
    gone = fill(fx, "gone", 3)
    assert fx.store.removed_after(0, 10) == [] and fx.store.newest_removal() == (0, 0)
    fx.store.delete_session("app", "u", "gone")
    assert sorted(removed(fx)) == gone
    newest, oldest = fx.store.newest_removal()
    assert newest >= oldest >= 1
    # Marks only grow: what came before a mark is never handed out again.
    assert removed(fx, newest) == []
    assert [row[0] for row in fx.store.event_rows(0, 100)] == kept


def test_retention_records_what_it_trimmed_after_the_marks_before(fx: Fixture) -> None:
    fill(fx, "a", 1)
    fx.store.delete_session("app", "u", "a")
    mark, _ = fx.store.newest_removal()
    seqs = fill(fx, "s", 5)
    step = None
    while True:
        step = fx.store.trim_sessions("app", 2, None, T0, step, Bounds(events=2))
        if not step.more:
            break
    assert sorted(removed(fx, mark)) == seqs[:3]
    assert [row[0] for row in fx.store.event_rows(0, 100)] == seqs[3:]


def test_rows_are_the_events_as_stored(fx: Fixture) -> None:
    seq = fx.store.append(ap(ev("e1", {"text": "hi"}, branch="b", invocation_id="inv"),
                             app="chat", user="ann", session="s1"), T0).seq
    (row,) = fx.store.event_rows(0, 10)
    assert row[:8] == (seq, "chat", "ann", "s1", "e1", "inv", "agent", "b")
    assert row[8] == T0  # the append time, in microseconds, for an event sent without one
    assert row[9].replace(" ", "") == '{"text":"hi"}' and row[10] is None
    assert fx.store.event_rows_at([seq, seq + 1]) == [row]
    assert fx.store.event_rows(seq, 10) == []
    # What an index reads: the same rows, in a page of the backend's own.
    page = fx.store.event_page(0, 10)
    assert len(page) == 1 and page[0] == row and len(fx.store.event_page(seq, 10)) == 0


def test_an_append_committed_while_its_session_is_deleted_is_recorded_if_it_goes(
    fx: Fixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another daemon appended to the session after the delete had taken its
    # events and before it took its row. On MySQL the row's delete then
    # took the new event by the foreign key's cascade, which InnoDB runs
    # without triggers: the event was gone (acknowledged, then deleted) and
    # no removal was recorded, so an index of the log kept it for ever.
    from streamd.eventlog.store import sessions as rules

    gone = fill(fx, "s", 2)
    other = fx.reopen()
    taken, go = threading.Event(), threading.Event()
    real = rules.delete_session

    class Pausing:
        """The delete's database, which stops once the events are deleted."""

        def __init__(self, db: Any) -> None:
            self.db = db

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

        def run(self, sql: str, args: Any = ()) -> Any:
            out = self.db.run(sql, args)
            if sql.startswith("DELETE FROM events"):
                taken.set()
                assert go.wait(30)
            return out

    monkeypatch.setattr(rules, "delete_session", lambda db, *a: real(Pausing(db), *a))
    outcomes: dict[str, Any] = {}
    deleting = started(outcomes, "delete", lambda: fx.store.delete_session("app", "u", "s"))
    assert taken.wait(30), outcomes
    appending = started(outcomes, "append", lambda: other.append(ap(ev("late"), session="s"), T0))
    # Time for an append nothing holds back to commit; one that waits for the
    # delete goes on once it ends: either way is right.
    appending.join(0.5)
    go.set()
    deleting.join(30)
    appending.join(30)
    assert outcomes["delete"] is None, outcomes
    late = outcomes["append"]
    assert not isinstance(late, Exception), outcomes
    stored = [row[0] for row in other.event_rows(0, 100)]
    # What is not stored any more is recorded as removed, the late event too.
    assert sorted(removed(fx)) == sorted({*gone, late.seq} - set(stored)), stored
