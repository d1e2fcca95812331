"""One JSON convention: every ``--json`` prints JSON Lines, one compact object a
line (search a line per hit and a closing summary, each with a ``type``;
expand one line; status and log ping one line with the facts their plain
output shows); ``--json`` and ``--db`` go before or after the command; the
three meanings of ``--full`` each have a name of their own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamd.cli import main

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
AT = ["--app", "a", "--user", "u", "--session", "s"]


def compact(line: str) -> dict:
    """``line`` parsed, after checking it is one compact JSON object."""
    value = json.loads(line)
    assert isinstance(value, dict)
    assert line == json.dumps(value, ensure_ascii=False, separators=(",", ":")), line
    return value


def run(capsys, *argv) -> tuple[int, list[str], str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.fixture
def stream(recall_world) -> Path:
    w = recall_world
    return w.write("a.jsonl",
                   w.rec("r1", "2026-05-02T10:00:00Z", title="Deploy alpha", text="alpha out"),
                   w.rec("r2", "2026-05-02T10:05:00Z", title="Rollback", text="alpha back"))


def test_search_json_is_a_line_per_hit_then_a_summary(stream: Path, capsys):
    code, out, _ = run(capsys, "search", "alpha", stream, "--json")
    rows = [compact(line) for line in out]
    assert code == 0 and [row["type"] for row in rows] == ["hit", "hit", "summary"]
    assert [row["locator"] for row in rows[:2]] == ["stream:v2/r1", "stream:v2/r2"]
    summary = rows[-1]
    assert summary["hits"] == 2 and summary["outcome"] == "success"
    assert summary["diagnostics"]["matched"] == 2 and "candidates" not in summary


def test_json_before_the_command_is_the_same_as_after_it(stream: Path, capsys):
    def shape(out: list[str]) -> list[tuple]:
        return [(row["type"], row.get("locator"), row.get("hits"))
                for row in map(compact, out)]

    after = run(capsys, "search", "alpha", stream, "--json")
    before = run(capsys, "--json", "search", "alpha", stream)
    assert before[0] == after[0] == 0
    assert shape(before[1]) == shape(after[1]) == [
        ("hit", "stream:v2/r1", None), ("hit", "stream:v2/r2", None), ("summary", None, 2)]


def test_expand_json_is_one_line(stream: Path, capsys):
    code, out, _ = run(capsys, "--json", "expand", "v2/r1", stream)
    (line,) = out
    assert code == 0 and compact(line)["content"].startswith("Deploy alpha\n")


def test_log_ping_json_says_what_its_line_says(tmp_path: Path, capsys):
    db = tmp_path / "ev.db"
    assert run(capsys, "log", "--db", db, "append", *AT, "--author", "me", "--text", "hi")[0] == 0
    assert run(capsys, "log", "--db", db, "ping")[1] == [f"ok: {db} (latest seq 1)"]
    code, out, _ = run(capsys, "--json", "log", "--db", db, "ping")
    assert code == 0 and [compact(line) for line in out] == [
        {"ok": True, "db": str(db), "latest_seq": 1}]


def test_log_since_json_before_the_command_is_a_line_per_entry(tmp_path: Path, capsys):
    db = tmp_path / "ev.db"
    for text in ("one", "two"):
        run(capsys, "--db", db, "log", "append", *AT, "--author", "me", "--text", text)
    code, out, _ = run(capsys, "--json", "--db", db, "log", "since")
    assert code == 0
    assert [compact(line)["event"]["content"] for line in out] == ["one", "two"]


def test_log_sessions_delete_json_names_what_it_deleted(tmp_path: Path, capsys):
    db = tmp_path / "ev.db"
    run(capsys, "log", "--db", db, "sessions", "create", *AT)
    code, out, _ = run(capsys, "log", "--db", db, "sessions", "delete", *AT, "--json")
    assert code == 0 and [compact(line) for line in out] == [
        {"deleted": True, "app": "a", "user": "u", "session": "s"}]


def test_status_json_is_one_compact_line_before_or_after(tmp_path: Path):
    env = {"PYTHONPATH": str(REPO / "src"), "STREAMD_RUNTIME_DIR": str(tmp_path / "run"),
           "PATH": "/usr/bin:/bin"}
    for argv in (["status", "--json"], ["--json", "status"]):
        done = subprocess.run([sys.executable, "-m", "streamd", *argv], capture_output=True,
                              text=True, env=env, timeout=60)
        assert done.returncode == 3, done.stderr
        assert [compact(line) for line in done.stdout.splitlines()] == [
            {"running": False, "socket": str(tmp_path / "run" / "streamd.sock"),
             "lock_holder": None}]


# --- --full, said three ways ----------------------------------------------------------


@pytest.mark.parametrize(("argv", "line"), [
    (["search", "alpha", "{stream}", "--full"],
     "streamd: --full is now --rebuild (see 'streamd search --help')"),
    (["index", "{stream}", "--workdir", "{wd}", "--full"],
     "streamd: --full is now --rebuild (see 'streamd index --help')"),
    (["log", "--db", "{db}", "since", "--full"],
     "streamd: --full is now --no-truncate (see 'streamd log since --help')"),
])
def test_the_old_full_is_refused_naming_its_new_name(argv, line, stream, tmp_path, capsys):
    argv = [a.format(stream=stream, wd=tmp_path / "wd", db=tmp_path / "ev.db") for a in argv]
    assert run(capsys, *argv) == (2, [], line + "\n")


def test_rebuild_and_no_truncate_do_what_full_did(stream: Path, tmp_path: Path, capsys):
    wd = tmp_path / "wd"
    assert run(capsys, "index", stream, "--workdir", wd)[0] == 0
    code, out, _ = run(capsys, "index", stream, "--workdir", wd, "--rebuild")
    assert code == 0 and out[0].startswith("gen-2: 2 records indexed")
    db = tmp_path / "ev.db"
    run(capsys, "log", "--db", db, "append", *AT, "--author", "me", "--text", "x" * 400)
    assert run(capsys, "log", "--db", db, "since")[1][0].endswith("x…")
    assert run(capsys, "log", "--db", db, "since", "--no-truncate")[1][0].endswith("x" * 400)


def _shown(after: str) -> list[str]:
    """The lines of the first code block of docs/cli.md after ``after``."""
    page = (REPO / "docs" / "cli.md").read_text().split(after, 1)[1]
    return page.split("```\n", 2)[1].splitlines()


def _keys(line: str) -> list[str]:
    return re.findall(r'"(\w+)":', line)


@pytest.mark.parametrize(("after", "argv", "stream"), [
    ("`streamd search --json`: ", ["search", "transcripts", "signals.jsonl", "--json"],
     (REPO / "src" / "streamd" / "data" / "sample.jsonl").read_text()),
    ("`streamd check --json`: ", ["check", "mine.jsonl", "--json"],
     '{"schema": 1, "id": "n1", "event_time": "2026-05-02T09:00:00Z"}\nnot JSON\n'),
])  # fmt: skip
def test_the_json_lines_cli_md_shows_are_what_the_command_prints(
        after, argv, stream, tmp_path: Path, monkeypatch, capsys):
    # A shown line may leave keys out ("..."), never show one the command
    # does not print, nor in another order.
    (tmp_path / argv[1 if argv[0] == "check" else 2]).write_text(stream)
    monkeypatch.chdir(tmp_path)
    _, out, _ = run(capsys, *argv)
    printed = {compact(line)["type"]: line for line in out}
    for line in _shown(after):
        got = _keys(printed[json.loads(line.split(",", 1)[0] + "}")["type"]])
        keys = iter(got)
        assert all(key in keys for key in _keys(line)), (line, got)
