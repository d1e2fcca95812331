"""A process that ends with write-behind events queued and never flushed (a
script whose ``asyncio.run(main())`` returns without ``runner.close()`` or
``service.close()``) says so at its exit: the count of events not known to
be stored, on stderr (logger ``streamd.adk``, error level). A service that
was flushed or closed says nothing.

Before, nothing was said: of 1,200 events ``append_event`` had returned for,
500 were stored (the loop's end cut the send short after the first batch),
and in a run of five 800 KB events through the daemon, none."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

pytest.importorskip("google.adk")

SCRIPT = r"""
import asyncio, sys
from google.adk.events.event import Event
from google.genai import types
from streamd.adk import StreamdSessionService

service = StreamdSessionService(database=sys.argv[1], synchronous="NORMAL", write_behind=True)

async def main() -> None:
    s = await service.create_session(app_name="a", user_id="u", session_id="s")
    for i in range(1200):
        await service.append_event(s, Event(author="user", invocation_id="i",
            content=types.Content(role="user", parts=[types.Part(text=f"m{i}")])))
    if sys.argv[2] == "flush":
        await service.flush()
    elif sys.argv[2] == "close":
        await service.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("ending", ["nothing", "flush", "close"])
def test_an_exit_with_write_behind_events_never_flushed_says_how_many(
    tmp_path: Path, ending: str
) -> None:
    db = tmp_path / "events.db"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(db), ending],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    said = re.findall(r"exits with (\d+) queued events not known to be stored", done.stderr)
    if ending == "nothing":
        assert len(said) == 1, done.stderr
        assert stored + int(said[0]) >= 1200  # nothing lost without a word
        assert "close()" in done.stderr
    else:
        assert stored == 1200
        assert done.stderr == ""
