"""Answers that carry whole states or lists stop before the reply budget.

A frame is at most 8 MiB; an answer longer than that is refused -32603 by its
id, the same for every retry, so a read whose answer can grow with what the
log holds must be cut into pages a client can read (REPLY_BUDGET_BYTES, half
the frame), each saying where the next starts, and always carrying at least
one item so that a reader gets past any item.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import trio
import trio.testing
from support.service import Daemonish

from streamd.client import TrioClient

# 0.9 MB of state (a scope may hold 1 MiB): four fit the 4 MiB budget, five
# do not, and ten are past the 8 MiB frame.
BIG = "x" * 900_000


async def _ten_big_sessions(c: Any) -> None:
    """Sessions s0..s9 of app/u, each holding :data:`BIG` as its state."""
    for i in range(10):
        await c.result(
            "eventlog/sessions.create",
            {"app": "app", "user": "u", "session": f"s{i}", "state": {"k": BIG}},
        )


async def test_a_sessions_list_page_stops_before_4_mib_and_continues_from_next(
    daemon: Daemonish,
) -> None:
    # Ten sessions holding 0.9 MB of state each: every sessions.list of the
    # app answered -32603 (a 9 MB answer), and so did the ADK service's
    # list_sessions, which reads them page by page, for good.
    with trio.fail_after(60):
        c = await daemon.connect()
        await _ten_big_sessions(c)
        pages: list[list[str]] = []
        params: dict[str, Any] = {"app": "app"}
        while True:
            got = await c.result("eventlog/sessions.list", params)
            pages.append([s["session"] for s in got["sessions"]])
            if got["next"] is None:
                break
            params = {"app": "app", "after": got["next"]}
        assert pages == [[f"s{i}" for i in range(4)], [f"s{i}" for i in range(4, 8)],
                         ["s8", "s9"]]
        # The shared states count too: the app's and the user's take two places.
        await c.result("eventlog/sessions.create", {
            "app": "app", "user": "u", "session": "t", "app_state": {"a": BIG},
            "user_state": {"u": BIG},
        })
        got = await c.result("eventlog/sessions.list", {"app": "app", "scoped_state": True})
        assert [s["session"] for s in got["sessions"]] == ["s0", "s1"]
        assert got["next"] == {"user": "u", "session": "s1"}
        assert got["app_state"] == {"a": BIG} and got["user_states"] == {"u": {"u": BIG}}


def _attempted(boot: int) -> list[str]:
    """0.9 MB of session ids (a daemon resuming 9,000 sessions)."""
    return [f"b{boot}-{i:04}-" + "s" * 90 for i in range(9000)]


async def test_boot_recent_stops_before_4_mib_and_continues_after_the_last_boot(
    daemon: Daemonish,
) -> None:
    # Boots are never removed: a daemon restarted often, each time naming the
    # sessions it resumed, made boot.recent since before them -32603 for
    # good (20,000 boots of ten ids each took it to 9 MB), with no way to ask
    # for less.
    with trio.fail_after(60):
        c = await daemon.connect()
        for i in range(10):
            at = f"2026-01-01T00:00:{i // 2:02}Z"  # two boots at each time
            await c.result("eventlog/boot.record", {"at": at, "attempted": _attempted(i)})
        pages: list[list[int]] = []
        params: dict[str, Any] = {"since": "2025-01-01T00:00:00Z"}
        while True:
            got = await c.result("eventlog/boot.recent", params)
            pages.append([b["id"] for b in got["boots"]])
            assert all(b["attempted"] == _attempted(b["id"] - 1) for b in got["boots"])
            if "next" not in got:
                break
            params = {**params, "after": got["next"]}
        assert pages == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
        # A page that holds them all has the shape it always had.
        assert set(got) == {"boots"}
        late = await c.result("eventlog/boot.recent", {"since": "2026-01-01T00:00:04Z"})
        assert late == {"boots": late["boots"]} and [b["id"] for b in late["boots"]] == [9, 10]
        # The client reads them whole, page after page.
        client_end, server_end = trio.testing.memory_stream_pair()
        daemon.nursery.start_soon(daemon.server.serve, server_end, server_end)
        async with TrioClient.over(client_end) as client:
            whole = await client.recent_boots(dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
        assert [b.id for b in whole.boots] == list(range(1, 11))


async def test_boot_recent_after_a_boot_that_does_not_exist_is_refused(
    daemon: Daemonish,
) -> None:
    with trio.fail_after(10):
        c = await daemon.connect()
        got = await c.response(await c.start(
            "eventlog/boot.recent", {"since": "2025-01-01T00:00:00Z", "after": 7}
        ))
        assert got["error"]["code"] == -32602 and "no boot with id 7" in got["error"]["message"]


async def test_sessions_get_many_leaves_what_does_not_fit_to_be_asked_again(
    daemon: Daemonish,
) -> None:
    # The budget counted events only: ten sessions of 0.9 MB state (or a few
    # with the shared states, which every session of the answer carries)
    # answered -32603 each time, whatever the caller asked again.
    with trio.fail_after(60):
        c = await daemon.connect()
        await _ten_big_sessions(c)
        keys = [{"user": "u", "session": f"s{i}"} for i in range(10)]
        pages: list[list[str]] = []
        while keys:
            got = await c.result("eventlog/sessions.get_many", {"app": "app", "sessions": keys})
            pages.append([s["session"] for s in got["sessions"]])
            assert all(s["state"] == {"k": BIG} for s in got["sessions"])
            assert got["missing"] == []
            keys = got.get("unread", [])
        # Beside the events' 4 MiB, the states have the room of one
        # sessions.get's three (3 MiB): three sessions of 0.9 MB a page.
        assert pages == [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6", "s7", "s8"], ["s9"]]
        # An answer that holds them all has the keys it always had.
        assert set(got) == {"sessions", "missing"}
        await c.result("eventlog/sessions.create", {
            "app": "app", "user": "v", "session": "t", "app_state": {"a": BIG},
        })
        got = await c.result("eventlog/sessions.get_many", {
            "app": "app", "scoped_state": True,
            "sessions": [{"user": "v", "session": "t"}, {"user": "u", "session": "s0"},
                         {"user": "u", "session": "nope"}, {"user": "u", "session": "s1"}],
        })
        assert [s["session"] for s in got["sessions"]] == ["t", "s0"]
        # A key never written costs nothing; from the first session that does
        # not fit on, the keys are left unread, in the order asked.
        assert got["missing"] == [{"user": "u", "session": "nope"}]
        assert got["unread"] == [{"user": "u", "session": "s1"}]
