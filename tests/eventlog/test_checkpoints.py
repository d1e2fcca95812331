"""The WAL checkpoint policy: one checkpoint at a time, on the connections it names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.sqlite import ConnectionRunner, SqliteStore
from streamd.eventlog.sqlite.checkpoints import CHECKPOINT_PAGES, Checkpoints
from streamd.eventlog.store import Backend
from streamd.eventlog.writer import EventLogStats


class _FullWal(ConnectionRunner):
    """A writer whose WAL is past the threshold (nothing else of it is used)."""

    def __init__(self) -> None:
        pass

    @property
    def wal_pages(self) -> int:
        return CHECKPOINT_PAGES


class _Seen(SqliteStore):
    """A store that says which connection ran which checkpoint, then runs it
    on the real one."""

    def __init__(self, role: str, calls: list[str], real: SqliteStore) -> None:
        self._role, self._calls, self._real = role, calls, real

    def checkpoint_passive(self) -> tuple[int, int]:
        self._calls.append(f"{self._role}: passive")
        return self._real.checkpoint_passive()

    def checkpoint(self) -> bool:
        self._calls.append(f"{self._role}: truncate")
        return self._real.checkpoint()


class _Recorder:
    """The two connections as the policy sees them; the reader's passive
    checkpoint waits for a gate."""

    def __init__(self, tmp_path: Path) -> None:
        self.calls: list[str] = []
        self.gate = trio.Event()
        self.passive_started = trio.Event()
        self._store = SqliteStore.open(str(tmp_path / "events.db"))

    async def read(self, op: Callable[[Backend], Any]) -> Any:
        self.passive_started.set()
        await self.gate.wait()
        return op(_Seen("reader", self.calls, self._store))

    async def write(self, op: Callable[[Backend], Any]) -> Any:
        return op(_Seen("writer", self.calls, self._store))

    def close(self) -> None:
        self._store.close()


async def test_a_compactions_truncating_checkpoint_waits_for_the_background_one(
    tmp_path: Path,
) -> None:
    conns = _Recorder(tmp_path)
    stats = EventLogStats()
    async with trio.open_nursery() as nursery:
        checkpoints = Checkpoints(
            read=conns.read,
            write=conns.write,
            nursery=lambda: nursery,
            closed=lambda: False,
            counted=lambda: setattr(stats, "checkpoints", stats.checkpoints + 1),
        )
        checkpoints.due(_FullWal())
        checkpoints.due(_FullWal())  # one at a time: a second call while one runs starts none
        await conns.passive_started.wait()
        assert checkpoints.running
        truncated: list[bool] = []

        async def compaction_ends() -> None:
            truncated.append(await checkpoints.truncate())

        nursery.start_soon(compaction_ends)
        await trio.testing.wait_all_tasks_blocked()
        # Without the lock the truncate would have run now, beside the passive
        # checkpoint, and found the WAL busy.
        assert conns.calls == [] and truncated == []
        conns.gate.set()
    assert conns.calls == ["reader: passive", "writer: passive", "writer: truncate"]
    assert truncated == [True] and stats.checkpoints == 1 and not checkpoints.running
    conns.close()


async def test_a_checkpoint_failing_the_same_way_again_and_again_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A log stopped under the daemon fails every checkpoint the same way, and
    # one is started after every write: one line, not one a write.
    caplog.set_level(logging.WARNING)
    failures = [RpcError(SOURCE_UNAVAILABLE, "event log unavailable: gone")] * 5 + [
        RpcError(SOURCE_UNAVAILABLE, "event log unavailable: other")]

    async def fail(op: Callable[[Backend], Any]) -> Any:
        raise failures.pop(0)

    async with trio.open_nursery() as nursery:
        checkpoints = Checkpoints(read=fail, write=fail, nursery=lambda: nursery,
                                  closed=lambda: False, counted=lambda: None)
        for _ in range(6):
            checkpoints.due(_FullWal())
            await trio.testing.wait_all_tasks_blocked()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["checkpointing the event log: event log unavailable: gone",
                    "checkpointing the event log: event log unavailable: other"]
