"""Generation names across restarts: a name never names two builds of one workdir.

A saved index that a restart does not adopt (the log restored from a backup
while no process ran, other settings, a damaged segment) is indexed anew, as
a replaced log is within one process; and as there, its names continue from
the last one saved, as the stream adapter's continue from its checkpoint.
Before, each of these started again at gen-1: an answer from the new build
and one from the old could both say gen-1, or gen-2, about other events.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio
from support.recall import FAR, req
from support.segments import flip_posting

from .conftest import ids, init, result, say, search, served


async def _two_generations(db: Path, work: Path, **settings: object) -> None:
    """e1 and e2 indexed in gen-1 and gen-2 and saved (the source closes)."""
    async with served(db) as (peer, log):
        await say(log, "e1", "zebra crossing")
        await result(peer, init(db, work, **settings))
        await result(peer, search(2, "zebra"))
        await say(log, "e2", "zebra again")
        h = await result(peer, req(3, "recall/refresh", deadline=FAR))
        assert h["index_generation"] == "gen-2"


async def test_a_log_restored_while_no_process_ran_continues_the_generation_names(
        tmp_path: Path) -> None:
    db, work, backup = tmp_path / "events.db", tmp_path / "work", tmp_path / "backup.db"
    work.mkdir()
    with trio.fail_after(30):
        async with served(backup) as (_, log):
            await say(log, "e1", "zebra crossing")
        await _two_generations(db, work)
        for side in ("-wal", "-shm"):
            Path(f"{db}{side}").unlink(missing_ok=True)
        os.replace(backup, db)  # the restore: seq 2 is gone, and comes back as another event
        async with served(db) as (peer, log):
            await say(log, "other", "zebra elsewhere")
            await result(peer, init(db, work))
            found = await result(peer, search(2, "zebra"))
    assert sorted(ids(found)) == ["e1", "other"]
    assert found["diagnostics"]["generation"] == "gen-3"


async def test_other_settings_continue_the_generation_names(tmp_path: Path) -> None:
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(30):
        await _two_generations(db, work, apps=["chat"])
        async with served(db) as (peer, _):
            await result(peer, init(db, work))  # every app: the index is built anew
            found = await result(peer, search(2, "zebra"))
    assert sorted(ids(found)) == ["e1", "e2"]
    assert found["diagnostics"]["generation"] == "gen-3"


async def test_a_damaged_saved_index_continues_the_generation_names(tmp_path: Path) -> None:
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(30):
        await _two_generations(db, work)
        flip_posting(sorted((work / "index").glob("seg-*"))[0], "zebra")
        async with served(db) as (peer, _):
            await result(peer, init(db, work))
            found = await result(peer, search(2, "zebra"))
    assert sorted(ids(found)) == ["e1", "e2"]
    assert found["diagnostics"]["generation"] == "gen-3"
