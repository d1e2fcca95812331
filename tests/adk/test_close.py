"""``StreamdSessionService.close()``: closed for good, on every loop, with
nothing left open and nothing acknowledged lost.

Through the resident daemon (the service's own client, which it replaces
when the daemon's connection ends) and on a log in this process
(``database=``). What is open is counted in this process: the sockets
(daemon) or the descriptors of the log's files (in process), against the
count before the service's first call.

Before: a call in flight when close closed its client found it closed and
connected anew (or opened the file again), and a call after close did the
same; either held that connection or file past the close, for good.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from support.adk import said, texts
from support.frozen import stopped
from support.resident import World, make_world, point_clients_at, wait_for

from streamd.adk import StreamdSessionService, lifetime
from streamd.client.asyncio_client import AsyncClient
from streamd.client.local import LocalClient
from streamd.errors import CLOSED, RpcError

pytestmark = pytest.mark.subprocess


class Setup:
    """A service of the mode under test on ``db``, and what it holds open."""

    def __init__(self, mode: str, db: Path, world: World | None) -> None:
        self.mode, self.db, self.world = mode, db, world

    def service(self, **options: Any) -> StreamdSessionService:
        if self.mode == "in-process":
            return StreamdSessionService(database=self.db, synchronous="NORMAL", **options)
        return StreamdSessionService(
            daemon_args=["--db", str(self.db), "--synchronous", "NORMAL"], **options)

    def open_now(self) -> int:
        """The sockets of this process (daemon), or its descriptors of the
        log's files (in process)."""
        want = "socket:" if self.mode == "daemon" else str(self.db)
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith(want):
                    count += 1
            except OSError:
                pass  # closed meanwhile (listdir's own descriptor)
        return count

    async def stored(self) -> list[str]:
        """The texts stored in session a/u/s, read apart from the service."""
        reader = self.service()
        try:
            got = await reader.get_session(app_name="a", user_id="u", session_id="s")
        finally:
            await reader.close()
        assert got is not None
        return texts(got)


@pytest.fixture(params=["daemon", "in-process"])
def setup(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Setup]:
    if request.param == "in-process":
        yield Setup("in-process", tmp_path / "events.db", None)
        return
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield Setup("daemon", tmp_path / "events.db", w)


def _refused_as_closed(exc: BaseException) -> bool:
    return (isinstance(exc, RpcError) and exc.code == CLOSED
            and exc.data == {"reason": lifetime.SERVICE_CLOSED})


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_calls_in_flight_at_close_are_answered_and_stored_and_nothing_is_left_open(
    setup: Setup, write_behind: bool
) -> None:
    """A whole read and an append (through a copy without our marker, so it
    reads before it writes) are in flight when close begins: both are
    answered, the append is stored, and once close has returned nothing of
    the service's is open."""
    service = setup.service(write_behind=write_behind)

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            await service.append_event(s, said("first"))
            await service.flush()
            copy = s.model_copy(deep=True)
            copy._storage_update_marker = None  # as a caller that copied it field by field
            # In process the whole read goes to the log's worker, and the
            # append's read waits behind it there.
            reading = asyncio.create_task(
                service.get_session(app_name="a", user_id="u", session_id="s"))
            appending = asyncio.create_task(service.append_event(copy, said("in flight")))
            await asyncio.sleep(0)  # each task runs to its first wait for the log
            await service.close()
            assert setup.open_now() == before
            got = await reading
            appended = await appending
            assert got is not None and texts(got)[0] == "first"
            assert texts(copy)[-1] == "in flight" and appended.id == copy.events[-1].id
            assert setup.open_now() == before  # nothing opened again after
            return await setup.stored()

    assert asyncio.run(main()) == ["first", "in flight"]


def test_every_call_after_close_is_refused_and_opens_nothing(setup: Setup) -> None:
    service = setup.service()

    async def main() -> None:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            await service.close()
            assert setup.open_now() == before
            calls: list[Callable[[], Any]] = [
                lambda: service.create_session(app_name="a", user_id="u"),
                lambda: service.get_session(app_name="a", user_id="u", session_id="s"),
                lambda: service.list_sessions(app_name="a"),
                lambda: service.get_user_state(app_name="a", user_id="u"),
                lambda: service.append_event(s, said("late")),
                lambda: service.delete_session(app_name="a", user_id="u", session_id="s"),
            ]
            for call in calls:
                with pytest.raises(RpcError) as refused:
                    await call()
                assert _refused_as_closed(refused.value), refused.value
                assert "closed" in refused.value.message
            await service.close()  # a second close: nothing left to do
            assert setup.open_now() == before
            assert await setup.stored() == []

    asyncio.run(main())


def test_a_close_from_another_loops_thread_closes_the_service_on_every_loop(
    setup: Setup,
) -> None:
    """The service is used on a loop in a thread (ADK's Runner.run) and
    closed from the main thread's loop: that loop's client closes too, and
    its next call is refused. Before, it served on, its connection open."""
    service = setup.service()
    turn = asyncio.new_event_loop()
    thread = threading.Thread(target=turn.run_forever, daemon=True)
    thread.start()

    def on_turn(call: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(call, turn).result(60)

    try:
        before = setup.open_now()
        s = on_turn(service.create_session(app_name="a", user_id="u", session_id="s"))
        on_turn(service.append_event(s, said("on the turn's loop")))
        assert setup.open_now() > before

        async def close() -> None:
            async with asyncio.timeout(60):
                await service.close()

        asyncio.run(close())
        assert setup.open_now() == before
        with pytest.raises(RpcError) as refused:
            on_turn(service.get_session(app_name="a", user_id="u", session_id="s"))
        assert _refused_as_closed(refused.value)
        assert setup.open_now() == before
        assert asyncio.run(setup.stored()) == ["on the turn's loop"]
    finally:
        turn.call_soon_threadsafe(turn.stop)
        thread.join(30)
        turn.close()


def test_a_write_behind_close_from_another_loop_lets_that_loops_send_end_and_stores_it(
    setup: Setup,
) -> None:
    """A turn's loop (in a thread) queued an event and is busy when the main
    thread's loop closes the service: the close lets the turn's send end on
    its own loop, and the event is stored. Before, the close raised
    RuntimeError (write-behind used from two loops at once) and left the
    turn's client open."""
    service = setup.service(write_behind=True)
    turn = asyncio.new_event_loop()
    thread = threading.Thread(target=turn.run_forever, daemon=True)
    thread.start()
    busy, free = threading.Event(), threading.Event()

    async def queue_then_hold_the_loop() -> None:
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        await service.append_event(s, said("queued on the turn's loop"))
        busy.set()
        free.wait(60)  # the loop's thread is held: its send task has not run

    try:
        before = setup.open_now()
        held = asyncio.run_coroutine_threadsafe(queue_then_hold_the_loop(), turn)
        assert busy.wait(60)

        async def close() -> None:
            async with asyncio.timeout(60):
                closing = asyncio.create_task(service.close())
                await asyncio.sleep(0)  # the close waits for the turn's send
                free.set()
                await closing

        asyncio.run(close())
        held.result(60)
        assert setup.open_now() == before
        assert asyncio.run(setup.stored()) == ["queued on the turn's loop"]
    finally:
        free.set()
        turn.call_soon_threadsafe(turn.stop)
        thread.join(30)
        turn.close()


def test_a_second_close_returns_once_the_first_has_closed_everything(setup: Setup) -> None:
    service = setup.service()

    async def main() -> None:
        async with asyncio.timeout(60):
            before = setup.open_now()
            await service.create_session(app_name="a", user_id="u", session_id="s")
            first = asyncio.create_task(service.close())
            await asyncio.sleep(0)  # the first close is under way
            await service.close()
            assert setup.open_now() == before
            await first

    asyncio.run(main())


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_a_runner_closed_after_its_service_closes_and_the_appends_are_stored(
    setup: Setup, write_behind: bool
) -> None:
    """ADK's ``Runner.close`` flushes its service: closing the service first
    (as an application's own teardown may) must not make the runner's close
    raise. Before: the flush was refused as a call after close."""
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner

    service = setup.service(write_behind=write_behind)
    runner = Runner(app_name="a", agent=LlmAgent(name="helper", model="scripted"),
                    session_service=service)

    async def main() -> None:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            await service.append_event(s, said("queued at close"))
            await service.close()
            await runner.close()
            await service.flush()  # and a flush of our own, as often
            assert setup.open_now() == before
            assert await setup.stored() == ["queued at close"]

    asyncio.run(main())


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


def test_write_behind_events_close_could_not_send_are_said_unsent(
    world: World, tmp_path: Path
) -> None:
    """The daemon has stopped and the service may not start one: close
    cannot send what is queued, and says how many events are not stored
    (they were lost without a word: nothing sends them after a close)."""
    daemon = world.start_daemon("--db", str(tmp_path / "events.db"), "--synchronous", "NORMAL")
    service = StreamdSessionService(start_daemon=False, write_behind=True)

    async def main() -> None:
        async with asyncio.timeout(60):
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            daemon.terminate()
            daemon.wait(30)
            await service.append_event(s, said("one"))
            await service.append_event(s, said("two"))
            with pytest.raises(RpcError) as unsent:
                await service.close()
            assert unsent.value.data == {"reason": lifetime.SERVICE_CLOSED, "unsent": 2}
            assert "2 queued events" in unsent.value.message
            assert "not stored" in unsent.value.message

    asyncio.run(main())


def test_an_append_that_the_close_cut_short_says_its_outcome_is_unknown(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon stops answering (SIGSTOP) with an append's request in its
    socket: close waits out its grace, closes, and the append says it may
    have been stored (the daemon may still read it), instead of connecting
    anew behind the close."""
    monkeypatch.setattr(lifetime, "CLOSE_GRACE", 0.5)
    setup = Setup("daemon", tmp_path / "events.db", world)
    service = setup.service()

    async def main() -> None:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            with stopped([world.daemon_pid()]):
                appending = asyncio.create_task(service.append_event(s, said("cut")))
                await asyncio.sleep(0)  # its request is in the frozen daemon's socket
                await service.close()
            with pytest.raises(RpcError) as cut:
                await appending
            assert cut.value.code == CLOSED
            assert cut.value.data == {"reason": lifetime.SERVICE_CLOSED, "outcome": "unknown"}
            assert "unknown" in cut.value.message and "may have been" in cut.value.message
            assert setup.open_now() == before

    asyncio.run(main())


def test_a_write_behind_close_against_a_daemon_that_stopped_answering_ends_in_its_grace(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon stops answering (SIGSTOP) with two write-behind events
    queued: close gives their send its grace, then closes, saying how many
    were not stored. Before: it waited for as long as the daemon did."""
    monkeypatch.setattr(lifetime, "CLOSE_GRACE", 0.5)
    setup = Setup("daemon", tmp_path / "events.db", world)
    service = setup.service(write_behind=True)

    async def main() -> None:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            with stopped([world.daemon_pid()]):
                await service.append_event(s, said("one"))
                await service.append_event(s, said("two"))
                with pytest.raises(RpcError) as unsent:
                    async with asyncio.timeout(20):  # the grace is 0.5 s
                        await service.close()
            assert unsent.value.code == CLOSED
            assert unsent.value.data["unsent"] == 2, unsent.value.data
            assert setup.open_now() == before

    asyncio.run(main())


def test_a_daemon_connection_of_an_idle_loop_ends_before_close_returns(
    world: World, tmp_path: Path
) -> None:
    """The service was used on a loop no thread runs now (run turn by turn
    with run_until_complete, idle between): close hangs up that loop's
    connection before it returns, and the daemon sees it end. Before: its
    close was queued on that loop, and the connection stayed up until the
    loop ran again. When it does, nothing of the client is left open."""
    setup = Setup("daemon", tmp_path / "events.db", world)
    service = setup.service()

    def connected() -> int:
        return int(json.loads(world.run("status", "--json").stdout)["connections"])

    turn = asyncio.new_event_loop()
    try:
        before = setup.open_now()
        turn.run_until_complete(
            service.create_session(app_name="a", user_id="u", session_id="s"))
        assert connected() == 1

        async def close() -> None:
            async with asyncio.timeout(60):
                await service.close()

        asyncio.run(close())
        wait_for(lambda: connected() == 0, 30, "the daemon to see the connection end")

        async def tidy() -> None:  # the turn's loop runs again: its close ends
            async with asyncio.timeout(60):
                here = asyncio.current_task()
                await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not here))

        turn.run_until_complete(tidy())
        assert setup.open_now() == before
    finally:
        turn.close()


def test_two_services_on_one_file_close_in_either_order_and_the_other_serves_on(
    tmp_path: Path,
) -> None:
    """Two services on one file in one loop share its connection; each closes
    in either order, and a service made after both reads what they wrote."""

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            db = tmp_path / "events.db"
            for order in ("first, second", "second, first"):
                one = StreamdSessionService(database=db, synchronous="NORMAL")
                two = StreamdSessionService(database=db, synchronous="NORMAL")
                s = await one.create_session(app_name="a", user_id="u", session_id=order)
                got = await two.get_session(app_name="a", user_id="u", session_id=order)
                assert got is not None
                await two.append_event(got, said(order))
                closing = (one, two) if order.startswith("first") else (two, one)
                await closing[0].close()
                with pytest.raises(RpcError):
                    await closing[0].append_event(s, said("after its close"))
                other = closing[1]
                got = await other.get_session(app_name="a", user_id="u", session_id=order)
                assert got is not None
                await other.append_event(got, said("after the other's close"))
                await other.close()
            after = StreamdSessionService(database=db, synchronous="NORMAL")
            seen = []
            for order in ("first, second", "second, first"):
                got = await after.get_session(app_name="a", user_id="u", session_id=order)
                assert got is not None
                seen += texts(got)
            await after.close()
            return seen

    assert asyncio.run(main()) == [
        "first, second", "after the other's close", "second, first", "after the other's close"]


def _held_sends(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Event, asyncio.Event]:
    """From now on each ``append_batch`` of the mode's client says it is
    sending (the first event), then waits for the second before it goes on."""
    kind: Any = LocalClient if setup.mode == "in-process" else AsyncClient
    real = kind.append_batch  # the method table's row: bound below
    sending, go_on = asyncio.Event(), asyncio.Event()

    async def held(self: Any, appends: Any) -> Any:
        sending.set()
        await go_on.wait()
        return await real.__get__(self, kind)(appends)

    monkeypatch.setattr(kind, "append_batch", held)
    return sending, go_on


def test_a_close_cancelled_while_it_sends_still_stores_what_write_behind_acknowledged(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close's caller is cancelled (an asyncio.timeout around close, a
    Ctrl-C in a teardown) while close sends what write-behind queued: the
    send goes on, shielded, the two events are stored, then the cancellation
    is raised, with nothing left open. Before: the cancelled close closed its
    clients under the send, and both events were lost without a word."""
    service = setup.service(write_behind=True)

    async def main() -> list[str]:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            sending, go_on = _held_sends(setup, monkeypatch)
            await service.append_event(s, said("one"))
            await service.append_event(s, said("two"))
            closing = asyncio.create_task(service.close())
            await sending.wait()
            closing.cancel()
            await asyncio.sleep(0)  # the close sees its cancellation first
            go_on.set()
            with pytest.raises(asyncio.CancelledError):
                await closing
            assert setup.open_now() == before
            return await setup.stored()

    assert asyncio.run(main()) == ["one", "two"]


def test_a_cancelled_close_that_cannot_send_in_its_grace_says_how_many_are_lost(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The send never ends (a log that does not answer): a cancelled close
    gives it the close's grace, then closes everything, logs at error level
    how many acknowledged events are not stored, and its CancelledError says
    so too. Before: they were dropped without a word."""
    monkeypatch.setattr(lifetime, "CLOSE_GRACE", 0.2)
    service = setup.service(write_behind=True)

    async def main() -> None:
        async with asyncio.timeout(60):
            before = setup.open_now()
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            sending, _never = _held_sends(setup, monkeypatch)
            for text in ("one", "two", "three"):
                await service.append_event(s, said(text))
            closing = asyncio.create_task(service.close())
            await sending.wait()
            closing.cancel()
            with pytest.raises(asyncio.CancelledError) as cancelled:
                await closing
            assert setup.open_now() == before
            assert any("3 queued events" in note for note in cancelled.value.__notes__)

    with caplog.at_level("ERROR", logger="streamd.adk"):
        asyncio.run(main())
    lost = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(lost) == 1 and "3 queued events" in lost[0].getMessage()
    assert "not stored" in lost[0].getMessage()


def test_a_client_whose_close_fails_leaves_no_unretrieved_exception(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's close raises (its connection broke under it): the
    service's close still ends, closed for good, the failure is logged once
    as a warning, and asyncio reports no exception that nobody read. Before:
    "Task exception was never retrieved"."""
    service = setup.service()
    unread: list[dict[str, Any]] = []

    async def broken(self: Any) -> None:
        raise OSError("the connection broke")

    async def main() -> None:
        async with asyncio.timeout(60):
            asyncio.get_running_loop().set_exception_handler(lambda _, c: unread.append(c))
            s = await service.create_session(app_name="a", user_id="u", session_id="s")
            kind: Any = LocalClient if setup.mode == "in-process" else AsyncClient
            real = kind.aclose
            monkeypatch.setattr(kind, "aclose", broken)
            await service.close()
            monkeypatch.setattr(kind, "aclose", real)
            gc.collect()  # a task dropped unread reports it as it goes
            with pytest.raises(RpcError) as refused:
                await service.append_event(s, said("after"))
            assert _refused_as_closed(refused.value)

    with caplog.at_level("WARNING", logger="streamd.adk"):
        asyncio.run(main())
    assert unread == []
    failed = [r for r in caplog.records if r.name == "streamd.adk"]
    assert len(failed) == 1 and "the connection broke" in failed[0].getMessage()

