"""A connection's release of its leases at its end is bounded by a coming
close, as the close's own release is: a database that does not answer held
up a daemon's stop for good, since a stop waits for every connection to end
and the release (shielded, as a connection's cleanups are) waited for the
database. What is not released in time is left to go stale.

The store's release is held by a thread handshake; nothing sleeps."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from support.eventlog import thread_event
from support.service import Daemonish, _server

from streamd.eventlog import EventLog
from streamd.eventlog.sqlite import SqliteStore

HOURLY = {"heartbeat_ms": 3_600_000, "stale_after_ms": 10_800_000}


@pytest.mark.parametrize("stop", ["during the release", "before the connection ends"])
async def test_a_stop_ends_a_connection_whose_lease_release_the_database_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    entered, let_go = threading.Event(), threading.Event()
    real = SqliteStore.release_leases

    def wedged(self: SqliteStore, keys: Any) -> int:
        entered.set()
        let_go.wait(60)  # bounded: a test that fails still ends
        return real(self, keys)

    with trio.fail_after(60):
        async with (
            EventLog(tmp_path / "events.db", synchronous="NORMAL", retention_interval=0) as log,
            trio.open_nursery() as nursery,
        ):
            daemon = Daemonish(log, nursery, _server(lambda: log))
            holder = await daemon.connect()
            await holder.result("eventlog/lock.acquire",
                                {"app": "app", "user": "u", "session": "s", **HOURLY})
            monkeypatch.setattr(SqliteStore, "release_leases", wedged)
            try:
                if stop == "before the connection ends":
                    log.expect_close()  # what a daemon's stop does first
                await holder.stream.send_eof()  # the connection ends: its release starts
                await thread_event(entered)
                if stop == "during the release":
                    log.expect_close()
                # The connection ends (the server closes its side) without
                # the database answering; before, it waited for good.
                with trio.fail_after(10), pytest.raises(EOFError):
                    while True:
                        await holder.frame()
                assert not let_go.is_set()
            finally:
                let_go.set()
            nursery.cancel_scope.cancel()
