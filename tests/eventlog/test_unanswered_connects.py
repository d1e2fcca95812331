"""Servers that accept a connection and never answer it, met by every place
that opens a server connection, on PostgreSQL and on MariaDB, with a finite
connect timeout (one far past every bound here, so that waiting it out fails
the test; the default of 5 s is one such) and with none (``connect_timeout=0``).

What must hold: a close ends without waiting for the connect (nothing it
could make is needed), a call cancelled while it waits for one is answered at
once, other clients' reads are not held up by a connection being opened
beside them, a daemon stops and a command-line ``streamd log`` ends on Ctrl-C.

The unanswering servers are the test's own sockets (``support/black_hole.py``):
a black hole where no server is needed, and a proxy to the real server that
stops forwarding new connections when the test says. Every wait is on a
thread handshake or a socket the test holds; each test is bounded, and past its
bound the held connections are let go (:func:`bounded`), so a connect the code
cannot leave ends the test as a failure rather than hanging it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from support.black_hole import BOUND_S, TIMEOUTS, BlackHole, Proxy, bounded, hole_url, ping_into
from support.eventlog import ev, thread_event
from support.hosts import REPO, Host

from streamd.errors import RpcError, is_closed
from streamd.eventlog import EventLog
from streamd.eventlog.model import Filter

backends = pytest.mark.parametrize("backend", ["postgres", "mysql"])
timeouts = pytest.mark.parametrize("timeout", list(TIMEOUTS))


# --- the log's first connections: a server that never answers ---------------------------


@backends
@timeouts
async def test_a_log_closes_at_once_while_its_first_connect_goes_unanswered(
        backend: str, timeout: str) -> None:
    answers: list[RpcError] = []
    with BlackHole() as hole, bounded(hole):
        async with (EventLog(hole_url(backend, hole.port, TIMEOUTS[timeout])) as log,
                    trio.open_nursery() as nursery):
            nursery.start_soon(ping_into, log, answers)
            await hole.wait_held(1)
            # Before: the close waited for the open, and so for the connect.
            await log.aclose()
    assert len(answers) == 1 and is_closed(answers[0])


@backends
@timeouts
async def test_a_call_cancelled_while_the_first_connect_goes_unanswered_is_answered_at_once(
        backend: str, timeout: str) -> None:
    with BlackHole() as hole, bounded(hole):
        async with EventLog(hole_url(backend, hole.port, TIMEOUTS[timeout])) as log:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(log.ping)
                    nursery.start_soon(log.latest_seq)
                    await hole.wait_held(1)
                    scope.cancel()
            assert scope.cancelled_caught
            # Both waited for one attempt, which goes on: no second connect.
            assert hole.held == 1


# --- a daemon and a command line ------------------------------------------------------------


@backends
@timeouts
async def test_a_daemon_stops_and_answers_while_its_first_connect_goes_unanswered(
        backend: str, timeout: str, tmp_path: Path) -> None:
    with BlackHole() as hole:
        host = await Host.start(hole_url(backend, hole.port, TIMEOUTS[timeout]),
                                tmp_path / "host")
        try:
            with bounded(hole):
                await host.send("eventlog/ping", {})
                await hole.wait_held(1)
                host.proc.send_signal(signal.SIGTERM)
                # Before: the request was never answered and the daemon never
                # stopped (its close waited for the connect).
                answer = await host.frame()
                assert answer["id"] == 1 and "error" in answer
                assert await host.proc.wait() == 0
        finally:
            if host.proc.returncode is None:
                host.proc.kill()


@pytest.mark.parametrize("command", ["ping", "verify"])
@backends
@timeouts
async def test_ctrl_c_ends_a_log_command_at_once_while_its_connect_goes_unanswered(
        backend: str, timeout: str, command: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "XDG_STATE_HOME": str(tmp_path)}
    env.pop("STREAMD_DB", None)
    with BlackHole() as hole:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamd", "log", "--db",
             hole_url(backend, hole.port, TIMEOUTS[timeout]), command],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        try:
            with bounded(hole):
                await hole.wait_held(1)
                proc.send_signal(signal.SIGINT)
                # Before: Ctrl-C waited for the connect, then printed a Trio
                # traceback ("Nursery stack corrupted"); verify on MySQL never
                # ended.
                assert await proc.wait() == 130
                assert proc.stderr is not None
                err = b""
                while chunk := await proc.stderr.receive_some(65536):
                    err += chunk
                assert b"Traceback" not in err, err.decode()
        finally:
            if proc.returncode is None:
                proc.kill()


def test_a_ctrl_c_inside_a_close_still_leaves_the_logs_nursery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C reaches a close through its shield (as when a streamd log
    # command's close waited for a connect). The log's nursery was never
    # left: Trio ended the run with "Nursery stack corrupted".
    async def interrupted(self: EventLog) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(EventLog, "_close", interrupted)

    async def main() -> None:
        async with EventLog(tmp_path / "events.db"):
            pass

    with pytest.raises(KeyboardInterrupt):
        trio.run(main)


# --- a server that answered the first connections, and not the next ---------------------


@dataclass
class Served:
    """A fresh log on one of the test's servers, reached through proxies."""

    upstream: Path
    """The server's own socket."""
    store_cls: type[Any]
    url_via: Any
    """``url_via(directory, timeout)``: the log's URL through a proxy whose
    socket is in ``directory`` (:meth:`proxy`)."""
    socket_name: str
    direct: str
    """The log's URL on the server's own socket."""

    @contextmanager
    def proxy(self, timeout: str, forward: int | None = None) -> Iterator[tuple[str, Proxy]]:
        """A proxy to the server, and the log's URL through it."""
        # Short: a Unix socket's path must fit in 108 bytes.
        with (tempfile.TemporaryDirectory(prefix="bh") as directory,
              Proxy(self.upstream, Path(directory) / self.socket_name, forward) as proxy):
            yield self.url_via(directory, TIMEOUTS[timeout]), proxy


@pytest.fixture(params=["postgres", "mysql"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    if request.param == "postgres":
        import psycopg
        from support import pg_cluster

        from streamd.eventlog.postgres.store import PostgresStore

        cluster = request.getfixturevalue("postgres_cluster")
        name = psycopg.conninfo.conninfo_to_dict(request.getfixturevalue("postgres_db"))["dbname"]
        yield Served(
            cluster.socket_dir / f".s.PGSQL.{pg_cluster.PORT}", PostgresStore,
            lambda d, t: (f"postgresql://{pg_cluster.SUPERUSER}@/{name}?host={d}"
                          f"&port={pg_cluster.PORT}&connect_timeout={t}"),
            f".s.PGSQL.{pg_cluster.PORT}", cluster.url(name))
    else:
        from streamd.eventlog.mysql.store import MysqlStore

        server = request.getfixturevalue("mysql_server")
        direct = request.getfixturevalue("mysql_db")
        name = direct.split("/")[3].split("?")[0]
        yield Served(
            server.socket, MysqlStore,
            lambda d, t: f"mysql://root@/{name}?unix_socket={d}/mysqld.sock&connect_timeout={t}",
            "mysqld.sock", direct)


def held(store_cls: type[Any], name: str, monkeypatch: pytest.MonkeyPatch,
         ) -> tuple[threading.Event, threading.Event]:
    """``store_cls.name`` made to wait, once in it (the first event), until
    the second event is set."""
    inside, finish = threading.Event(), threading.Event()
    original = getattr(store_cls, name)

    def waiting(self: Any, *args: Any) -> Any:
        inside.set()
        finish.wait(BOUND_S)
        return original(self, *args)

    monkeypatch.setattr(store_cls, name, waiting)
    return inside, finish


@timeouts
async def test_a_log_closes_at_once_while_its_readers_first_connect_goes_unanswered(
        served: Served, timeout: str) -> None:
    answers: list[RpcError] = []
    with served.proxy(timeout, forward=1) as (url, proxy), bounded(proxy):
        async with EventLog(url, synchronous="NORMAL") as log:

            async def append() -> None:
                try:
                    await log.append("a", "u", "s", ev("e0"))
                except RpcError as exc:
                    answers.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(append)
                await proxy.wait_held(1)  # the writer's was answered; the reader's is not
                await log.aclose()
    assert len(answers) == 1 and is_closed(answers[0])


@timeouts
async def test_a_reader_the_server_leaves_unanswered_holds_up_no_read(
        served: Served, timeout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    inside, finish = held(served.store_cls, "list_sessions", monkeypatch)
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            proxy.hold_new()
            pinged = trio.Event()

            async def ping() -> None:
                await log.ping()
                pinged.set()

            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(log.list_sessions, "a", "u")
                    await thread_event(inside)
                    nursery.start_soon(ping)
                    await proxy.wait_held(1)  # the connection opened for the ping
                    finish.set()  # the slow read ends: its connection is free
                    # Before: the ping waited for the connect it had started.
                    await pinged.wait()
                    assert await log.latest_seq() == 1
            finally:
                finish.set()
            # And the close does not wait for that connect either.


@timeouts
async def test_a_scan_whose_connection_goes_unanswered_holds_up_no_read_and_answers_a_cancel(
        served: Served, timeout: str) -> None:
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0", branch="b"))
            proxy.hold_new()
            with trio.CancelScope() as scan:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(log.branches, Filter(app="a"))
                    await proxy.wait_held(1)  # the scans' connection
                    await log.ping()
                    # Before: the scan's cancel waited for its connect.
                    scan.cancel()
            assert scan.cancelled_caught
            # Before: the close waited for that connect too.
            await log.aclose()


@timeouts
async def test_a_statements_cancel_whose_own_connection_goes_unanswered_gives_up(
        served: Served, timeout: str) -> None:
    # A cancel goes out on a connection of its own (MySQL's KILL QUERY,
    # PostgreSQL's cancel request). On MySQL it took the URL's connect
    # timeout, for ever with none: its thread, one of Trio's forty, never
    # came back, after the call it was for had long been cut.
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        store = await trio.to_thread.run_sync(served.store_cls.open, url)
        try:
            proxy.hold_new()
            await trio.to_thread.run_sync(store.cancel_running, abandon_on_cancel=True)
            assert proxy.held == 1  # it was the cancel's connection that went unanswered
        finally:
            store.close()


@timeouts
async def test_a_log_closes_at_once_while_a_watchs_listening_connection_goes_unanswered(
        served: Served, timeout: str) -> None:
    if served.store_cls.__name__ != "PostgresStore":
        pytest.skip("only PostgreSQL listens; MySQL's watches poll on the reader")
    got: list[str] = []
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            proxy.hold_new()

            async def watch() -> None:
                try:
                    async with log.watch(0) as w:
                        async for entry in w:
                            got.append(entry.event.id)
                except RpcError as exc:
                    assert is_closed(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await proxy.wait_held(1)  # the watch's listening connection
                await log.aclose()
    assert got in ([], ["e0"])


@timeouts
async def test_a_log_whose_writer_reconnects_into_silence_closes_and_loses_nothing_acknowledged(
        served: Served, timeout: str) -> None:
    # The writer's connection broken (a restarted server), its reconnect
    # unanswered: a lease's heartbeats and an append wait on it, and the
    # close does not (one grace at most, see eventlog/server_runner.py).
    acknowledged = ["e0"]
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        async with EventLog(url, synchronous="FULL") as log:
            assert (await log.append("a", "u", "s", ev("e0"))).seq == 1
            await log.acquire_lock("a", "u", "s", heartbeat_ms=50, stale_after_ms=150)
            proxy.hold_new()
            proxy.cut_forwarded()

            async def append() -> None:
                try:
                    await log.append("a", "u", "s", ev("e1"))
                except RpcError:
                    return  # refused, cut or closed: it says whether it may have committed
                acknowledged.append("e1")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(append)
                await proxy.wait_held(1)  # a reconnect, the writer's or a reader's
                await log.aclose()
    async with EventLog(served.direct, synchronous="NORMAL") as log:
        ids = [e.event.id for e in (await log.since(0)).entries]
    assert set(acknowledged) <= set(ids) <= {"e0", "e1"}


@timeouts
async def test_a_reconnect_the_server_leaves_unanswered_shows_how_long_the_log_has_been_without_it(
        served: Served, timeout: str) -> None:
    # What streamd status shows (db_connecting_s, db_reconnecting_s): the log
    # connected, then its connections broke and the server left their
    # reconnects unanswered. No attempt failed (none ends, with no connect
    # timeout), and the connect under way was a connection's own, not one the
    # log opens: before, nothing at all showed.
    refused: list[RpcError] = []
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        async with EventLog(url, synchronous="NORMAL") as log:
            await log.append("a", "u", "s", ev("e0"))
            assert log.connecting_s is None
            proxy.hold_new()
            proxy.cut_forwarded()

            async def ping() -> None:
                # The first may fail on the broken connection; a later one
                # reconnects, until that attempt fails.
                while not any("cannot connect" in e.message for e in refused):
                    await ping_into(log, refused)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ping)
                await proxy.wait_held(1)
                waited = log.connecting_s
                assert waited is not None and waited >= 0
                lost = log.reconnecting_s
                assert lost is not None and lost >= waited
                assert log.calls_wait  # the ping's, which waits for it
                assert log.fault is None
                proxy.let_go()  # the attempt fails at once
            # Failed, it is the log's fault, and the outage goes on through it.
            assert log.fault is not None and "cannot connect" in log.fault
            later = log.reconnecting_s
            assert later is not None and later >= lost
            assert log.connecting_s is None  # none under way between attempts


def _listener_ended(direct: str) -> bool:
    """The log's listening connection ended by the server (as an idle
    session timeout or an operator would): whether one was found."""
    import psycopg

    with psycopg.connect(direct, autocommit=True) as conn:
        return bool(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'").fetchall())


@timeouts
async def test_a_watchs_listening_connection_reconnecting_alone_shows_in_status(
        served: Served, timeout: str) -> None:
    # The connection a PostgreSQL watch listens on, ended, and its reconnect
    # left unanswered, while the log's own connections still work: watches no
    # longer hear other hosts' appends but by polling. Before: status said
    # nothing (db_connecting_s and db_reconnecting_s null).
    if served.store_cls.__name__ != "PostgresStore":
        pytest.skip("only PostgreSQL listens; MySQL's watches poll on the reader")
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        async with (EventLog(url, synchronous="NORMAL", watch_interval=0.05) as log,
                    log.watch(0) as watch):
            await log.append("a", "u", "s", ev("e0"))
            assert (await watch.__anext__()).event.id == "e0"
            proxy.hold_new()
            while not await trio.to_thread.run_sync(_listener_ended, served.direct):
                await trio.sleep(0.01)  # the watch's LISTEN not yet made
            # Until the listener's reconnect is held, unanswered. Another
            # connection may come first (a reader opened beside a busy one):
            # an open, which is no reconnect.
            await proxy.wait_held(1)
            while log.reconnecting_s is None:
                await proxy.wait_held(proxy.held + 1)
            waited, lost = log.connecting_s, log.reconnecting_s
            assert waited is not None and lost is not None
            if proxy.held == 1:
                # The listener's connect alone: the outage holds it. (A
                # reader's open held first is the oldest connect, and older
                # than the outage: under load it came first.)
                assert lost >= waited
            assert log.fault is None  # no attempt has failed
            assert await log.latest_seq() == 1  # the log's own connections serve
            proxy.let_go()  # the attempts fail at once
            while log.fault is None:
                await trio.sleep(0.01)  # the threads reporting back
            assert "cannot" in log.fault
            later = log.reconnecting_s
            assert later is not None and later >= lost
        # Closed with the watch: its attempts no longer count.
        assert log.reconnecting_s is None and log.connecting_s is None


@timeouts
async def test_cancels_the_server_leaves_unanswered_hold_none_of_the_threads_other_work_needs(
        served: Served, timeout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # As many calls cancelled at once as Trio's default limiter has threads,
    # each cancel's own connection (PostgreSQL's cancel request, MySQL's KILL
    # QUERY) left unanswered. Before: the cancels held all 40 tokens for
    # their 2 s, and any trio.to_thread.run_sync of the process (another
    # log's close, a Recall build) waited that long.
    from streamd.eventlog import cancels
    from streamd.eventlog.server_runner import ServerRunner

    if served.store_cls.__name__ == "PostgresStore":
        from streamd.eventlog.postgres.runner import PostgresRunner as runner_cls
    else:
        from streamd.eventlog.mysql.runner import MysqlRunner as runner_cls  # type: ignore[assignment]
    default = trio.to_thread.current_default_thread_limiter()
    count = int(default.total_tokens)
    running = threading.Semaphore(0)
    finish = threading.Event()

    def statement(self: Any) -> None:
        running.release()
        finish.wait(BOUND_S)

    monkeypatch.setattr(served.store_cls, "statement", statement, raising=False)
    own = trio.CapacityLimiter(1)  # the test's waits take no token of the default limiter
    with served.proxy(timeout) as (url, proxy), bounded(proxy):
        stores = [await trio.to_thread.run_sync(served.store_cls.open, url) for _ in range(count)]
        try:
            runners: list[ServerRunner] = [runner_cls(s) for s in stores]
            proxy.hold_new()
            scopes = [trio.CancelScope() for _ in runners]

            async def call(runner: ServerRunner, scope: trio.CancelScope) -> None:
                with scope:
                    await runner.run(lambda store: store.statement())

            async with trio.open_nursery() as nursery:
                for runner, scope in zip(runners, scopes, strict=True):
                    nursery.start_soon(call, runner, scope)
                for _ in range(count):
                    assert await trio.to_thread.run_sync(running.acquire, True, BOUND_S,
                                                         limiter=own)
                for scope in scopes:
                    scope.cancel()
                # As many as the process sends at once; the rest wait for them.
                sent = min(count, cancels.MAX_LEFT)
                assert await trio.to_thread.run_sync(proxy.wait_held_blocking, sent,
                                                     limiter=own)
                assert default.borrowed_tokens == 0
                assert await trio.to_thread.run_sync(lambda: "other work") == "other work"
                finish.set()
            assert all(scope.cancelled_caught for scope in scopes)
        finally:
            finish.set()
            for store in stores:
                store.close()
