"""A service on the resident daemon outlives the daemon: stopped, killed or
restarted under a long-running agent, the next call connects anew (starting a
daemon as none answers), a call the loss cut short is made again, and what
write-behind queued is kept until a daemon takes it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from support.adk import said, texts
from support.frozen import freeze
from support.resident import World, make_world, pid_alive, point_clients_at, wait_for

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient
from streamd.errors import CLOSED, SOURCE_UNAVAILABLE, RpcError

pytestmark = pytest.mark.subprocess


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


def _service(tmp_path: Path, **options: Any) -> StreamdSessionService:
    db = tmp_path / "events.db"
    return StreamdSessionService(daemon_args=["--db", str(db), "--synchronous", "NORMAL"],
                                 **options)


def _stop(world: World, sig: signal.Signals = signal.SIGTERM) -> int:
    pid = world.daemon_pid()
    os.kill(pid, sig)
    wait_for(lambda: not pid_alive(pid), 30, f"daemon {pid} to end")
    return pid


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_the_call_after_the_daemon_ended_connects_anew(
    world: World, tmp_path: Path, write_behind: bool, sig: signal.Signals
) -> None:
    """Between two calls the daemon ends: the next call starts a new one and
    reads and writes through it (it raised ``closed`` for ever before)."""
    service = _service(tmp_path, write_behind=write_behind)

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            await service.append_event(s, said("before"))
            await service.flush()
            old = _stop(world, sig)
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            assert got is not None
            await service.append_event(got, said("after"))
            await service.flush()
            assert world.daemon_pid() != old
            again = await StreamdSessionService(
                daemon_args=["--db", str(tmp_path / "events.db")]
            ).get_session(app_name="a", user_id="u", session_id="s")
            await service.close()
            assert again is not None
            return texts(again)

    assert asyncio.run(main()) == ["before", "after"]


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_an_append_in_flight_when_the_daemon_dies_is_sent_again(
    world: World, tmp_path: Path, write_behind: bool
) -> None:
    """The daemon is frozen with the append's request in its socket, then
    killed: the request was never read. The append is made again on a new
    daemon and stored once."""
    service = _service(tmp_path, write_behind=write_behind)

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            pid = world.daemon_pid()
            freeze(pid)
            try:
                sent = asyncio.create_task(service.append_event(s, said("in flight")))
                # The task runs to its first real wait in one step: the frame
                # is in the frozen daemon's socket by then.
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            finally:
                os.kill(pid, signal.SIGKILL)
            await sent
            await service.flush()
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            await service.close()
            assert got is not None
            return texts(got)

    assert asyncio.run(main()) == ["in flight"]


def test_write_behind_keeps_its_queue_while_no_daemon_answers(
    world: World, tmp_path: Path
) -> None:
    """A service that may not start a daemon, whose daemon has stopped: the
    flush says why it could not send, nothing queued is dropped, and once a
    daemon answers the next flush stores all of it, in order."""
    db = tmp_path / "events.db"
    daemon = world.start_daemon("--db", str(db), "--synchronous", "NORMAL")
    service = StreamdSessionService(start_daemon=False, write_behind=True)

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            await service.append_event(s, said("one"))
            await service.flush()
            daemon.terminate()
            daemon.wait(30)
            await service.append_event(s, said("two"))
            await service.append_event(s, said("three"))
            with pytest.raises(RpcError) as refused:
                await service.flush()
            assert refused.value.code == SOURCE_UNAVAILABLE
            assert "cannot reach the streamd daemon" in refused.value.message
            world.start_daemon("--db", str(db), "--synchronous", "NORMAL")
            await service.flush()
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            await service.close()
            assert got is not None
            return texts(got)

    assert asyncio.run(main()) == ["one", "two", "three"]


def test_write_behind_on_a_given_client_whose_daemon_died_keeps_what_it_queued(
    tmp_path: Path,
) -> None:
    """A client the caller gave is never replaced; its daemon gone, what was
    queued is not a refusal to drop: every flush says the connection closed
    (the first one did, and the next found nothing left to send)."""

    async def main() -> None:
        async with asyncio.timeout(60):
            client = await AsyncClient.spawn(["--db", str(tmp_path / "events.db")])
            service = StreamdSessionService(client, write_behind=True)
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            assert client.process is not None
            client.process.kill()
            await client.process.wait()
            await service.append_event(s, said("queued"))
            for _ in range(2):
                with pytest.raises(RpcError) as closed:
                    await service.flush()
                assert closed.value.code == CLOSED
            await client.aclose()

    asyncio.run(main())


def test_an_append_stored_before_its_answer_was_lost_is_not_stale_on_a_copy_without_a_marker(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon stores the append and its connection ends before the answer
    comes. The append made again is the first one's duplicate, also for a
    session copy without our marker (checked by its last event): its second
    check found the event it appends stored already, and raised stale."""
    service = _service(tmp_path)
    real = AsyncClient.call
    cut: list[bool] = []

    async def stored_then_lost(self: AsyncClient, call: Any, *args: Any, **kw: Any) -> Any:
        got = await real(self, call, *args, **kw)
        if call.method == "eventlog/append" and not cut:
            cut.append(True)
            raise RpcError(CLOSED, "connection to the streamd daemon closed: end of input")
        return got

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            await service.append_event(s, said("before"))
            copy = s.model_copy(deep=True)
            copy._storage_update_marker = None  # as a caller that copied it field by field
            monkeypatch.setattr(AsyncClient, "call", stored_then_lost)
            await service.append_event(copy, said("once"))
            assert cut
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            await service.close()
            assert got is not None
            assert copy._storage_update_marker == got._storage_update_marker
            return texts(got)

    assert asyncio.run(main()) == ["before", "once"]
