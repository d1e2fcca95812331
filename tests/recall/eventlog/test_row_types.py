"""An event-log source's round that fails half way through a page.

The index's seq moved to a page's last event before the page was indexed, so
a round that raised in between (a bug, or a row the projection could not
take) left the seq past events it never indexed: the next round published
the index without them, ``complete`` and ``healthy``, and no search found
them until a full refresh.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from streamd.recall.eventlog import build

from .conftest import call, ids, init, result, say, search, served


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
