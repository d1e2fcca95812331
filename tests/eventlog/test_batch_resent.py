"""A writer's ``eventlog/append_batch`` over a real Unix socket, on every
backend: a batch sent again on a new connection after the first one was lost
is stored once, where the first put it, and so is one sent twice at once (the
group commit takes both into one transaction as often as not); a stale copy
of a batch is refused.

The daemon is :func:`streamd.daemon.serve_socket` run in this process
(:func:`support.serve_socket.in_process`) on the test's database (a SQLite
file, or a fresh PostgreSQL or MariaDB database of the servers the fixtures
start).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from support.rpc_client import Client
from support.serve_socket import connect, in_process
from support.service import append

from streamd.errors import SESSION_NOT_FOUND, STALE_SESSION

SERVER_DBS = {"postgres": "postgres_db", "mysql": "mysql_db"}


@pytest.fixture(params=["sqlite", *SERVER_DBS])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "events.db")
    return str(request.getfixturevalue(SERVER_DBS[request.param]))


async def ids(c: Client, session: str = "s") -> list[str]:
    got = await c.result("eventlog/sessions.get", {"app": "app", "user": "u", "session": session})
    return [e["event"]["id"] for e in got["events"]]


async def read_at_a(c: Client) -> int:
    """The session made, its first event "a" stored: the writer's view."""
    await c.result("eventlog/sessions.create", {"app": "app", "user": "u", "session": "s"})
    return int((await c.result("eventlog/append", {**append("a"), "expected_seq": 0}))["seq"])


@asynccontextmanager
async def writer_at_a(db: str, tmp_path: Path) -> AsyncIterator[tuple[str, Client, int]]:
    """A daemon serving ``db``, a writer connected to it, and the writer's
    view once "a" is stored (:func:`read_at_a`); bounded."""
    with trio.fail_after(60):
        async with in_process(tmp_path, db, synchronous="NORMAL") as path:
            c = await connect(path)
            yield path, c, await read_at_a(c)


def pipelined(view: int, *event_ids: str) -> dict[str, Any]:
    """One session's events as one batch, the first expecting ``view``; an
    event of another session between them, so that the session's seqs are
    not consecutive."""
    first, *rest = event_ids
    return {"appends": [{**append(first), "expected_seq": view}, append("o", session="other"),
                        *(append(i) for i in rest)]}


def seqs(results: list[dict[str, Any]]) -> list[tuple[int, bool]]:
    return [(r["seq"], r["duplicate"]) for r in results]


async def test_a_batch_whose_answer_was_lost_is_answered_as_stored_on_a_new_connection(
    db: str, tmp_path: Path,
) -> None:
    async with writer_at_a(db, tmp_path) as (path, c, view):
        batch = pipelined(view, "b", "c", "d")
        lost = await connect(path)
        stored = (await lost.result("eventlog/append_batch", batch))["results"]
        await lost.stream.aclose()  # the writer never read that answer
        again = (await c.result("eventlog/append_batch", batch))["results"]
        assert seqs(again) == [(seq, True) for seq, _ in seqs(stored)]
        # The writer goes on from the batch's last seq.
        nxt = await c.result(
            "eventlog/append", {**append("e"), "expected_seq": again[-1]["seq"]})
        assert not nxt["duplicate"]
        assert await ids(c) == ["a", "b", "c", "d", "e"]
        assert await ids(c, "other") == ["o"]


async def test_a_batch_cut_off_in_flight_and_sent_again_with_more_is_stored_once_in_order(
    db: str, tmp_path: Path,
) -> None:
    async with writer_at_a(db, tmp_path) as (path, c, view):
        lost = await connect(path)
        # Stored or not, as the connection's end finds it: either way the
        # batch sent again (with what the writer queued since) is stored once.
        await lost.start("eventlog/append_batch", pipelined(view, "b", "c"))
        await lost.stream.aclose()
        again = (await c.result("eventlog/append_batch", pipelined(view, "b", "c", "d")))
        assert len(again["results"]) == 4
        assert await ids(c) == ["a", "b", "c", "d"]
        assert await ids(c, "other") == ["o"]


async def test_a_stale_copy_of_a_batch_is_refused_and_nothing_of_it_is_stored(
    db: str, tmp_path: Path,
) -> None:
    async with writer_at_a(db, tmp_path) as (path, c, view):
        # Another writer stores "x", then the copy's next event "e" goes in
        # behind it (a lone append, as a copy that lost its answer retries).
        other = await connect(path)
        await other.result("eventlog/append", append("x"))
        await other.result("eventlog/append", append("e"))
        err = await c.error("eventlog/append_batch", pipelined(view, "e", "y"))
        assert err["code"] == STALE_SESSION
        assert err["data"]["index"] == 2 and err["data"]["expected_seq"] == view
        assert await ids(c) == ["a", "x", "e"]
        gone = await c.error("eventlog/sessions.get",
                             {"app": "app", "user": "u", "session": "other"})
        assert gone["code"] == SESSION_NOT_FOUND  # not made by the refused batch


async def test_a_batch_and_its_copy_sent_at_once_are_stored_once_and_answered_alike(
    db: str, tmp_path: Path,
) -> None:
    # Both frames are read before either commits: the writer takes them into
    # one transaction as often as not, the copy judged on the batch's own
    # planned (or written) events; in two, on the stored ones.
    async with writer_at_a(db, tmp_path) as (_, c, view):
        batch = pipelined(view, "b", "c", "d")
        first = await c.start("eventlog/append_batch", batch)
        copy = await c.start("eventlog/append_batch", batch)
        answers = [(await c.response(i))["result"]["results"] for i in (first, copy)]
        new, again = sorted(answers, key=lambda r: r[0]["duplicate"])
        assert [s for s, _ in seqs(new)] == [s for s, _ in seqs(again)]
        assert [d for _, d in seqs(new)] == [False] * 4
        assert [d for _, d in seqs(again)] == [True] * 4
        assert await ids(c) == ["a", "b", "c", "d"]
