"""A PostgreSQL or MariaDB log that goes back under its open watches: the
database restored from an older dump while a daemon serves it, so that the
log's newest seq is below what the watches were given, and its next seqs
name other events.

Before, every such watch went on from its cursor: the events the restored
log stored at seqs it had passed (the next appends, this daemon's or another
host's) were never handed over, and nothing said so. Now each ends with
``log_went_back``. The restore is what it leaves in the database: the rows
after seq 3 gone and the seq counter at 3, written behind the log's back.
Each test runs on both server backends and is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import trio
from support.eventlog import ev
from support.service import Daemonish, append

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import EventLog
from streamd.eventlog.watch import Watch

Raw = Callable[[str], None]


@pytest.fixture(params=["postgres", "mysql"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Raw]]:
    """A fresh log's URL on each server backend, and SQL behind its back."""
    if request.param == "postgres":
        import psycopg

        cluster = request.getfixturevalue("postgres_cluster")
        conninfo = request.getfixturevalue("postgres_db")

        def pg(sql: str) -> None:
            with psycopg.connect(conninfo, autocommit=True) as db:
                db.execute("SET search_path = streamd")
                db.execute(sql)

        yield cluster.url(psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]), pg
    else:
        from streamd.eventlog.mysql.store import MysqlOptions, connect
        from streamd.eventlog.mysql.url import parse

        url = request.getfixturevalue("mysql_db")

        def my(sql: str) -> None:
            db = connect(parse(url), MysqlOptions())
            try:
                db.cursor().execute(sql)
            finally:
                db.close()

        yield url, my


def restore_to_seq_3(raw: Raw) -> None:
    """What restoring a dump taken at seq 3 leaves: the log as it was then."""
    raw("DELETE FROM events WHERE seq > 3")
    raw("UPDATE seq_counter SET seq = 3")


async def given(w: Watch, n: int) -> list[int]:
    return [(await w.__anext__()).seq for _ in range(n)]


def ended_went_back(exc: RpcError) -> None:
    assert exc.code == SOURCE_UNAVAILABLE
    assert isinstance(exc.data, dict)
    assert exc.data["reason"] == "log_went_back"
    assert (exc.data["newest_seq"], exc.data["seen_seq"]) == (3, 6)
    assert "went back" in exc.message


async def test_a_watch_ends_when_this_daemons_append_finds_the_log_gone_back(
    server: tuple[str, Raw],
) -> None:
    url, raw = server
    with trio.fail_after(60):
        async with EventLog(url, synchronous="NORMAL", watch_interval=60) as log:
            for i in range(6):
                await log.append("a", "u", "s", ev(f"e{i}"))
            async with log.watch(0) as w:
                assert await given(w, 6) == [1, 2, 3, 4, 5, 6]
                restore_to_seq_3(raw)
                # The append is the restored log's: it takes seq 4 again.
                assert (await log.append("a", "u", "s", ev("after"))).seq == 4
                with pytest.raises(RpcError) as ended:
                    await given(w, 1)  # before: waited for seq 7, past "after" for ever
                ended_went_back(ended.value)
            # A watch opened now follows the restored log, "after" included.
            async with log.watch(0) as again:
                got = [(await again.__anext__()).event.id for _ in range(4)]
                assert got == ["e0", "e1", "e2", "after"]


async def test_a_watch_ends_when_another_hosts_append_finds_the_log_gone_back(
    server: tuple[str, Raw],
) -> None:
    url, raw = server
    with trio.fail_after(60):
        async with (
            EventLog(url, synchronous="NORMAL", watch_interval=0.05) as log,
            EventLog(url, synchronous="NORMAL") as other_host,
        ):
            for i in range(6):
                await log.append("a", "u", "s", ev(f"e{i}"))
            async with log.watch(0) as w:
                assert await given(w, 6) == [1, 2, 3, 4, 5, 6]
                restore_to_seq_3(raw)
                assert (await other_host.append("a", "u", "s", ev("elsewhere"))).seq == 4
                # Seen by the poller (the other host's commit is no commit of
                # this log's writer). Before: never ended, seq 4 behind its cursor.
                with pytest.raises(RpcError) as ended, trio.fail_after(20):
                    await given(w, 1)
                ended_went_back(ended.value)


async def test_the_wire_watch_ends_with_log_went_back_and_no_seq_to_resume_from(
    server: tuple[str, Raw],
) -> None:
    # What a daemon's client is told: the error, how far it was given, and
    # not "resume with from_seq=6" (the restored log's seqs after 3 are other
    # events; resuming there skips them, as the watch did before).
    url, raw = server
    with trio.fail_after(60):
        async with (
            EventLog(url, synchronous="NORMAL", watch_interval=60) as log,
            trio.open_nursery() as nursery,
        ):
            daemon = Daemonish.serving(log, nursery)
            c = await daemon.connect()
            for i in range(6):
                await c.result("eventlog/append", append(f"e{i}"))
            watch_id = await c.start("eventlog/watch", {"from_seq": 0})
            seen = [(await c.notification())["params"]["entry"]["seq"] for _ in range(6)]
            assert seen == [1, 2, 3, 4, 5, 6]
            restore_to_seq_3(raw)
            assert (await c.result("eventlog/append", append("after")))["seq"] == 4
            error = (await c.response(watch_id))["error"]
            assert error["code"] == SOURCE_UNAVAILABLE
            assert error["data"] == {"reason": "log_went_back", "newest_seq": 3,
                                     "seen_seq": 6, "last_seq": 6}
            assert "from_seq=" not in error["message"]
            nursery.cancel_scope.cancel()
