"""``streamd log sessions get`` prints a session as it reads it, a page (the
reply budget) at a time: held whole, a session of a million events took
1.67 GB to print. What it prints is the whole session either way."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import pytest

from streamd.eventlog.cli import main

AT = ["--app", "app", "--user", "u", "--session", "s"]
MIB = 1 << 20
EVENTS = 24  # of 1 MiB each: six pages of the 4 MiB reply budget


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.db"
    monkeypatch.setenv("STREAMD_DB", str(path))
    assert main(["sessions", "create", *AT, "--state", '{"k": "v"}']) == 0
    for i in range(EVENTS):
        assert main(["append", *AT, "--author", "me", "--text", f"{i:02d}" + "x" * (MIB - 2)]) == 0
    return path


def printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[str, int]:
    """What ``sessions get`` writes (to a file, so that the output itself is
    not held in memory), and the most memory Python held while it ran."""
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        tracemalloc.start()
        try:
            assert main(["sessions", "get", *AT, *argv]) == 0
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            monkeypatch.undo()
    return out.read_text(), peak


@pytest.mark.parametrize("fmt", ["--json", "--no-truncate"])
def test_a_session_of_many_pages_is_printed_whole_holding_a_few_pages_at_most(
        db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    text, peak = printed(tmp_path, monkeypatch, fmt)
    if fmt == "--json":
        (line,) = text.splitlines()
        got = json.loads(line)
        assert (got["app"], got["user"], got["session"], got["state"]) == ("app", "u", "s",
                                                                        {"k": "v"})
        assert "truncated" not in got and "next_seq" not in got
        events = [(e["seq"], e["event"]["content"]) for e in got["events"]]
    else:
        head, *lines = text.splitlines()
        assert head.startswith("app/u/s  created") and head.endswith('state {"k":"v"}')
        events = [(int(x.split()[0]), x.split("me: ", 1)[1]) for x in lines]
    assert [seq for seq, _ in events] == list(range(1, EVENTS + 1))
    assert all(len(c) == MIB and c.startswith(f"{i:02d}x") for i, (_, c) in enumerate(events))
    # Whole, the session and its printed form were each 24 MiB at once.
    assert peak < 3 * 4 * MIB, peak


def test_the_newest_events_of_many_pages_are_printed_in_order(
        db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text, _ = printed(tmp_path, monkeypatch, "--json", "--recent", "10")
    seqs = [e["seq"] for e in json.loads(text)["events"]]
    assert seqs == list(range(EVENTS - 9, EVENTS + 1))
