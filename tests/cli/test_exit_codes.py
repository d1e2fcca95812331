"""Exit statuses as grep and rg have them: 0 a match, 1 nothing found, 2 an
error; a path given on the command line that is missing, unreadable or a
directory is an error named as the user typed it, and nothing is searched;
docs/cli.md has a row for every command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamd.cli import commands as cli
from streamd.cli import main
from streamd.eventlog import cli as log_cli

REPO = Path(__file__).resolve().parents[2]
RECORD = ('{"schema": 2, "id": "r1", "event_time": "2026-05-02T10:00:00Z", '
          '"title": "Deploy alpha"}\n')


def run(capsys, *argv) -> tuple[int, list[str], list[str]]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), [ln for ln in err.splitlines()
                                    if not ln.startswith("streamd 2")]


@pytest.fixture
def here(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.jsonl").write_text(RECORD)
    return tmp_path


def test_a_directory_given_as_a_path_is_an_error_saying_so(here: Path, capsys):
    (here / "logs").mkdir()
    assert run(capsys, "search", "td", "logs") == (2, [], ["streamd: logs: is a directory"])
    assert run(capsys, "search", "td", str(here)) == (2, [], [f"streamd: {here}: is a directory"])


def test_an_unquoted_second_query_word_is_an_error_with_the_quoted_query(here: Path, capsys):
    assert run(capsys, "search", "deploy", "alpha", "s.jsonl") == (2, [], [
        "streamd: alpha: no such file (a query of several words goes in quotes: "
        "'deploy alpha')"])
    # A lone missing path is a path: quoting it into the query would leave none.
    assert run(capsys, "search", "deploy", "alpha") == (2, [], ["streamd: alpha: no such file"])


def test_every_bad_path_is_named_and_nothing_is_searched(here: Path, capsys):
    (here / "d").mkdir()
    code, out, err = run(capsys, "search", "-e", "deploy", "s.jsonl", "gone.jsonl", "d")
    assert (code, out) == (2, [])
    assert err == ["streamd: gone.jsonl: no such file", "streamd: d: is a directory"]
    for command in (["expand", "v2/r1"], ["index", "--workdir", "wd"], ["check"]):
        assert run(capsys, *command, "gone.jsonl") == (2, [], ["streamd: gone.jsonl: no such file"])
    assert not (here / "wd").exists()


def test_search_exits_0_with_a_hit_and_1_without(here: Path, capsys):
    assert run(capsys, "search", "deploy", "s.jsonl")[0] == 0
    code, out, err = run(capsys, "search", "nothing", "s.jsonl")
    assert (code, out) == (1, []) and err[0].startswith("0 matched of 1 records")


def test_expand_exits_1_for_a_record_the_files_lack_and_2_for_no_locator(here: Path, capsys):
    assert run(capsys, "expand", "v2/r1", "s.jsonl")[0] == 0
    assert run(capsys, "expand", "v2/nope", "s.jsonl") == (
        1, [], ["streamd: gen-1 holds no record nope"])
    assert run(capsys, "expand", "nope", "s.jsonl") == (
        2, [], ["streamd: 'nope' is not a locator (like stream:v2/r1, as search prints them)"])


def test_a_workdir_error_is_2(here: Path, capsys):
    (here / "wd").write_text("")
    assert run(capsys, "index", "s.jsonl", "--workdir", "wd") == (
        2, [], ["streamd: --workdir wd: exists and is not a directory"])


def test_the_log_exits_1_for_a_missing_session_and_2_for_an_error(here: Path, capsys):
    at = ["--app", "a", "--user", "u", "--session", "s"]
    assert run(capsys, "log", "--db", "ev.db", "sessions", "get", *at) == (
        2, [], ["streamd: no event log at ev.db (use --db PATH or set STREAMD_DB)"])
    assert run(capsys, "log", "--db", "ev.db", "append", *at, "--author", "me", "--id", "e1",
               "--text", "hi") == (0, ["seq 1"], [])
    assert run(capsys, "log", "--db", "ev.db", "sessions", "get", "--app", "a", "--user", "u",
               "--session", "nope") == (1, [], ["streamd: session a/u/nope not found"])
    assert run(capsys, "log", "--db", "ev.db", "append", *at, "--author", "me", "--id", "e1",
               "--text", "other") == (2, [], [
                   "streamd: event 'e1' was already appended with different content (seq 1)"])


def _documented() -> tuple[str, set[str]]:
    """The exit-code table of docs/cli.md, and the commands its first column names."""
    text = (REPO / "docs" / "cli.md").read_text()
    table = text.split("## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first = line.strip("|").split("|")[0]
            named |= set(re.findall(r"`streamd(?: ([a-z ]+))?`", first))
    return table, named


def test_docs_have_an_exit_code_row_for_every_command():
    table, named = _documented()
    commands = [name for name in cli.subcommands(cli.build_parser())
                if name not in ("log", "conformance")]
    commands += [f"log {name}" for name in cli.subcommands(log_cli.build_parser())]
    commands += ["conformance verify", "conformance record", ""]  # "": plain streamd
    assert sorted(set(commands) - named) == []
    assert "130" in table


@pytest.mark.parametrize("command", [["since"], ["ping"], ["verify"], ["backup", "copy.db"]])
def test_a_database_that_is_not_one_is_an_error_naming_it(here: Path, capsys, command):
    (here / "notes.db").write_text("these are my notes, not a database\n")
    assert run(capsys, "log", "--db", "notes.db", *command) == (
        2, [], ["streamd: event log database notes.db: file is not a database"])
    assert (here / "notes.db").read_text() == "these are my notes, not a database\n"
