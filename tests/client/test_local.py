"""The event log in this process (:class:`streamd.client.local.LocalClient`).

It must answer as the daemon answers: the same calls are made on a real
``streamd serve`` and on a local client of a file of its own, and the answers
compared (times of writing aside). Then what is its own: a write that would
wait for another process's lock waits on the worker thread while the event
loop runs on; a cancelled caller's append still lands and its retry is a
duplicate; a daemon serving the same file sees what it commits; server
addresses, a missing directory and the methods only a running log has are
refused with words that say why. Each test runs its own ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest
from support.local_files import backup_of
from support.serve_socket import serving

from streamd import errors
from streamd.client import AsyncClient
from streamd.client.local import LocalClient
from streamd.errors import RpcError
from streamd.eventlog.model import Event, Filter, StateDelta
from streamd.eventlog.sqlite import SqliteStore

pytestmark = pytest.mark.subprocess

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def ev(event_id: str, content: Any = None, **kw: Any) -> Event:
    at = T0 + dt.timedelta(seconds=int(event_id.strip("e") or 0))
    return Event(id=event_id, author=kw.pop("author", "agent"), content=content,
                 timestamp=at, **kw)


def run(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(60):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def daemon_socket(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A ``streamd serve --socket`` of a database of its own: (socket, database)."""
    with tempfile.TemporaryDirectory(prefix="sdl-", dir="/tmp") as run_dir:
        sock, db = str(Path(run_dir) / "s.sock"), tmp_path / "served.db"
        with serving(sock, db, "--synchronous", "NORMAL"):
            yield sock, db


_WRITTEN_AT = {"created_at", "updated_at"}


def comparable(value: Any) -> Any:
    """An answer as builtins, with the times the log stamps at writing
    (which differ between two logs written a moment apart) blanked."""
    if isinstance(value, RpcError):
        return ("error", value.code, value.message, value.data)
    built = msgspec.to_builtins(value)

    def blank(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: ("T" if k in _WRITTEN_AT and v is not None else blank(v))
                    for k, v in x.items()}
        if isinstance(x, list):
            return [blank(v) for v in x]
        return x

    return blank(built)


Step = Callable[[Any], Awaitable[Any]]

# One scenario, every kind of answer and refusal the ADK service and a
# simple agent rely on, in order.
SCENARIO: list[tuple[str, Step]] = [
    ("create", lambda c: c.create_session("app", "u", "s", {"n": 0}, app_state={"a": 1},
                                          user_state={"lang": "en"})),
    ("create again", lambda c: c.create_session("app", "u", "s")),
    ("append", lambda c: c.append("app", "u", "s", ev("e1", {"k": 1}),
                                  state_delta=StateDelta(session={"n": 1}, user={"seen": 1}),
                                  expected_seq=0)),
    ("duplicate", lambda c: c.append("app", "u", "s", ev("e1", {"k": 1}),
                                     state_delta=StateDelta(session={"n": 1}, user={"seen": 1}))),
    ("conflict", lambda c: c.append("app", "u", "s", ev("e1", {"k": 2}))),
    ("stale", lambda c: c.append("app", "u", "s", ev("e2", {"k": 2}), expected_seq=0)),
    ("invalid", lambda c: c.append("", "u", "s", ev("e2"))),
    ("no session", lambda c: c.append("app", "u", "nope", ev("e9"), expected_seq=3)),
    ("batch", lambda c: c.append_batch([
        c_params("s", "e2", {"k": 2}, branch="b"), c_params("s", "e3", [1, "x"]),
        c_params("t", "e4", None)])),
    ("since", lambda c: c.since(0, Filter(session="s"))),
    ("latest", lambda c: c.latest_seq()),
    ("latest of t", lambda c: c.latest_seq(Filter(session="t"))),
    ("branches", lambda c: c.branches()),
    ("get", lambda c: c.get_session("app", "u", "s")),
    ("get recent", lambda c: c.get_session("app", "u", "s", recent=2, scoped_state=True,
                                           event_time=True)),
    ("get after", lambda c: c.get_session("app", "u", "s", after_seq=1,
                                          after_time=T0 + dt.timedelta(seconds=2))),
    ("get missing", lambda c: c.get_session("app", "u", "missing")),
    ("get many", lambda c: c.get_sessions("app", [("u", "s"), ("u", "x")],
                                          recent=1)),
    ("list", lambda c: c.list_sessions("app", event_time=True)),
    ("state", lambda c: c.get_state("app", "u", "s")),
    ("state then", lambda c: c.get_state("app", "u", "s", as_of_seq=1)),
    ("retention", lambda c: c.set_retention("app", max_events=100)),
    ("retention read", lambda c: c.retention("app")),
    ("delete", lambda c: c.delete_session("app", "u", "t")),
    ("deleted", lambda c: c.get_session("app", "u", "t")),
    ("ping", lambda c: c.ping()),
]


def c_params(session: str, event_id: str, content: Any, **kw: Any) -> Any:
    from streamd.client import calls

    return calls.append("app", "u", session, ev(event_id, content, **kw)).params


async def play(client: Any) -> list[tuple[str, Any]]:
    out = []
    for name, step in SCENARIO:
        try:
            out.append((name, comparable(await step(client))))
        except RpcError as exc:
            out.append((name, comparable(exc)))
    return out


def test_it_answers_every_call_as_the_daemon_answers_it(
    daemon_socket: tuple[str, Path], tmp_path: Path
) -> None:
    sock, _ = daemon_socket

    async def both() -> tuple[list[Any], list[Any]]:
        async with await AsyncClient.connect_socket(sock) as remote:
            theirs = await play(remote)
        async with await LocalClient.open(tmp_path / "local.db") as local:
            ours = await play(local)
        return theirs, ours

    theirs, ours = run(both())
    assert [name for name, _ in ours] == [name for name, _ in SCENARIO]
    for (name, expected), (_, got) in zip(theirs, ours, strict=True):
        assert got == expected, name
    # The scenario did reach each kind of answer it names.
    answers = dict(ours)
    assert answers["duplicate"]["duplicate"] is True
    for refused in ("create again", "conflict", "stale", "invalid", "no session",
                    "get missing", "deleted"):
        assert answers[refused][0] == "error", refused


def test_a_write_that_would_wait_for_a_lock_waits_off_the_event_loop(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> None:
        async with await LocalClient.open(db) as client:
            await client.create_session("app", "u", "s")
            other = apsw.Connection(str(db))
            other.execute("BEGIN IMMEDIATE")  # another process's write lock
            append = asyncio.ensure_future(client.append("app", "u", "s", ev("e1")))
            while client.in_flight == 0:  # the append is handed to the worker ...
                await asyncio.sleep(0)
            for _ in range(3):  # ... and the loop goes on meanwhile
                await asyncio.sleep(0)
            assert not append.done()
            # A read made now queues behind it (the connection is the worker's).
            ping = asyncio.ensure_future(client.ping())
            await asyncio.sleep(0)
            assert client.in_flight == 2 and not ping.done()
            other.execute("COMMIT")
            result = await append
            await ping
            assert result.seq == 1 and not result.duplicate
            assert client.in_flight == 0
            other.close()

    run(scenario())


def test_a_cancelled_append_may_still_land_and_its_retry_is_a_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "events.db"
    committing = threading.Event()  # the worker has started the append
    commit = SqliteStore.append_commit

    def signalled(store: SqliteStore, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            committing.set()
        return commit(store, *args, **kwargs)

    monkeypatch.setattr(SqliteStore, "append_commit", signalled)

    async def scenario() -> None:
        async with await LocalClient.open(db) as client:
            await client.create_session("app", "u", "s")
            other = apsw.Connection(str(db))
            other.execute("BEGIN IMMEDIATE")
            append = asyncio.ensure_future(client.append("app", "u", "s", ev("e1")))
            await asyncio.to_thread(committing.wait, 30)
            append.cancel()
            with pytest.raises(asyncio.CancelledError):
                await append
            # The call is still the worker's: nothing may run inline beside it.
            assert client.in_flight == 1
            other.execute("COMMIT")
            while client.in_flight:
                await asyncio.sleep(0.001)  # the worker's commit: a thread, no event to await
            retry = await client.append("app", "u", "s", ev("e1"))
            assert retry.seq == 1 and retry.duplicate
            other.close()

    run(scenario())


def test_an_open_that_would_wait_for_a_lock_waits_off_the_event_loop(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    db.touch()
    other = apsw.Connection(str(db))
    # The new file's first open must write (WAL mode, its schema). Held
    # exclusively, so the opener waits for its very first (shared) lock and
    # holds none meanwhile: with a reserved lock held here instead, the
    # opener's shared lock, taken before it waits, could refuse our COMMIT
    # below (both wanting the exclusive lock of a rollback-journal file).
    other.execute("BEGIN EXCLUSIVE")

    async def scenario() -> None:
        opening = asyncio.ensure_future(LocalClient.open(db, busy_timeout_ms=60_000))
        await asyncio.sleep(0)  # an open that waited here would block the loop
        assert not opening.done()
        other.execute("COMMIT")
        async with await opening as client:
            assert (await client.append("app", "u", "s", ev("e1"))).seq == 1

    run(scenario())
    other.close()


def test_a_daemon_serving_the_same_file_sees_its_commits(
    daemon_socket: tuple[str, Path]
) -> None:
    sock, db = daemon_socket

    async def scenario() -> None:
        async with (
            await AsyncClient.connect_socket(sock) as remote,
            await LocalClient.open(db) as local,
        ):
            await remote.create_session("app", "u", "s")
            async with await remote.watch(0, Filter(session="s")) as watch:
                await local.append("app", "u", "s", ev("e1", "from this process"))
                entry = await anext(watch)
                assert entry.event.content == "from this process" and entry.seq == 1
            assert (await remote.append("app", "u", "s", ev("e2"))).seq == 2
            assert [e.event.id for e in (await local.get_session("app", "u", "s")).events] == [
                "e1", "e2"]

    run(scenario())


def test_a_new_file_is_private_and_a_closed_client_says_closed(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def scenario() -> LocalClient:
        client = await LocalClient.open(db)
        await client.append("app", "u", "s", ev("e1"))
        await client.aclose()
        await client.aclose()  # idempotent
        with pytest.raises(RpcError) as closed:
            await client.ping()
        assert closed.value.code == errors.CLOSED
        return client

    run(scenario())
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    # The connection is closed: SQLite removed the WAL as the last one closed.
    assert not Path(f"{db}-wal").exists()


def test_a_file_restored_under_the_client_stops_it_and_is_left_as_restored(
    tmp_path: Path,
) -> None:
    """A restore done under a running in-process log (another file renamed
    over the path): the next call fails naming the cause, every later call
    too, nothing is written to the restored file, and closing works."""
    db = tmp_path / "events.db"

    async def scenario() -> None:
        client = await LocalClient.open(db)
        await client.append("app", "u", "s", ev("e1"))
        backup = tmp_path / "backup.db"
        backup_of(db, backup)
        os.replace(backup, db)
        for call in (lambda: client.append("app", "u", "s", ev("e2")), client.ping):
            with pytest.raises(RpcError) as stopped:
                await call()
            assert stopped.value.code == errors.SOURCE_UNAVAILABLE
            assert stopped.value.data["reason"] == "database_file_replaced"
            assert "open the log again" in stopped.value.message
        await client.aclose()

    run(scenario())
    restored = apsw.Connection(str(db))
    assert restored.execute("SELECT event_id FROM events").fetchall() == [("e1",)]
    restored.close()


@pytest.mark.parametrize("target", ["postgresql://db.example/events", "mysql://h/events",
                                    "host=/tmp dbname=events"])
def test_a_server_address_is_refused_naming_the_daemon(target: str) -> None:
    with pytest.raises(RpcError) as refused:
        run(LocalClient.open(target))
    assert refused.value.code == errors.INVALID_PARAMS
    assert "served by the daemon" in refused.value.message


def test_a_missing_directory_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    with pytest.raises(RpcError) as refused:
        run(LocalClient.open(tmp_path / "nowhere" / "events.db"))
    assert refused.value.code == errors.SOURCE_UNAVAILABLE
    assert "does not exist" in refused.value.message
    assert not (tmp_path / "nowhere").exists()


def test_what_only_a_running_log_does_is_refused_naming_the_daemon(tmp_path: Path) -> None:
    async def scenario() -> list[RpcError]:
        refusals = []
        async with await LocalClient.open(tmp_path / "events.db") as client:
            for call in (client.compact("app"), client.call(_lock_call())):
                try:
                    await call
                except RpcError as exc:
                    refusals.append(exc)
        return refusals

    refusals = run(scenario())
    assert [r.code for r in refusals] == [errors.METHOD_NOT_FOUND] * 2
    assert all("daemon" in r.message for r in refusals)


def _lock_call() -> Any:
    from streamd.client import calls

    return calls.lock_acquire("app", "u", "s")


def test_a_fifo_at_the_path_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    fifo = tmp_path / "events.db"
    os.mkfifo(fifo)
    with pytest.raises(RpcError) as refused:
        run(LocalClient.open(fifo))
    assert "is a named pipe (FIFO), not a regular file" in refused.value.message
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left as it was


def test_another_event_loop_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    async def opened() -> LocalClient:
        return await LocalClient.open(db)

    client = run(opened())
    with pytest.raises(RuntimeError, match="event loop that opened it"):
        run(client.ping())
    run(client.aclose())  # closing needs no loop of its own


def test_params_are_read_as_the_daemon_reads_them_whatever_their_python_type(
    tmp_path: Path,
) -> None:
    from streamd.client.protocol import Call
    from streamd.eventlog.model import Session

    async def scenario() -> tuple[Any, RpcError]:
        async with await LocalClient.open(tmp_path / "events.db") as client:
            made = await client.call(Call("eventlog/sessions.create",
                                          {"app": "app", "user": "u", "session": "s"}, Session))
            try:
                await client.call(Call("eventlog/sessions.create", {"app": "app"}, Session))
            except RpcError as exc:
                return made, exc
        raise AssertionError("a create without a user was accepted")

    made, refused = run(scenario())
    assert (made.app, made.user, made.session, made.last_seq) == ("app", "u", "s", 0)
    assert refused.code == errors.INVALID_PARAMS
    assert "eventlog/sessions.create params" in refused.message and "user" in refused.message


def test_the_wal_is_checkpointed_as_it_grows(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    body = "x" * 3000  # about one page an event, so 1,000 pages come soon

    async def scenario() -> tuple[int, int]:
        async with await LocalClient.open(db, synchronous="NORMAL") as client:
            for i in range(1, 2501):
                await client.append("app", "u", "s", ev(f"e{i}", body))
            # Measured while open: closing the last connection checkpoints anyway.
            return os.path.getsize(db), os.path.getsize(f"{db}-wal")

    database, wal = run(scenario())
    # Without checkpoints the WAL would hold every page written (~10 MB) and
    # the database file none of them.
    assert database > 5_000_000
    assert wal < 6_000_000


def test_a_caller_awaiting_append_after_append_lets_the_loop_turn(tmp_path: Path) -> None:
    # Inline calls do not suspend their caller; the client lets the loop turn
    # every few milliseconds of them, so other tasks run meanwhile.
    async def scenario() -> int:
        turns = 0

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        async with await LocalClient.open(tmp_path / "events.db", synchronous="NORMAL") as c:
            await c.create_session("app", "u", "s")
            ticking = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            before = turns
            for i in range(1, 301):
                await c.append("app", "u", "s", ev(f"e{i}"))
            ticking.cancel()
            return turns - before

    assert run(scenario()) >= 1


def test_a_client_left_open_at_exit_closes_quietly(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    script = (
        "import asyncio, sys\n"
        "from streamd.client.local import LocalClient\n"
        "kept = []\n"
        "async def main():\n"
        "    client = await LocalClient.open(sys.argv[1])\n"
        "    await client.ping()\n"
        "    kept.append(client)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(db)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert not Path(f"{db}-wal").exists()  # closed: the last connection removed its WAL


def test_every_method_of_the_daemon_is_served_here_or_refused_naming_it() -> None:
    from streamd.client.local import served_methods
    from streamd.eventlog.service import eventlog_methods

    def no_log() -> Any:
        raise AssertionError("the table is read, never served")

    daemons = {m.name: m.params for m in eventlog_methods(no_log)}
    ours = served_methods()
    assert set(ours) <= set(daemons)
    for name, params in ours.items():
        assert params is daemons[name], name
    # What only a running log does: its jobs (a producer per watch, a
    # heartbeat per lease, the compactor's steps).
    assert set(daemons) - set(ours) == {
        "eventlog/watch", "eventlog/compact", "eventlog/lock.acquire", "eventlog/lock.release"}
