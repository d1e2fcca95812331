"""How the server backends' opener backs off after a failed connection
(``eventlog.opener``): the writer's and the reader's connections are made in
turn, and a reader refused while the writer connects (a full
``max_connections``, say) must not make and close a writer connection, with its
schema check, a few times a second for as long as it lasts. And what it says
of a watch's listening connection's connect under way: no call waits for it."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from support.frozen import unanswered_listener

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import dbtarget
from streamd.eventlog.opener import PostgresOpener
from streamd.eventlog.sqlite import SqliteOptions


class Runner:
    async def aclose(self) -> None:
        pass


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_reader_refused_beside_a_writer_that_connects_backs_off_for_both(
    autojump_clock: trio.testing.MockClock,
) -> None:
    opener = PostgresOpener(dbtarget.classify("postgresql://streamd@127.0.0.1/events"),
                            SqliteOptions(), 0.05)
    writers = 0

    async def writer() -> Runner:
        nonlocal writers
        writers += 1
        return Runner()

    async def refused() -> Runner:
        raise RpcError(SOURCE_UNAVAILABLE, "FATAL: sorry, too many clients already")

    start = trio.current_time()
    while trio.current_time() - start < 10:
        try:
            await opener._connected("writer", writer)
            await opener._connected("reader", refused)
        except RpcError:
            pass
        await trio.sleep(0.01)  # a call every 10 ms for 10 s
    # 0.25 s doubling to 5 s: attempts at 0, 0.25, 0.75, 1.75, 3.75, 7.75 s.
    assert writers <= 7
    assert opener.fault is not None and "too many clients" in opener.fault


async def test_a_watchs_listening_connect_left_unanswered_shows_and_holds_no_call(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A watch's listening connection whose connect the server never answers:
    # it is a connect under way (db_connecting_s), and no call waits for it,
    # the watches polling beside it. Before: status said calls waited for it.
    pytest.importorskip("psycopg")
    frozen = unanswered_listener(monkeypatch)
    opener = PostgresOpener(dbtarget.classify("postgresql://streamd@127.0.0.1/events"),
                            SqliteOptions(), 0.05)

    async def newest() -> int:
        return 0

    try:
        with trio.fail_after(60):
            async with opener.changes(newest):
                assert opener.connecting_s is not None and opener.connecting_s > 0
                assert not opener.calls_wait
    finally:
        frozen.set()
