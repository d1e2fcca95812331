"""``examples/adk_resume.py`` runs as docs/agent-builders.md says: with no model
API key, each run a new process (with a new daemon) on the same event log, the
second resuming the session the first stored, its history and state with it;
and the same with the log in each run's own process (``--in-process``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

pytest.importorskip("google.adk")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "adk_resume.py"
DOC = ROOT / "docs" / "agent-builders.md"


def _run(db: Path, message: str, where: str = "--db") -> str:
    env = {k: v for k, v in os.environ.items() if "API_KEY" not in k and "GOOGLE" not in k}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), where, str(db), message], env=env,
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.parametrize("where", ["--db", "--in-process"])
def test_the_example_resumes_its_session_in_a_new_process_without_an_api_key(
    tmp_path: Path, where: str
) -> None:
    db = tmp_path / "demo.db"
    first = _run(db, "remember: my name is Ada", where)
    assert first.splitlines() == [
        "new session 'demo'",
        "helper: Noted.",
        "stored: 4 events, state {'user:facts': ['my name is Ada']}",
    ]
    second = _run(db, "what do you remember?", where)
    assert second.splitlines() == [
        "resumed session 'demo' with 4 events",
        "helper: This is message 2 of our conversation. You told me: my name is Ada.",
        "stored: 6 events, state {'user:facts': ['my name is Ada']}",
    ]


def test_the_agent_builders_page_shows_the_example_as_it_runs() -> None:
    page = DOC.read_text()
    assert "examples/adk_resume.py" in page
    for line in ("helper: Noted.", "resumed session 'demo' with 4 events",
                 "helper: This is message 2 of our conversation. You told me: my name is Ada."):
        assert line in page, line


@pytest.mark.parametrize("where", ["--db", "--in-process"])
def test_an_event_log_the_example_cannot_open_is_one_line_not_a_traceback(
    tmp_path: Path, where: str
) -> None:
    missing = tmp_path / "nowhere" / "demo.db"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), where, str(missing), "hello"],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{tmp_path / 'nowhere'} does not exist" in done.stderr.splitlines()[-1]
    assert not missing.parent.exists()
