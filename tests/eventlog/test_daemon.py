"""The daemon owns one event log per process: created by the first eventlog/*
call, shared by every connection, closed when the serve function returns.

In-process tests drive :class:`streamd.daemon.Daemon` over memory streams; the
process tests run ``python -m streamd`` and end it by EOF and by signal. A clean
close is visible on disk: SQLite removes the ``-wal`` file when the last
connection to the database closes, and leaves it behind when a process dies
holding the log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from support.rpc_client import Client, rpc

from streamd import conformance
from streamd import daemon as daemon_module
from streamd.cli.commands import _config, build_parser
from streamd.daemon import Config, Daemon
from streamd.errors import RpcError, is_closed
from streamd.eventlog.model import SinceParams
from streamd.eventlog.sqlite import SqliteStore

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
EVENTLOG_SUITE = REPO / "conformance" / "eventlog"
EVENTLOG_CASES = 25


def append(event_id: str, session: str = "s") -> dict[str, Any]:
    return {
        "app": "app",
        "user": "u",
        "session": session,
        "event": {"id": event_id, "author": "agent", "content": event_id},
    }


@asynccontextmanager
async def serving(daemon: Daemon) -> AsyncIterator[tuple[trio.Nursery, Any]]:
    """The daemon running, and a way to open connections to it."""
    async with daemon.running(), trio.open_nursery() as nursery:

        async def connect() -> Client:
            client, server = trio.testing.memory_stream_pair()
            nursery.start_soon(daemon.server().serve, server, server)
            return Client(client)

        yield nursery, connect
        nursery.cancel_scope.cancel()


async def test_no_database_exists_until_the_first_eventlog_call(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()  # an explicit path's directory must exist
    db = tmp_path / "state" / "events.db"
    daemon = Daemon(Config(db=str(db)))
    with trio.fail_after(10):
        async with serving(daemon) as (_, connect):
            peer = await connect()
            reply = await peer.call("recall/health", {"deadline": "2999-01-01T00:00:00Z"})
            assert reply["id"] == 1  # answered by the Recall side, no database touched
            assert not db.exists() and not daemon.eventlog_opened
            assert (await peer.call("eventlog/ping", {}))["result"] == {}
            assert db.exists() and daemon.eventlog_opened


async def test_a_connection_that_only_uses_the_log_makes_no_recall_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []
    real = daemon_module.RecallService

    def counted(*args: Any, **kwargs: Any) -> object:
        service = real(*args, **kwargs)
        made.append(service)
        return service

    monkeypatch.setattr(daemon_module, "RecallService", counted)
    daemon = Daemon(Config(db=str(tmp_path / "events.db"), synchronous="NORMAL"))
    with trio.fail_after(10):
        async with serving(daemon) as (_, connect):
            peer = await connect()
            assert (await peer.call("eventlog/ping", {}))["result"] == {}
            assert made == []
            reply = await peer.call("recall/health", {"deadline": "2999-01-01T00:00:00Z"})
            assert reply["result"]["status"] == "unavailable" and len(made) == 1  # made when asked
            await peer.call("recall/health", {"deadline": "2999-01-01T00:00:00Z"})
            assert len(made) == 1  # and kept for the connection


async def test_every_connection_shares_one_log(tmp_path: Path) -> None:
    daemon = Daemon(Config(db=str(tmp_path / "events.db"), synchronous="NORMAL"))
    with trio.fail_after(10):
        async with serving(daemon) as (_, connect):
            peers = [await connect() for _ in range(3)]
            # All three ask at once: one log is created, not three.
            async with trio.open_nursery() as nursery:
                for i, peer in enumerate(peers):
                    nursery.start_soon(peer.call, "eventlog/append", append(f"e{i}"))
            page = (await peers[0].call("eventlog/since", {"from_seq": 0}))["result"]
            assert sorted(e["event"]["id"] for e in page["entries"]) == ["e0", "e1", "e2"]
            assert await daemon.eventlog() is await daemon.eventlog()


async def test_leaving_running_closes_the_log_and_later_calls_say_closed(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    daemon = Daemon(Config(db=str(db)))
    with trio.fail_after(10):
        async with serving(daemon) as (_, connect):
            peer = await connect()
            assert (await peer.call("eventlog/append", append("e1")))["result"]["seq"] == 1
            eventlog = await daemon.eventlog()
            assert Path(f"{db}-wal").exists()
        assert eventlog.closed
        assert not Path(f"{db}-wal").exists()  # the last connection closed cleanly
        with pytest.raises(RpcError) as caught:
            await daemon.eventlog()
        assert is_closed(caught.value)
        with pytest.raises(RpcError) as caught:
            await eventlog.ping()
        assert is_closed(caught.value)


async def test_a_daemon_never_run_serves_recall_and_refuses_eventlog_calls(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    daemon = Daemon(Config(db=str(db)))
    with trio.fail_after(10):
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon.server().serve, server, server)
            reply = await Client(client).call("eventlog/ping", {})
            assert reply["error"]["code"] == -32000
            assert "only while the daemon runs" in reply["error"]["message"]
            nursery.cancel_scope.cancel()
    assert not db.exists()


async def test_a_bad_eventlog_option_fails_eventlog_calls_not_the_daemon(tmp_path: Path) -> None:
    daemon = Daemon(Config(db=str(tmp_path / "events.db"), watch_interval=0))
    with trio.fail_after(10):
        async with serving(daemon) as (_, connect):
            peer = await connect()
            reply = await peer.call("eventlog/ping", {})
            assert reply["error"]["code"] == -32000
            assert "event log configuration" in reply["error"]["message"]
            reply = await peer.call("no/such", {})
            assert reply["error"]["code"] == -32601  # the connection still serves


async def test_the_daemon_applies_its_synchronous_watch_interval_and_watch_budgets(
    tmp_path: Path,
) -> None:
    daemon = Daemon(
        Config(
            db=str(tmp_path / "e.db"),
            watch_interval=0.05,
            synchronous="NORMAL",
            watch_buffer_bytes=65536,
            watch_total_bytes=1 << 20,
        )
    )
    with trio.fail_after(10):
        async with serving(daemon):
            eventlog = await daemon.eventlog()
            assert await eventlog.synchronous_level() == 1
            assert eventlog.watch_interval == 0.05
            assert eventlog.watch_buffer_bytes == 65536
            assert eventlog.watch_budget.limit == 1 << 20
            assert eventlog.path == tmp_path / "e.db"


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        (["--db", "/a.db"], {}, Config("/a.db", 0.2, "FULL")),
        (["--db", "/a.db", "serve", "--socket", "/s"], {}, Config("/a.db", 0.2, "FULL")),
        (["serve", "--db", "/b.db", "--synchronous", "NORMAL"], {}, Config("/b.db", 0.2, "NORMAL")),
        (["--db", "/a.db", "serve", "--db", "/b.db"], {}, Config("/b.db", 0.2, "FULL")),
        (["--watch-interval-ms", "50", "serve"], {}, Config(None, 0.05, "FULL")),
        ([], {"STREAMD_DB": "/env.db"}, Config(None, 0.2, "FULL")),
        ([], {}, Config(None, 0.2, "FULL", 4 * 1024 * 1024)),
        (["--watch-buffer-bytes", "65536", "serve"], {}, Config(None, 0.2, "FULL", 65536)),
        (["serve", "--watch-buffer-bytes", "65536"], {}, Config(None, 0.2, "FULL", 65536)),
        (["--watch-total-bytes", "1048576", "serve"], {},
         Config(None, 0.2, "FULL", watch_total_bytes=1 << 20)),
        (["daemon", "--watch-total-bytes", "1048576"], {},
         Config(None, 0.2, "FULL", watch_total_bytes=1 << 20)),
        (["--max-leases", "50", "serve"], {}, Config(None, 0.2, "FULL", max_leases=50)),
        (["daemon", "--max-leases", "50"], {}, Config(None, 0.2, "FULL", max_leases=50)),
        (["--max-held-bytes", "268435456", "serve"], {},
         Config(None, 0.2, "FULL", max_held_bytes=256 << 20)),
        (["daemon", "--max-held-bytes", "268435456"], {},
         Config(None, 0.2, "FULL", max_held_bytes=256 << 20)),
    ],
)
def test_daemon_options_reach_the_config_before_or_after_serve(
    argv: list[str], env: dict[str, str], want: Config
) -> None:
    assert _config(build_parser().parse_args(argv)) == want


def test_the_held_bytes_limit_reaches_the_daemons_servers(tmp_path: Path) -> None:
    from streamd.resident.claim import Claim
    from streamd.resident.server import ResidentDaemon, ResidentOptions

    daemon = Daemon(Config(max_held_bytes=256 << 20))
    assert daemon.server().held.limit == 256 << 20
    resident = ResidentDaemon(daemon, ResidentOptions(runtime_dir=str(tmp_path)),
                              Claim(str(tmp_path)))
    assert resident.server.held.limit == 256 << 20


# --- the real process -------------------------------------------------------------------


async def start_daemon(*args: str, env: dict[str, str] | None = None) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "streamd", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})},
    )


async def call_process(
    proc: trio.Process, buffer: bytearray, request_id: int, method: str, params: Any
) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    await proc.stdin.send_all(rpc(request_id, method, params))
    while True:
        while b"\n" not in buffer:
            chunk = await proc.stdout.receive_some(65536)
            if not chunk:
                raise EOFError
            buffer += chunk
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        frame = json.loads(line)
        if frame.get("id") == request_id:
            return frame


@pytest.mark.parametrize("ending", ["eof", "SIGTERM", "SIGINT"])
async def test_the_process_closes_the_log_cleanly_at_eof_and_on_signals(
    tmp_path: Path, ending: str
) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(30):
        proc = await start_daemon("--db", str(db))
        buffer = bytearray()
        for i in range(3):
            reply = await call_process(proc, buffer, i + 1, "eventlog/append", append(f"e{i}"))
            assert reply["result"]["seq"] == i + 1
        # A live watch must not keep the process from exiting.
        assert proc.stdin is not None
        await proc.stdin.send_all(rpc(9, "eventlog/watch", {"from_seq": 0}))
        assert Path(f"{db}-wal").exists()
        if ending == "eof":
            await proc.stdin.aclose()
        else:
            proc.send_signal(getattr(signal, ending))
        assert await proc.wait() == 0
    assert not Path(f"{db}-wal").exists()  # closed, not abandoned
    store = SqliteStore.open(str(db))
    assert [e.event.id for e in store.since(SinceParams(from_seq=0, limit=100)).entries] == [
        "e0",
        "e1",
        "e2",
    ]
    store.close()


async def test_the_process_honours_streamd_db(tmp_path: Path) -> None:
    db = tmp_path / "from-env.db"
    with trio.fail_after(30):
        proc = await start_daemon(env={"STREAMD_DB": str(db)})
        reply = await call_process(proc, bytearray(), 1, "eventlog/append", append("e1"))
        assert reply["result"] == {"seq": 1, "duplicate": False}
        assert proc.stdin is not None
        await proc.stdin.aclose()
        assert await proc.wait() == 0
    assert db.exists()


async def test_a_recall_only_session_creates_no_database(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with trio.fail_after(30):
        proc = await start_daemon(env={"XDG_STATE_HOME": str(state), "STREAMD_DB": ""})
        reply = await call_process(proc, bytearray(), 1, "recall/shutdown", {})
        assert reply["result"] == {}
        assert await proc.wait() == 0
    assert not state.exists()


# --- conformance ----------------------------------------------------------------------------


def test_the_eventlog_conformance_suite_passes_with_all_its_cases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert len(conformance.discover_cases(EVENTLOG_SUITE)) == EVENTLOG_CASES
    assert conformance.main(["verify", str(EVENTLOG_SUITE)]) == 0, capsys.readouterr().out
    assert f"{EVENTLOG_CASES} passed, 0 failed" in capsys.readouterr().out
