"""Every mistake a person makes at the command line is one line, ``streamd: ...``,
naming the flag or the path, with exit 2 (an error, as grep and rg have it;
a server that cannot serve exits 1); never a traceback.

These run the real process (``python -m streamd``), as a person would, so an
exception that escaped anywhere, an ExceptionGroup from a nursery included,
shows as the traceback it would print.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]


def streamd(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 60) -> tuple[int, list[str], list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "streamd", *args], cwd=cwd, input=b"", capture_output=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})},
    )
    return (done.returncode, done.stdout.decode().splitlines(),
            done.stderr.decode().splitlines())


def one_line(err: list[str]) -> str:
    """The one line a mistake gets (a warning of the indexing core aside)."""
    lines = [ln for ln in err if "compiled indexing core" not in ln]
    assert len(lines) == 1, err
    assert lines[0].startswith("streamd: "), lines
    return lines[0]


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A regular file: nothing can be created under it, on any machine, by any
    user (root included), unlike a read-only directory or /proc."""
    path = tmp_path / "a-file"
    path.write_text("")
    return path


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text('{"schema": 2, "id": "r1", "event_time": "2026-05-02T10:00:00Z", '
                    '"title": "Deploy alpha", "text": "alpha went out"}\n')
    return path


def test_a_log_file_that_cannot_be_created_names_its_path(tmp_path: Path, blocked: Path):
    # The default location is the one whose directory streamd makes.
    db = blocked / "streamd" / "events.db"
    code, out, err = streamd("log", "append", "--app", "a", "--user", "u",
                             "--session", "s", "--author", "me", "--text", "hi",
                             env={"XDG_STATE_HOME": str(blocked), "STREAMD_DB": ""})
    assert code == 2 and out == []
    line = one_line(err)
    assert line.startswith(f"streamd: cannot create the event log {db}: Not a directory")


def test_a_negative_seq_is_a_usage_error_naming_the_flag(tmp_path: Path):
    code, out, err = streamd("log", "--db", str(tmp_path / "ev.db"), "tail", "--from", "-5")
    assert code == 2 and out == []
    assert one_line(err) == ("streamd: --from must be 0 or more, not '-5' "
                             "(see 'streamd log tail --help')")


def test_a_zero_watch_interval_is_a_usage_error_naming_the_flag(tmp_path: Path):
    code, _, err = streamd("log", "--db", str(tmp_path / "ev.db"), "tail",
                           "--watch-interval-ms", "0")
    assert code == 2
    assert one_line(err) == ("streamd: --watch-interval-ms must be at least 1, not '0' "
                             "(see 'streamd log tail --help')")


def test_a_workdir_that_cannot_be_created_names_the_flag(stream: Path, blocked: Path):
    workdir = blocked / "wd"
    code, out, err = streamd("index", str(stream), "--workdir", str(workdir))
    assert code == 2 and out == []
    assert one_line(err) == f"streamd: --workdir {workdir}: cannot create it: Not a directory"


def test_a_socket_in_a_missing_directory_names_the_flag(tmp_path: Path):
    sock = tmp_path / "nonexistent" / "dir" / "s.sock"
    code, out, err = streamd("serve", "--socket", str(sock))
    assert code == 1 and out == []
    assert one_line(err) == (f"streamd: --socket {sock}: there is no directory "
                             f"{sock.parent}")



def test_a_daemon_log_file_in_a_missing_directory_is_refused_and_no_directory_made(
    tmp_path: Path,
):
    # A mistyped --log-file grew the tree it named (as root, /nonexistent/...)
    # and the daemon served; only the default log's directory is made.
    log = tmp_path / "nonexistent" / "dir" / "d.log"
    code, out, err = streamd("daemon", "--runtime-dir", str(tmp_path / "run"),
                             "--idle-exit", "1", "--log-file", str(log))
    assert code == 1 and out == []
    assert err == [f"streamd daemon: cannot open the log file {log}: there is no directory "
                   f"{log.parent}"]
    assert not (tmp_path / "nonexistent").exists()

def test_a_socket_the_kernel_refuses_is_one_line_too(tmp_path: Path):
    sock = tmp_path / ("s" * 120 + ".sock")  # longer than sun_path holds
    code, _, err = streamd("serve", "--socket", str(sock))
    assert code == 1
    assert one_line(err).startswith(f"streamd: --socket {sock}: cannot listen there: ")


@pytest.mark.parametrize(("args", "line"), [
    (["bogus"], "streamd: unknown command 'bogus' (see 'streamd --help')"),
    (["search", "--limit", "0", "x", "s.jsonl"],
     "streamd: --limit must be at least 1, not '0' (see 'streamd search --help')"),
    (["search", "--limit"], "streamd: --limit needs a value (see 'streamd search --help')"),
    (["expand", "--detail", "most", "v2/r1", "s.jsonl"],
     "streamd: --detail: invalid choice: 'most' (choose from 'summary', 'excerpt', 'full', "
     "'context') (see 'streamd expand --help')"),
    (["daemon", "--idle-exit", "soon"],
     "streamd: --idle-exit must be a number of seconds, not 'soon' "
     "(see 'streamd daemon --help')"),
    (["index", "s.jsonl"], "streamd: index needs --workdir DIR: the workdir the adapter will "
     "be initialized with"),
    (["status", "--bogus"], "streamd: unrecognized argument '--bogus' "
     "(see 'streamd status --help')"),
    (["search", "q", "s.jsonl", "--bogus"], "streamd: unrecognized arguments: --bogus "
     "(see 'streamd search --help')"),
    (["stop", "--runtime-dir"], "streamd: --runtime-dir needs a value "
     "(see 'streamd stop --help')"),
    (["attach", "--start-timeout", "x"], "streamd: --start-timeout must be a number of "
     "seconds, not 'x' (see 'streamd attach --help')"),
    (["log", "frob"], "streamd: unknown command 'frob' (choose from 'append', 'since', "
     "'tail', 'branches', 'sessions', 'locks', 'boots', 'ping', 'backup', 'verify') "
         "(see 'streamd log --help')"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, stream: Path, args, line):
    code, out, err = streamd(*args, cwd=stream.parent,
                             env={"STREAMD_RUNTIME_DIR": str(tmp_path / "run")})
    assert code == 2 and out == []
    assert one_line(err) == line


def test_a_stream_that_cannot_be_read_is_an_error_naming_it_as_given(tmp_path: Path):
    gone = tmp_path / "gone.jsonl"
    code, out, err = streamd("search", "alpha", str(gone))
    assert code == 2 and out == []
    assert one_line(err) == f"streamd: {gone}: no such file"


@pytest.mark.parametrize(("flag", "value"), [
    ("--text", "b\udcffad"), ("--content", '"\udcff"'), ("--meta", "k=\udcff"),
    ("--id", "\udcff"), ("--branch", "b\udcff"), ("--author", "\udcfe"), ("--app", "\udcff"),
])
def test_bytes_that_are_not_utf8_in_a_log_flag_are_refused_naming_it(
    tmp_path: Path, flag: str, value: str
) -> None:
    # A surrogate escape is how Python hands over an argv byte that is not
    # UTF-8; subprocess encodes it back to that byte (0xff, 0xfe).
    given = {"--app": "a", "--user": "u", "--session": "s", "--author": "me", "--text": "x",
             flag: value}
    if flag in ("--content", "--text"):
        given.pop("--text" if flag == "--content" else "--content", None)
    argv = [part for pair in given.items() for part in pair]
    db = tmp_path / "e.db"
    code, out, err = streamd("log", "--db", str(db), "append", *argv)
    assert code == 2 and out == []
    line = one_line(err)
    assert line.startswith(f"streamd: {flag} is not UTF-8 text"), line
    assert not db.exists()
