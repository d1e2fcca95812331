"""Fixtures shared by the event log's test modules (a plugin: see conftest.py).

* ``fx``: one storage backend of the contract (``test_eventlog_store.BACKENDS``),
  every test that takes it running once per backend.
* ``daemon``: one EventLog served over in-memory JSON-RPC connections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from streamd.eventlog import EventLog
from support import store_contract as contract
from support.service import Daemonish, _server


@pytest.fixture(params=sorted(contract.BACKENDS))
def fx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[contract.Fixture]:
    yield from contract.BACKENDS[request.param](request, tmp_path)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemonish]:
    async with (
        EventLog(tmp_path / "events.db", synchronous="NORMAL", watch_interval=60) as log,
        trio.open_nursery() as nursery,
    ):
        yield Daemonish(log, nursery, _server(lambda: log))
        nursery.cancel_scope.cancel()
