"""The asyncio client against real ``streamd`` processes. Each test is a plain
function that runs its own ``asyncio.run`` (no pytest plugin), bounded by
``asyncio.timeout``; the daemon is a ``streamd serve --socket`` shared by the
module, or a ``streamd`` the client spawns on stdio."""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import pytest
from support.serve_socket import serving

from streamd.client import AsyncClient
from streamd.client.protocol import Call
from streamd.errors import CLOSED, RpcError, is_stale_session
from streamd.eventlog.model import Entry, Event, Filter, StateDelta, WatchParams, WatchResult


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content, **kw)


@dataclass
class Served:
    socket: str
    db: Path


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    root = Path(tempfile.mkdtemp(prefix="sdc-", dir="/tmp"))
    sock, db = str(root / "s.sock"), root / "events.db"
    with serving(sock, db, "--synchronous", "NORMAL"):
        yield Served(sock, db)


def run(coro_fn: Any, *args: Any, timeout: float = 30) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro_fn(*args)

    return asyncio.run(bounded())


def test_an_asyncio_program_appends_and_reads_through_the_socket(served: Served) -> None:
    async def main() -> None:
        async with await AsyncClient.connect_socket(served.socket) as c:
            first = await c.append("asyncio-rw", "u", "s", ev("rw-1", {"k": 1}),
                                   state_delta=StateDelta(user={"seen": 1}))
            await c.append("asyncio-rw", "u", "s", ev("rw-2"), expected_seq=first.seq)
            with pytest.raises(RpcError) as info:
                await c.append("asyncio-rw", "u", "s", ev("rw-3"), expected_seq=first.seq)
            assert is_stale_session(info.value)
            got = await c.get_session("asyncio-rw", "u", "s", scoped_state=True)
            assert [e.event.id for e in got.events] == ["rw-1", "rw-2"]
            assert got.user_state == {"seen": 1}
            assert (await c.get_state("asyncio-rw", "u")).user == {"seen": 1}

    run(main)


def test_concurrent_tasks_share_one_connection(served: Served) -> None:
    async def main() -> None:
        async with await AsyncClient.connect_socket(served.socket) as c:
            results = await asyncio.gather(
                *(c.append("asyncio-many", "u", f"s{i % 4}", ev(f"many-{i}")) for i in range(200))
            )
            seqs = [r.seq for r in results]
            assert len(set(seqs)) == 200
            page = await c.since(0, Filter(app="asyncio-many"), 1000)
            assert sorted(e.event.id for e in page.entries) == sorted(f"many-{i}"
                                                                      for i in range(200))

    run(main)


def test_cancelling_the_awaiting_task_cancels_the_call_on_the_daemon(served: Served) -> None:
    async def main() -> None:
        async with await AsyncClient.connect_socket(served.socket) as c:
            # A bare watch request never answers until cancelled.
            hang = Call("eventlog/watch", WatchParams(from_seq=0, filter=Filter(app="none")),
                        WatchResult)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await c.call(hang)
            assert c.in_flight == 1
            # The daemon answers the cancelled request (-32007), which only a
            # $/cancelRequest makes it do; the answer is dropped.
            while c.in_flight:
                await c.ping()
            assert (await c.latest_seq(Filter(app="none"))).seq == 0

    run(main)


def test_a_watch_is_an_async_iterator_over_history_then_live(served: Served) -> None:
    async def main() -> None:
        async with (
            await AsyncClient.connect_socket(served.socket) as a,
            await AsyncClient.connect_socket(served.socket) as b,
        ):
            await a.append("asyncio-watch", "u", "s", ev("w-old"))
            got: list[Entry] = []
            async with await a.watch(0, Filter(app="asyncio-watch")) as w:
                async for entry in w:
                    got.append(entry)
                    if len(got) == 1:
                        await b.append("asyncio-watch", "u", "s", ev("w-new"))
                    else:
                        break
            assert [e.event.id for e in got] == ["w-old", "w-new"]
            while a.in_flight:  # leaving the block cancelled it on the daemon
                await a.ping()

    run(main)


def test_a_cancelled_watch_consumer_cancels_the_watch(served: Served) -> None:
    async def main() -> None:
        async with await AsyncClient.connect_socket(served.socket) as c:

            async def consume() -> None:
                async with await c.watch(0, Filter(app="asyncio-nothing")) as w:
                    async for _ in w:
                        pass

            task = asyncio.create_task(consume())
            while not c.in_flight:
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while c.in_flight:
                await c.ping()

    run(main)


def test_a_stolen_lease_signals_lost(served: Served) -> None:
    async def main() -> None:
        async with await AsyncClient.connect_socket(served.socket) as c:
            lease = await c.acquire_lock("asyncio-lease", "u", "s", heartbeat_ms=50,
                                         stale_after_ms=150)
            # Another process takes the row in the database file itself.
            db = apsw.Connection(str(served.db))
            db.set_busy_timeout(5000)
            with db:
                db.execute(
                    "UPDATE leases SET holder = 'thief/1/00000000' WHERE app_name = ?",
                    ("asyncio-lease",),
                )
            db.close()
            await lease.lost.wait()

    run(main)


def test_a_spawned_daemon_dying_fails_calls_and_loses_leases(tmp_path: Path) -> None:
    async def main() -> None:
        c = await AsyncClient.spawn(["--db", str(tmp_path / "e.db"), "--synchronous", "NORMAL"])
        async with c:
            lease = await c.acquire_lock("app", "u", "s")
            assert c.process is not None
            c.process.kill()
            await lease.lost.wait()
            with pytest.raises(RpcError) as info:
                await c.ping()
            assert info.value.code == CLOSED

    run(main)


def test_a_spawned_daemon_exits_cleanly_when_the_client_closes(tmp_path: Path) -> None:
    db = tmp_path / "e.db"

    async def main() -> int | None:
        c = await AsyncClient.spawn(["--db", str(db)])
        assert (await c.append("app", "u", "s", ev("e1"))).seq == 1
        await c.aclose()
        assert c.process is not None
        return c.process.returncode

    assert run(main) == 0
    assert db.exists() and not os.path.exists(str(db) + "-wal")


def test_a_call_from_another_event_loop_is_refused_and_sends_nothing(served: Served) -> None:
    # It wrote its frame to the opening loop's transport from another thread,
    # the daemon stored the append, and the caller got asyncio's "attached to
    # a different loop": an error for a write that had happened.
    async def main() -> None:
        async with await AsyncClient.connect_socket(served.socket) as c:
            async def elsewhere() -> None:
                with pytest.raises(RuntimeError, match="event loop that opened it"):
                    await c.append("asyncio-other-loop", "u", "s", ev("other-1"))
                with pytest.raises(RuntimeError, match="event loop that opened it"):
                    await c.watch()

            await asyncio.to_thread(asyncio.run, elsewhere())
            assert c.in_flight == 0
            # The connection carries on, and nothing was stored.
            await c.append("asyncio-other-loop", "u", "s", ev("mine-1"))
            got = await c.get_session("asyncio-other-loop", "u", "s")
            assert [e.event.id for e in got.events] == ["mine-1"]

    run(main)


def test_a_call_draining_when_the_daemon_ends_the_connection_leaves_no_unretrieved_error(
    tmp_path: Path,
) -> None:
    # The end of input failed the call's future while the call still awaited
    # the transport's drain; the drain then failed too, that error was
    # raised, and the future's was never read: asyncio logged "Future
    # exception was never retrieved" for every call caught so (a daemon killed
    # under a busy agent).
    async def main() -> None:
        loop = asyncio.get_running_loop()
        unretrieved: list[str] = []
        loop.set_exception_handler(lambda _, ctx: unretrieved.append(ctx["message"]))
        peers: list[asyncio.Transport] = []

        class Deaf(asyncio.Protocol):  # a daemon that reads nothing
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                transport.pause_reading()
                peers.append(transport)

        server = await loop.create_unix_server(Deaf, str(tmp_path / "deaf.sock"))
        async with server:
            c = await AsyncClient.connect_socket(str(tmp_path / "deaf.sock"))
            call = asyncio.ensure_future(c.append("a", "u", "s", ev("big", "x" * (4 << 20))))
            while not (c.in_flight and peers):  # the call is written, its transport full
                await asyncio.sleep(0)
            peers[0].write_eof()  # the daemon ends the connection (stopping) ...
            while not c.closed:  # ... which fails the call's future
                await asyncio.sleep(0)
            peers[0].abort()  # and the write still draining fails in turn
            with pytest.raises(RpcError) as info:
                await call
            assert info.value.code == CLOSED
            await c.aclose()
            del call, info, c  # the call's future goes, and says so if unread
            gc.collect()
            assert unretrieved == []

    run(main)
