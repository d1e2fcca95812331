"""``streamd log``: readable lines, ``--json`` for programs, tail that follows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from streamd.eventlog.cli import main
from streamd.eventlog.model import AppendParams, Event, LeaseAcquireParams
from streamd.eventlog.sqlite import SqliteStore

pytestmark = pytest.mark.subprocess


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.db"
    monkeypatch.setenv("STREAMD_DB", str(path))
    return path


def at(app: str, user: str, session: str) -> list[str]:
    """A session's address, the one shape every log command takes."""
    return ["--app", app, "--user", user, "--session", session]


AT = at("app", "u", "s")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_append_prints_the_seq_then_flags_a_duplicate_and_rejects_a_conflict(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "append", *AT, "--author", "me", "--id", "e1", "--text", "hi") == (
        0,
        ["seq 1"],
        "",
    )
    code, out, _ = run(capsys, "append", *AT, "--author", "me", "--id", "e1", "--text", "hi")
    assert code == 0 and out == ["seq 1 (duplicate: already appended)"]
    code, out, err = run(capsys, "append", *AT, "--author", "x", "--id", "e1", "--text", "hi")
    assert code == 2 and out == []
    assert err == "streamd: event 'e1' was already appended with different content (seq 1)\n"


def test_since_prints_one_readable_line_per_entry(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "append",
            *AT,
            "--author",
            "me",
            "--text",
            "hello\nworld",
            "--meta",
            "caller=al",
        ]
    )
    main(
        [
            "append",
            *at("app", "u", "t"),
            "--author",
            "bot",
            "--content",
            '{"k": [1]}',
            "--branch",
            "bg.x",
        ]
    )
    capsys.readouterr()
    code, out, _ = run(capsys, "since")
    assert code == 0 and len(out) == 2
    first, second = out
    assert first.split()[0] == "1" and "app/u/s" in first and "me: hello\\nworld" in first
    assert "{caller=al}" in first
    assert second.split()[0] == "2" and "app/u/t [bg.x]" in second and 'bot: {"k":[1]}' in second


def test_since_json_prints_entry_objects_with_every_key(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        main(["append", *AT, "--author", "me", "--id", f"e{i}", "--content", str(i)])
    capsys.readouterr()
    code, out, _ = run(capsys, "since", "--json", "--from", "1")
    entries = [json.loads(line) for line in out]
    assert code == 0 and [e["seq"] for e in entries] == [2, 3]
    assert set(entries[0]) == {"seq", "app", "user", "session", "event", "metadata"}
    assert entries[0]["event"]["content"] == 1
    code, out, _ = run(capsys, "since", "--json", "--limit", "1")
    assert [json.loads(line)["seq"] for line in out] == [1]


def test_filters_map_to_the_log_filter(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for session, branch, author in [
        ("p", "", "user"),
        ("p:sub:x", "sub.x", "a/autonomous"),
        ("q", "bg.a", "model"),
        ("p", "bg", "model"),
    ]:
        main(
            [
                "append",
                *at("app", "u", session),
                "--author",
                author,
                "--branch",
                branch,
                "--text",
                "hi",
            ]
        )
    capsys.readouterr()

    def seqs(*flags: str) -> list[int]:
        code, out, _ = run(capsys, "since", "--json", *flags)
        assert code == 0
        return [json.loads(line)["seq"] for line in out]

    assert seqs("--tree", "p", "--app", "app", "--user", "u") == [1, 2, 4]
    assert seqs("--branch", "bg") == [3, 4]
    assert seqs("--branch", "bg", "--branch", "sub") == [2, 3, 4]
    assert seqs("--author", "model", "--session", "p") == [4]
    assert seqs("--author-suffix", "/autonomous") == [2]
    code, _, err = run(capsys, "since", "--tree", "p")
    assert code == 2 and err == "streamd: --tree needs --app and --user\n"
    code, out, _ = run(capsys, "branches")
    assert out == ["bg", "bg.a", "sub.x"]


def test_reading_commands_never_create_a_missing_log(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["since"], ["tail"], ["branches"], ["ping"], ["sessions", "list", "--app", "app"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == [] and f"no event log at {db}" in err
    assert not db.exists()


def test_reading_commands_take_an_empty_file_for_no_log_and_leave_it_empty(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SQLite takes an empty file for a new database: a read wrote the schema
    # into it and answered as from an empty log, so a copy cut to 0 bytes (a
    # full disk) passed `ping`, and `verify` after it. `verify` alone wrote
    # 4 KiB into it.
    db.touch()
    for argv in (["since"], ["tail"], ["branches"], ["ping"], ["sessions", "list", "--app", "app"],
                 ["verify"], ["backup", str(db.with_name("copy.db"))]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, []), argv
        assert err == f"streamd: no event log at {db}: the file is empty (use --db PATH or set" \
            " STREAMD_DB)\n", argv
        assert db.stat().st_size == 0, argv
    assert sorted(p.name for p in db.parent.iterdir()) == [db.name]
    # A command that writes makes its log there, as in a new file.
    assert run(capsys, "append", *AT, "--author", "x", "--text", "hi")[0] == 0
    assert run(capsys, "ping")[1] == [f"ok: {db} (latest seq 1)"]


def test_db_option_before_or_after_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    main(["--db", a, "append", *AT, "--author", "x", "--text", "hi"])
    main(["append", "--db", b, *AT, "--author", "y", "--id", "only-in-b", "--text", "hi"])
    capsys.readouterr()
    assert run(capsys, "--db", b, "since", "--json")[1][0].count("only-in-b") == 1
    assert "only-in-b" not in "".join(run(capsys, "since", "--db", a, "--json")[1])


def test_sessions_locks_boots_and_ping(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "sessions", "create", *at("app", "u", "s1"), "--json")
    assert code == 0 and json.loads(out[0])["session"] == "s1"
    main(["append", *at("app", "u", "s1"), "--author", "me", "--id", "e1", "--text", "hi"])
    capsys.readouterr()
    code, out, _ = run(capsys, "sessions", "get", *at("app", "u", "s1"))
    assert out[0].startswith("app/u/s1  created") and out[1].split()[0] == "1"
    assert run(capsys, "sessions", "list", "--app", "app")[1][0].startswith("app/u/s1")
    code, _, err = run(capsys, "sessions", "get", *at("app", "u", "nope"))
    assert code == 1 and err == "streamd: session app/u/nope not found\n"
    assert run(capsys, "sessions", "delete", *at("app", "u", "s1"))[1] == ["deleted app/u/s1"]

    store = SqliteStore.open(str(db))
    store.acquire_lease(
        LeaseAcquireParams(app="app", user="u", session="s2", stale_after_ms=30_000),
        "host/1/abcdef01",
        0,
    )
    store.record_boot(4_102_444_800_000_000, ["s1", "s2"])  # 2100-01-01
    store.close()
    code, out, _ = run(capsys, "locks")
    assert len(out) == 1 and "app/u/s2  held by host/1/abcdef01" in out[0]
    code, out, _ = run(capsys, "boots")
    assert len(out) == 1 and out[0].endswith("attempted: s1, s2")
    code, out, _ = run(capsys, "boots", "--since", "2200-01-01T00:00:00Z", "--json")
    assert json.loads(out[0]) == {"boots": []}
    code, out, _ = run(capsys, "ping")
    assert code == 0 and out[0].startswith(f"ok: {db}")


def test_bad_json_or_time_arguments_are_usage_errors(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "append", *AT, "--author", "x", "--content", "{nope")
    assert code == 2 and err.startswith("streamd: --content is not JSON")
    code, _, err = run(capsys, "append", *AT, "--author", "x", "--timestamp", "2025-13-01")
    assert code == 2 and err.startswith("streamd: --timestamp '2025-13-01' is not a time")
    assert not db.exists()


async def test_tail_shows_the_last_lines_follows_new_appends_and_exits_130_on_ctrl_c(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    store = SqliteStore.open(str(path))

    def append(event_id: str, session: str = "s") -> None:
        store.append(
            AppendParams(
                app="app",
                user="u",
                session=session,
                event=Event(id=event_id, author="me", content=event_id),
            ),
            0,
        )

    for i in range(5):
        append(f"old{i}")
    append("elsewhere", session="other")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "streamd",
            "log",
            "tail",
            "--db",
            str(path),
            "-n",
            "2",
            "--session",
            "s",
            "--watch-interval-ms",
            "50",
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    buffer = b""

    async def line() -> str:
        nonlocal buffer
        while b"\n" not in buffer:
            chunk = await proc.stdout.receive_some(4096)
            assert chunk, "tail exited early"
            buffer += chunk
        text, buffer = buffer.split(b"\n", 1)
        return text.decode()

    with trio.fail_after(20):
        assert "me: old3" in await line()
        assert "me: old4" in await line()
        append("live", session="other")  # filtered out
        append("new")  # another process's commit: seen by polling
        assert "me: new" in await line()
        proc.send_signal(signal.SIGINT)
        assert await proc.wait() == 130
    store.close()
