"""Stored text printed for people cannot drive their terminal: an event's
author or content, a session name, a record's title hold what models, tools
and other people wrote, and an escape sequence in them used to reach the
terminal as it was (setting its title, clearing it). ``--json`` output is
JSON's own escaping; ``expand`` writes the record as it is to a pipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamd.cli import main
from streamd.cli.terminal import printable

HOSTILE = "x\x1b]0;pwn\x07\x1b[2J\r\x9b31m\u202eok"


def test_printable_escapes_what_drives_a_terminal_and_keeps_the_rest() -> None:
    assert printable(HOSTILE) == "x\\x1b]0;pwn\\x07\\x1b[2J\\x0d\\x9b31m\\u202eok"
    assert printable("plain é ✓ 日本\ttab\nline") == "plain é ✓ 日本\\x09tab\\x0aline"
    assert printable("a\tb\nc\x1b", lines=True) == "a\tb\nc\\x1b"


def test_log_lines_for_people_carry_no_control_character(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "ev.db")
    assert main(["log", "--db", db, "append", "--app", "a", "--user", "u", "--session",
                 f"s{HOSTILE}", "--author", HOSTILE, "--text", HOSTILE]) == 0
    capsys.readouterr()
    for command in (["since"], ["sessions", "list", "--app", "a"]):
        assert main(["log", "--db", db, *command]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, out
        assert "\\x1b]0;pwn\\x07" in out
    # Machines get the value itself, in JSON's escaping.
    assert main(["log", "--db", db, "--json", "since"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["event"]["author"] == HOSTILE


def test_search_hits_carry_no_control_character(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = tmp_path / "a.jsonl"
    stream.write_text(json.dumps({"schema": 2, "id": "r1", "event_time": "2026-05-02T10:00:00Z",
                                  "title": f"alpha {HOSTILE}", "text": "alpha"}) + "\n")
    assert main(["search", "alpha", str(stream)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]0;pwn\\x07" in out, out
