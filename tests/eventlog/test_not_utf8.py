"""Text that is not UTF-8 in a SQLite log, as another program or a damaged disk leaves it.

streamd refuses such text at append, and SQLite's JSON check lets it through.
Reading the row through APSW raised ``UnicodeDecodeError`` out of the store:
``streamd log since`` ended in a traceback (exit 1), and every round of an
event-log Recall source failed (tests/recall/eventlog/test_not_utf8.py). Now
the call is read again with U+FFFD for each bad byte (``sqlite.lossy_text``).
"""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import trio

from streamd.eventlog import EventLog
from streamd.eventlog.cli import main
from streamd.eventlog.model import Event, Filter, SessionGetParams, SinceParams
from streamd.eventlog.sqlite.sql import SqliteSql
from streamd.eventlog.store import DECODED, reads

NOT_UTF8 = b'{"text": "caf\xe9 zeta"}'  # Latin-1's é where UTF-8 needs two bytes


async def _three_events(db: Path) -> None:
    async with EventLog(db, synchronous="NORMAL") as log:
        for i in range(3):
            await log.append("app", "u", "s", Event(id=f"e{i}", author="user",
                                                    content={"text": f"zeta {i}"}))
    conn = apsw.Connection(str(db))
    conn.execute("UPDATE events SET content = CAST(? AS TEXT) WHERE event_id = 'e1'",
                 (NOT_UTF8,))
    conn.close()


async def test_reads_give_every_event_with_replacement_characters(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    with trio.fail_after(30):
        await _three_events(db)
        async with EventLog(db, synchronous="NORMAL") as log:
            page = await log.since(0)
            session = await log.requests.get_session(
                SessionGetParams(app="app", user="u", session="s"))
            rows = await log.requests.event_rows_at([1, 2, 3])
    assert [e.event.content for e in page.entries] == [
        {"text": "zeta 0"}, {"text": "caf\ufffd zeta"}, {"text": "zeta 2"}]
    assert [e.event.id for e in session.events] == ["e0", "e1", "e2"]
    assert [r[4] for r in rows] == ["e0", "e1", "e2"]


def test_log_since_prints_every_event_instead_of_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "events.db"
    trio.run(_three_events, db)
    code = main(["--db", str(db), "since", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(out.splitlines()) == 3 and "caf\ufffd zeta" in out


@pytest.mark.parametrize("flt", [None, Filter(app="app"), Filter(author="model"),
                                 Filter(branch_prefixes=["b"])])
async def test_the_lossy_read_keeps_each_reads_order(tmp_path: Path, flt: Filter | None) -> None:
    # The fallback wraps a statement in a CTE; SQLite must keep the order its
    # ORDER BY gives (seqs appended in a shuffled order of sessions and branches).
    db = tmp_path / "events.db"
    async with EventLog(db, synchronous="NORMAL") as log:
        for i in range(60):
            await log.append("app", f"u{i % 7}", f"s{i % 5}", Event(
                id=f"e{i}", author=("user", "model")[i % 2], content={"i": i},
                branch=("", "b", "b.x")[i % 3]))
    sql = SqliteSql(apsw.Connection(str(db)))
    p = SinceParams(from_seq=3, limit=40, filter=flt)
    plain = reads.since(sql, p, DECODED)
    with sql.lossy():
        lossy = reads.since(sql, p, DECODED)
        at = reads.event_rows_at(sql, [50, 7, 20])
        after = reads.event_rows(sql, 10, 5)
    assert [e.seq for e in lossy.entries] == [e.seq for e in plain.entries]
    assert lossy == plain
    assert [r[0] for r in at] == [7, 20, 50] and [r[0] for r in after] == [11, 12, 13, 14, 15]


def test_log_verify_names_text_that_is_not_utf8_as_a_problem_instead_of_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "events.db"
    trio.run(_three_events, db)
    conn = apsw.Connection(str(db))
    conn.execute("UPDATE sessions SET state = CAST(? AS TEXT)", (b'{"k": "caf\xe9"}',))
    conn.close()
    code = main(["--db", str(db), "verify"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "state: could not be checked: 'utf-8' codec can't decode" in out
