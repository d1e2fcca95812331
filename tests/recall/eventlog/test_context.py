"""A context expand shows the event's own session's turns, however many other
sessions share its name (another user's ``default``) or its name is also a
user's, an app's, a branch's."""

from __future__ import annotations

import trio

from .conftest import call, expand, init, say, served


async def test_context_shows_the_sessions_turns_past_other_users_sessions_of_its_name(tmp_path):
    db = tmp_path / "events.db"
    (tmp_path / "work").mkdir()
    with trio.fail_after(60):
        async with served(db) as (peer, log):
            for turn in range(3):
                await say(log, f"ann-{turn}", f"ann asks {turn}", user="ann", session="default")
                # Eight other users' sessions named "default" speak in between.
                for other in range(8):
                    await say(log, f"u{other}-{turn}", f"other {turn}", user=f"u{other}",
                              session="default")
            await say(log, "ann-x", "a session named as a user", user="ann", session="u1")
            await result_of_init(peer, db, tmp_path / "work")
            answer = await call(peer, expand(2, "log:v2/ann-1", detail="context"))
    content = answer["result"]["content"]
    turns = content[content.index("\n\nSession default:\n") + len("\n\nSession default:\n"):]
    lines = [line.split(" ")[:2] for line in turns.splitlines()]
    assert lines == [["-", "v2/ann-0"], [">", "this"], ["-", "v2/ann-2"]]


async def result_of_init(peer, db, workdir) -> None:
    answer = await call(peer, init(db, workdir))
    assert "result" in answer, answer
