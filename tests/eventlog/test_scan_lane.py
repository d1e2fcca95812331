"""Reads whose cost grows with the log run in a lane of their own.

At a million events a ``branches`` call on the reader's connection kept every
other client's reads (a ping among them) waiting 4.3 s. A read that may scan
the log now runs on a third connection, opened when the first one is asked
for, and waits only for other scans. Real threads and the real clock; every
test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from support.eventlog import ev

from streamd.eventlog import EventLog, SqliteStore, filters, inline
from streamd.eventlog.model import Filter, SessionTree


@pytest.fixture(autouse=True)
def never_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine's slow read must not move small reads off the inline
    path: which thread a read runs on is what these tests look at."""
    monkeypatch.setattr(inline, "SLOW_READ_S", float("inf"))


async def test_a_read_that_scans_the_log_holds_up_no_other_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scanning, finish = threading.Event(), threading.Event()
    branches = SqliteStore.branches

    def slow_branches(self: SqliteStore, *args: Any) -> list[str]:
        scanning.set()
        finish.wait(30)
        return branches(self, *args)

    monkeypatch.setattr(SqliteStore, "branches", slow_branches)
    got: list[list[str]] = []
    try:
        with trio.fail_after(20):
            async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
                for i in range(3):
                    await log.append("a", "u", "s", ev(f"e{i}", branch="root.x"))

                async def scan() -> None:
                    got.append(await log.branches(Filter(app="a")))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(scan)
                    await trio.to_thread.run_sync(scanning.wait)
                    # Before: each of these waited for the scan to end.
                    await log.ping()
                    assert [e.seq for e in (await log.since(0)).entries] == [1, 2, 3]
                    assert await log.latest_seq() == 3
                    session = await log.get_session("a", "u", "s")
                    assert [e.event.id for e in session.events] == ["e0", "e1", "e2"]
                    finish.set()
    finally:
        finish.set()
    assert got == [["root.x"]]


async def test_scans_run_on_a_connection_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, set[int]] = {"since": set(), "branches": set()}
    for name in threads:
        original = getattr(SqliteStore, name)

        def recorded(self: SqliteStore, *args: Any, _name: str = name,
                     _original: Any = original) -> Any:
            threads[_name].add(threading.get_ident())
            return _original(self, *args)

        monkeypatch.setattr(SqliteStore, name, recorded)
    with trio.fail_after(20):
        async with EventLog(tmp_path / "events.db", synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            await log.since(0)  # unfiltered: the reader
            await log.since(0, Filter(author="agent"))  # by author: a scan
            await log.branches()
    assert len(threads["since"]) == 2
    assert threads["branches"] <= threads["since"]
    assert threading.get_ident() not in threads["branches"]


@pytest.mark.parametrize(
    ("flt", "scans"),
    [
        (None, False),
        (Filter(app="a", user="u", session="s"), False),
        (Filter(app="a", user="u", session="s", author="x"), False),
        (Filter(session_tree=SessionTree(app="a", user="u", parent="p")), False),
        (Filter(app="a"), True),
        (Filter(app="a", user="u"), True),
        (Filter(author="x"), True),
        (Filter(branch_prefixes=["root"]), True),
        (Filter(session="s"), True),
    ],
)
def test_a_read_scans_the_log_unless_it_names_one_session(flt: Filter | None, scans: bool) -> None:
    assert filters.scans_the_log(flt) is scans
