"""An event whose stored text is not UTF-8, under an event-log Recall source.

streamd never writes such text (it refuses it at append), but a SQLite file
can hold it: written by another program, or damaged on disk. SQLite's JSON
check lets it through (it does not validate UTF-8), and reading the row
through APSW raised ``UnicodeDecodeError``: every round of the source failed,
so every search, expand and refresh answered -32603 ``index round failed``,
and health said ``unavailable``, for as long as the row was there.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import trio
from support.recall import FAR, req

from .conftest import expand, ids, init, result, say, search, served

# The JSON string "caf\xe9 zeta": Latin-1's é, a byte no UTF-8 text holds there.
NOT_UTF8 = b'"caf\xe9 zeta"'


def _damage(db: Path, event_id: str) -> None:
    """Store ``NOT_UTF8`` as the event's content, as another program could."""
    conn = apsw.Connection(str(db))
    try:
        conn.execute("UPDATE events SET content = CAST(? AS TEXT) WHERE event_id = ?",
                     (NOT_UTF8, event_id))
        assert conn.changes() == 1
    finally:
        conn.close()


async def test_text_that_is_not_utf8_is_read_with_replacement_characters_not_a_failed_round(
        tmp_path: Path) -> None:
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(30):
        async with served(db) as (peer, log):
            await say(log, "e1", "zeta one")
            await say(log, "e2", "zeta two")
            await say(log, "e3", "zeta three")
            _damage(db, "e2")
            await result(peer, init(db, work))
            found = await result(peer, search(2, "zeta"))
            shown = await result(peer, expand(3, "log:v2/e2"))
            health = await result(peer, req(4, "recall/health", deadline=FAR))
    assert sorted(ids(found)) == ["e1", "e2", "e3"]
    # Each byte that is not UTF-8 reads as U+FFFD, as a stream's records do.
    assert "caf\ufffd zeta" in shown["content"]
    assert health["status"] == "healthy" and health["indexed_count"] == 3


async def test_a_round_after_the_damage_finds_what_was_appended_after_it(
        tmp_path: Path) -> None:
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(30):
        async with served(db) as (peer, log):
            await say(log, "e1", "zeta one")
            await result(peer, init(db, work))
            assert ids(await result(peer, search(2, "zeta"))) == ["e1"]
            await say(log, "e2", "zeta two")
            _damage(db, "e2")
            await say(log, "e3", "zeta three")
            found = await result(peer, search(3, "zeta"))
    assert sorted(ids(found)) == ["e1", "e2", "e3"]
