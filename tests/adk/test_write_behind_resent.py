"""Write-behind whose connection to the resident daemon is lost between two
runs, on every backend (the daemon started on a SQLite file, or on a fresh
PostgreSQL or MariaDB database of the servers the fixtures start): the run
whose answer was lost is sent again, with what was queued meanwhile, on a new
connection; what was stored is answered as stored and the rest goes in behind
it, once each, and the session copy stays current."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from support.adk import said, texts
from support.resident import World, make_world, point_clients_at

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient
from streamd.errors import CLOSED, RpcError

pytestmark = pytest.mark.subprocess

SERVER_DBS = {"postgres": "postgres_db", "mysql": "mysql_db"}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


@pytest.fixture(params=["sqlite", *SERVER_DBS])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "events.db")
    return str(request.getfixturevalue(SERVER_DBS[request.param]))


def test_write_behind_sends_a_run_again_after_its_answer_was_lost_with_what_was_queued_since(
    world: World, db: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = StreamdSessionService(
        daemon_args=["--db", db, "--synchronous", "NORMAL"], write_behind=True)
    real = AsyncClient.call
    cut: list[bool] = []
    session: list[Any] = []

    async def stored_then_lost(self: AsyncClient, call: Any, *args: Any, **kw: Any) -> Any:
        got = await real(self, call, *args, **kw)
        if call.method == "eventlog/append_batch" and not cut:
            cut.append(True)
            # Queued while the run was out: sent again behind it, in one batch.
            await service.append_event(session[0], said("queued meanwhile"))
            raise RpcError(CLOSED, "connection to the streamd daemon closed: end of input")
        return got

    async def main() -> None:
        async with asyncio.timeout(60):
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            session.append(s)
            await service.append_event(s, said("first run"))
            await service.flush()  # one run stored and answered
            monkeypatch.setattr(AsyncClient, "call", stored_then_lost)
            await service.append_event(s, said("second run, 1"))
            await service.append_event(s, said("second run, 2"))
            await service.flush()
            assert cut
            monkeypatch.setattr(AsyncClient, "call", real)
            await service.append_event(s, said("after"))  # the copy is current
            await service.flush()
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            await service.close()
            assert got is not None
            assert s._storage_update_marker == got._storage_update_marker
            assert texts(got) == [
                "first run", "second run, 1", "second run, 2", "queued meanwhile", "after"]

    asyncio.run(main())
