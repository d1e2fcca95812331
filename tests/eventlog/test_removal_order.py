"""Removal marks commit in mark order on the server backends: an index that
reads ``removed_after(its mark)`` and moves its mark past what it read never
skips a removal committed later with a lower mark.

Marks are handed out as rows are deleted (an identity, an AUTO_INCREMENT), so
a deleting transaction that got marks 1-2 but waited could commit after one
that got 3-4 and committed: the Recall source, having read 3-4, read after 4
from then on, and kept the records 1-2 had removed for ever. Each deleting
transaction now locks ``removal_order`` first; appends do not, so a deletion
held up holds up no append. SQLite has one writer at a time: nothing to race.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import store_contract as contract
from support.server_locks import holding, lock_waits, started, until
from support.store_contract import T0, Fixture, ap, ev

from streamd.eventlog.model import SinceParams

_HOLD_S1 = ("SELECT session_id FROM sessions WHERE app_name = ? AND user_id = ?"
            " AND session_id = ? FOR UPDATE")


@pytest.fixture(params=["postgres", "mysql"])
def server_fx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fixture]:
    yield from contract.BACKENDS[request.param](request, tmp_path)


def test_a_deletion_committed_after_a_later_marked_one_is_not_skipped_by_a_reader(
    server_fx: Fixture, request: pytest.FixtureRequest
) -> None:
    fx = server_fx
    backend = request.node.callspec.params["server_fx"]
    for s in ("s1", "s2"):
        for i in range(2):
            fx.store.append(ap(ev(f"{s}-{i}"), session=s), T0)
    first, second, appender = fx.reopen(), fx.reopen(), fx.reopen()
    waits = lock_waits(request, backend)
    outcomes: dict[str, Any] = {}
    with holding(request, backend, _HOLD_S1, ("app", "u", "s1")):
        # s1's delete, holding removal_order, waits for the session row held
        # above (it locks the row before it takes the events).
        s1 = started(outcomes, "s1", lambda: first.delete_session("app", "u", "s1"))
        until(lambda: waits() >= 1, "the delete of s1 waiting for its session's row")
        s2 = started(outcomes, "s2", lambda: second.delete_session("app", "u", "s2"))
        # Either it committed, or it waits for s1's delete: the server says which.
        until(lambda: not s2.is_alive() or waits() >= 2, "the delete of s2 ending or waiting")
        # What an index reads meanwhile, and the mark it moves to.
        seen = fx.store.removed_after(0, 100)
        # An append waits for neither deletion.
        appending = started(outcomes, "append",
                             lambda: appender.append(ap(ev("s3-0"), session="s3"), T0))
        appending.join(60)
        assert not appending.is_alive(), "an append waited for a deletion"
    s1.join(60)
    s2.join(60)
    assert not s1.is_alive() and not s2.is_alive(), outcomes
    assert outcomes["s1"] is None and outcomes["s2"] is None, outcomes
    mark = max((m for m, _ in seen), default=0)
    later = fx.store.removed_after(mark, 100)
    # Every removal reaches a reader that reads on from its mark.
    assert sorted(seq for _, seq in seen + later) == [1, 2, 3, 4], (seen, later)
    assert [e.event.id for e in fx.store.since(SinceParams(from_seq=0)).entries] == ["s3-0"]
