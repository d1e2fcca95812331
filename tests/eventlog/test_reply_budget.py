"""Answers that carry whole states or lists stop before the reply budget.

A frame is at most 8 MiB; an answer longer than that is refused -32603 by its
id, the same for every retry, so a read whose answer can grow with what the
log holds must be cut into pages a client can read (REPLY_BUDGET_BYTES, half
the frame), each saying where the next starts, and always carrying at least
one item so that a reader gets past any item.
"""

from __future__ import annotations

from typing import Any

import trio
from support.service import Daemonish

# 0.9 MB of state (a scope may hold 1 MiB): four fit the 4 MiB budget, five
# do not, and ten are past the 8 MiB frame.
BIG = "x" * 900_000


async def test_a_sessions_list_page_stops_before_4_mib_and_continues_from_next(
    daemon: Daemonish,
) -> None:
    # Ten sessions holding 0.9 MB of state each: every sessions.list of the
    # app answered -32603 (a 9 MB answer), and so did the ADK service's
    # list_sessions, which reads them page by page, for good.
    with trio.fail_after(60):
        c = await daemon.connect()
        for i in range(10):
            await c.result(
                "eventlog/sessions.create",
                {"app": "app", "user": "u", "session": f"s{i}", "state": {"k": BIG}},
            )
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

