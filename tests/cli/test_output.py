"""What becomes of a command's output that cannot be written as usual, the way
grep and rg have it: a reader gone (``| head -1``) is no error and the exit
status is still what was found; stdout on a full disk is one line and exit 2;
descriptors left closed (``>&-``, ``2>&-``) are /dev/null, so the output is
gone as asked and the exit status still says what was found.

Each runs the real process: the descriptors are the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
RECORD = ('{"schema": 2, "id": "r%d", "event_time": "2026-05-02T10:00:00Z", '
          '"title": "Deploy alpha"}\n')
# Enough failed lines that `check` writes more than a pipe's buffer holds.
BAD_LINES = 20_000


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "NO_COLOR": "1"}


def streamd(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamd", *args]


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "s.jsonl").write_text(RECORD % 1)
    (tmp_path / "bad.jsonl").write_text("".join(
        "junk\n" if n % 2 else RECORD % n for n in range(2 * BAD_LINES)))
    return tmp_path


COMMANDS = {
    "search": ["search", "deploy", "s.jsonl"],
    "search --json": ["search", "deploy", "s.jsonl", "--json"],
    "expand": ["expand", "v2/r1", "s.jsonl"],
    "expand --json": ["expand", "v2/r1", "s.jsonl", "--json"],
    "index": ["index", "s.jsonl", "--workdir", "wd"],
    "check": ["check", "bad.jsonl"],
    "check --json": ["check", "bad.jsonl", "--json"],
}


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("name", COMMANDS)
def test_stdout_on_a_full_disk_is_an_error_of_one_line(here: Path, name: str) -> None:
    # It was a traceback and exit 1, which for search means "no hit"; check
    # named its input as the file that failed ("bad.jsonl: no space left").
    with open("/dev/full", "w") as full:
        done = subprocess.run(streamd(*COMMANDS[name]), cwd=here, env=env(), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr.splitlines()[-1] == \
        "streamd: cannot write to stdout: No space left on device"


def test_check_whose_reader_went_away_exits_1_without_a_word(here: Path) -> None:
    # `streamd check bad.jsonl | head -1`: was "streamd: bad.jsonl: broken
    # pipe", exit 2, as if the input could not be read.
    for args in (["check", "bad.jsonl"], ["check", "bad.jsonl", "--json"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first line
        try:
            done = subprocess.run(streamd(*args), cwd=here, env=env(), stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write_end)
        assert (done.returncode, done.stderr) == (1, ""), args


def test_search_whose_reader_went_away_still_exits_by_its_hits(here: Path) -> None:
    for query, code in (("deploy", 0), ("nothing", 1)):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run(streamd("search", query, "s.jsonl", "--json"), cwd=here,
                                  env=env(), stdout=write_end, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
        finally:
            os.close(write_end)
        assert (done.returncode, done.stderr) == (code, "")


def closed(fd: int, *args: str) -> list[str]:
    """``streamd ARGS`` with descriptor ``fd`` closed (``>&-``, ``2>&-``)."""
    return ["sh", "-c", f'exec "$@" {fd}>&-', "sh", *streamd(*args)]


@pytest.mark.parametrize(("args", "code"), [
    (["search", "deploy", "s.jsonl"], 0),
    (["search", "nothing", "s.jsonl"], 1),
    (["expand", "v2/r1", "s.jsonl"], 0),
    (["index", "s.jsonl", "--workdir", "wd"], 0),
    (["check", "bad.jsonl"], 1),
    (["check", "s.jsonl"], 0),
])
def test_a_closed_stdout_keeps_the_exit_status(here: Path, args: list[str], code: int) -> None:
    # sys.stdout was None: an AttributeError traceback and exit 1 from each.
    done = subprocess.run(closed(1, *args), cwd=here, env=env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "code"), [
    (["search", "deploy", "bad.jsonl", "--json"], 0),
    (["search", "nothing", "bad.jsonl", "--json"], 1),
    (["search", "deploy", "gone.jsonl", "--json"], 2),
    (["search", "deploy", "bad.jsonl"], 0),
])
def test_a_closed_stderr_keeps_the_exit_status_and_json_clean(
    here: Path, args: list[str], code: int
) -> None:
    # sys.stderr was None: the lines naming bad.jsonl's failed lines went to
    # stdout among --json's, and the plain search printed nothing, exit 1.
    done = subprocess.run(closed(2, *args), cwd=here, env=env(), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, timeout=120)
    assert done.returncode == code
    if "--json" in args:
        assert all(json.loads(line)["type"] in ("hit", "summary")
                   for line in done.stdout.splitlines())
    elif code == 0:
        assert "stream:v2/r0" in done.stdout


def test_the_stdio_server_with_stdout_closed_serves_and_stops_with_0(tmp_path: Path) -> None:
    # Its own descriptors took number 1: it died at start, in a traceback.
    db = tmp_path / "ev.db"
    frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eventlog/sessions.create",
                        "params": {"app": "a", "user": "u", "session": "s"}})
    done = subprocess.run(closed(1, "--db", str(db)), env=env(), input=frame + "\n",
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), done.stderr
    listed = subprocess.run(streamd("log", "--db", str(db), "sessions", "list", "--app", "a",
                                    "--json"), env=env(), capture_output=True, text=True,
                            timeout=120)
    assert [s["session"] for s in json.loads(listed.stdout)["sessions"]] == ["s"]
