"""A server log restored from an older backup under a Recall source, then
appended to again: the newest seq is past the index's by the time the source
looks, and no removal was recorded, so neither of the older signs of a
replaced log shows. The seqs the restored log gave anew hold other events.
"""

from __future__ import annotations

import psycopg
import pytest
import trio

from streamd.eventlog import EventLog

from .conftest import call, ids, init, result, say, search, served

pytestmark = pytest.mark.subprocess


def _copy_database(cluster, source: str, target: str) -> None:
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')


def _restore(cluster, name: str, backup: str) -> None:
    """``backup`` put in ``name``'s place, as a restore does; the connections
    to the old one are cut (the source reconnects to the restored one)."""
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{name}_old"')
        admin.execute(f'ALTER DATABASE "{backup}" RENAME TO "{name}"')
        admin.execute(f'DROP DATABASE "{name}_old" WITH (FORCE)')


async def test_a_log_restored_from_an_older_backup_and_appended_to_is_indexed_anew(
    tmp_path, postgres_cluster, postgres_db
):
    name = psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"]
    async with EventLog(postgres_db) as log:
        await say(log, "e1", "checksum drill scheduled")
        await say(log, "e2", "rollback rehearsal planned")
    _copy_database(postgres_cluster, name, f"{name}_bk")  # the backup, at seq 2
    async with EventLog(postgres_db) as log:
        await say(log, "e3", "canary rollout paused")
        await say(log, "e4", "canary rollout resumed")

    with trio.fail_after(60):
        async with served(tmp_path / "own.db") as (peer, _own):
            await result(peer, init(postgres_db, tmp_path / "work"))
            assert ids(await result(peer, search(2, "canary"))) == ["e4", "e3"]

            _restore(postgres_cluster, name, f"{name}_bk")
            async with EventLog(postgres_db) as log:
                # Seqs 3 and 4 again, and 5: other events.
                for event_id in ("f3", "f4", "f5"):
                    await say(log, event_id, f"failover drill step {event_id}")

            # The source's connections were cut: until it has connected again
            # (its backoff), a search answers that it cannot reach the log.
            asked = 100
            while "result" not in (answer := await call(peer, search(asked, "failover"))):
                assert answer["error"]["code"] == -32000, answer
                asked += 1
                await trio.sleep(0.05)
            assert sorted(ids(answer["result"])) == ["f3", "f4", "f5"]
            assert ids(await result(peer, search(4, "canary"))) == []
            assert sorted(ids(await result(peer, search(5, "checksum rollback")))) == [
                "e1", "e2"
            ]
