"""docs/operations.md's restore steps, run as written, restore the log the
daemon would open, wherever the environment puts it.

They named ``~/.local/state/streamd/events.db`` outright: with
``XDG_STATE_HOME`` set (the default log is then under it) they moved files
that did not exist and left the log as it was."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]


def restore_block() -> str:
    page = (REPO / "docs" / "operations.md").read_text()
    section = page.split("## Restore", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, "no sh block in the Restore section"
    return m.group(1)


def test_the_documented_restore_replaces_the_log_xdg_state_home_puts_elsewhere(
    tmp_path: Path,
) -> None:
    home, state, run, work, bin_ = (tmp_path / d for d in ("home", "state", "run", "work",
                                                            "bin"))
    for d in (home, state, run, work, bin_):
        d.mkdir(mode=0o700)
    wrapper = bin_ / "streamd"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m streamd "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMD_", "XDG_"))}
    env.update(HOME=str(home), XDG_STATE_HOME=str(state), XDG_RUNTIME_DIR=str(run),
               PATH=f"{bin_}:{env.get('PATH', '/usr/bin:/bin')}",
               PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO / "src")))

    def streamd(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(wrapper), *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def append(event_id: str) -> None:
        streamd("log", "append", "--app", "a", "--user", "u", "--session", "s",
                "--author", "user", "--text", event_id, "--id", event_id)

    append("e1")
    append("e2")
    streamd("log", "backup", "events-backup.db")
    append("e3")  # after the backup: gone once it is restored
    log = json.loads(streamd("log", "ping", "--json").stdout)["db"]
    assert log == str(state / "streamd" / "events.db")

    # What a reader does: set LOG to the file streamd names.
    script = re.sub(r"(?m)^LOG=\S+", f"LOG={log}", restore_block())
    ran = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)

    restored = json.loads(streamd("log", "ping", "--json").stdout)
    assert restored["latest_seq"] == 2, (ran.stdout, ran.stderr)
    assert Path(f"{log}.old").exists()
    assert not (home / ".local").exists()
