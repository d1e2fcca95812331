"""A retention step whose caller is cancelled while the step runs on the
writer's thread (a client's cancel of ``eventlog/compact``, its connection's
end): SQLite abandons a cancelled call only at its next progress check, so a
short step still commits after its caller was told it was cancelled. What
open watches need is still kept, and later compactions still run.

Real threads (the step on the writer's, a watch's pages on the reader's),
held and let go by handshakes, no sleeps; bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.eventlog import ev, thread_event

from streamd.eventlog import EventLog
from streamd.eventlog.retention import Step


async def test_a_watch_opened_as_a_cancelled_step_still_commits_gets_no_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The step's caller was told "cancelled" and the hub forgot the step,
    # while the step went on on the writer's thread. A watch opened then was
    # counted by no horizon and waited for no step: it read e0 and e1 (a page
    # of two), then the step, reading a horizon no watch had lowered, cut the
    # session to e9; the watch went on with e9, silently skipping e2-e8.
    with trio.fail_after(60):
        async with (
            EventLog(tmp_path / "e.db", synchronous="NORMAL", watch_buffer=2) as log,
            trio.open_nursery() as nursery,
        ):
            for i in range(10):
                await log.append("app", "u", "s", ev(f"e{i}"))
            await log.set_retention("app", max_events=1)
            await log.connections.open_reader()
            writer = getattr(log.connections.writer, "store", None)
            reader = getattr(log.connections.reader, "store", None)
            assert writer is not None and reader is not None
            begun, go, ended, paged = (threading.Event() for _ in range(4))
            trim, since = writer.trim_sessions, reader.since_committed

            def held_trim(*args: Any) -> Step:
                monkeypatch.setattr(writer, "trim_sessions", trim)  # the first step alone
                begun.set()
                go.wait(30)
                try:
                    return trim(*args)  # its horizon read inside, as ever
                finally:
                    ended.set()

            def since_paged(*args: Any) -> Any:
                page = since(*args)
                if page[0]:
                    paged.set()
                return page

            monkeypatch.setattr(writer, "trim_sessions", held_trim)
            monkeypatch.setattr(reader, "since_committed", since_paged)
            caller = trio.CancelScope()

            async def compact() -> None:
                with caller:
                    await log.compact()

            nursery.start_soon(compact)
            await thread_event(begun)
            caller.cancel()  # the step runs on the writer's thread meanwhile
            await trio.testing.wait_all_tasks_blocked()
            got: list[str] = []
            async with log.watch(0) as w:
                await trio.testing.wait_all_tasks_blocked()
                if not getattr(log.connections.reader, "idle", True):
                    await thread_event(paged)  # it reads at once: its first page first
                go.set()
                await thread_event(ended)
                async for entry in w:
                    got.append(entry.event.id)
                    if entry.event.id == "e9":
                        break
            assert got == [f"e{i}" for i in range(10 - len(got), 10)]
            # The step ended with the hub: the next compaction has no watch
            # to keep anything for.
            done = await log.compact()
            assert done.keep_after_seq is None
            assert [e.event.id for e in (await log.since(0)).entries] == ["e9"]
