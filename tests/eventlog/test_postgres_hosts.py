"""Daemons on two hosts sharing one PostgreSQL log, and the event log's
conformance suite run on PostgreSQL.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from support.hosts import Host
from support.hosts import append_params as _append

from streamd.errors import SESSION_LOCKED

# --- daemons on two hosts ------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


async def test_two_daemons_on_two_hosts_share_one_log(
    postgres_cluster: Any,
    postgres_db: str,
    tmp_path: Path,
) -> None:
    name = psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"]
    url = postgres_cluster.url(name)
    with trio.fail_after(60):
        a = await Host.start(url, tmp_path / "host-a")
        b = await Host.start(url, tmp_path / "host-b")
        try:
            watch = await a.send("eventlog/watch", {"from_seq": 0})
            first = await b.call("eventlog/append", _append("from-b"))
            assert first["result"] == {"seq": 1, "duplicate": False}
            # A's watcher is woken by B's commit (LISTEN/NOTIFY), not by a poll.
            entry = await a.note("eventlog/entry")
            assert entry["params"]["watch"] == watch
            assert entry["params"]["entry"]["event"]["id"] == "from-b"
            second = await a.call("eventlog/append", _append("from-a"))
            assert second["result"]["seq"] == 2
            got = await b.call("eventlog/since", {"from_seq": 0})
            assert [e["event"]["id"] for e in got["result"]["entries"]] == ["from-b", "from-a"]
            # The same event id from the other host is a retry, not a second event.
            again = await b.call("eventlog/append", _append("from-a"))
            assert again["result"] == {"seq": 2, "duplicate": True}
            # A lease held on one host is held on the other.
            lock = await a.call(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "s"}
            )
            assert "lock" in lock["result"]
            taken = await b.call(
                "eventlog/lock.acquire", {"app": "app", "user": "u", "session": "s"}
            )
            assert taken["error"]["code"] == SESSION_LOCKED
            assert taken["error"]["data"]["holder"] == lock["result"]["holder"]
            # Nothing of the log went to either host's own state directory.
            assert not list((tmp_path / "host-a").rglob("*.db"))
            assert not list((tmp_path / "host-b").rglob("*.db"))
        finally:
            for host in (a, b):
                with trio.move_on_after(10):
                    await host.stop()
                if host.proc.returncode is None:
                    host.proc.kill()


def test_the_eventlog_conformance_suite_passes_on_postgres(
    postgres_cluster: Any,
    postgres_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # postgres_db made the migrated template the adapter copies for each case.
    from streamd import conformance

    suite = REPO / "conformance" / "eventlog"
    cases = len(conformance.discover_cases(suite))
    adapter = shlex.join(
        [
            sys.executable,
            str(REPO / "tests" / "support" / "pg_cluster.py"),
            "adapter",
            postgres_cluster.conninfo(),
        ]
    )
    assert conformance.main(["verify", str(suite), "--adapter", adapter]) == 0, (
        capsys.readouterr().out
    )
    assert f"{cases} passed, 0 failed" in capsys.readouterr().out
