"""Rows of a SQLite log holding values of types streamd never writes, under a Recall source.

A SQLite column holds any type: another program (or a damaged page) can leave
text in ``event_time`` or a blob in ``author``. ``streamd log since`` reads
such a row with the value as null and flagged; the event-log source's round
raised on it (a TypeError from the projection, compiled or plain). And a
round that raised half way through a page (this, or a bug) had already moved
the index's seq past the whole page: the next round published the index
without those events, ``complete`` and ``healthy``, and no search found them
until a full refresh.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import trio
from support.native import path_taken
from support.recall import FAR, req

from streamd.recall.eventlog import build

from .conftest import call, ids, init, result, say, search, served

# (column, value) a foreign writer could leave, each in its own event. (A
# number written to a TEXT column is stored as text, by the column's affinity:
# only a blob stays other there.)
ODD = [("event_time", "'x'"), ("event_time", "1.5"), ("content", "x'7b7d'"),
       ("author", "x'41'"), ("state_delta", "x'7b7d'")]


def _odd(db: Path) -> None:
    conn = apsw.Connection(str(db))
    try:
        for n, (column, value) in enumerate(ODD):
            conn.execute(f"UPDATE events SET {column} = {value} WHERE event_id = 'odd{n}'")
            assert conn.changes() == 1
    finally:
        conn.close()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "plain"])
async def test_a_row_of_unusual_types_counts_as_failed_and_the_rest_is_indexed(
        tmp_path: Path, compiled: bool) -> None:
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with path_taken(compiled), trio.fail_after(30):
        async with served(db) as (peer, log):
            await say(log, "e0", "zeta before")
            for n in range(len(ODD)):
                await say(log, f"odd{n}", "zeta odd")
            await say(log, "e1", "zeta after")
            _odd(db)
            await result(peer, init(db, work))
            found = await result(peer, search(2, "zeta"))
            health = await result(peer, req(3, "recall/health", deadline=FAR))
    assert sorted(ids(found)) == ["e0", "e1"]
    assert found["diagnostics"]["failed_records"] == len(ODD)
    assert found["diagnostics"]["coverage"] == "partial"
    assert health["indexed_count"] == 2 and health["failed_count"] == len(ODD)


async def test_a_round_that_fails_while_indexing_loses_no_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug that raises in the middle of a page (before any of its records
    # is added), on whichever path takes it.
    failures = [RuntimeError("a bug in the projection")]

    def failing_once(method):  # type: ignore[no-untyped-def]
        def run(self: build.LogIndex, *args: object) -> None:
            if failures:
                raise failures.pop()
            method(self, *args)
        return run

    for name in ("_consume_compiled", "_consume_plain"):
        monkeypatch.setattr(build.LogIndex, name, failing_once(getattr(build.LogIndex, name)))
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(30):
        async with served(db) as (peer, log):
            for n in range(3):
                await say(log, f"e{n}", "zeta")
            await result(peer, init(db, work))
            failed = await call(peer, search(2, "zeta"))
            found = await result(peer, search(3, "zeta"))
    assert failed["error"]["code"] == -32603
    assert sorted(ids(found)) == ["e0", "e1", "e2"]
    assert found["diagnostics"]["coverage"] == "complete"
