"""Ctrl-C ends every command for people with 130 and no traceback (``index``
says how far it came and that running it again continues); the servers take
SIGINT and SIGTERM as a normal stop, 0, even before they serve; ``log tail``
is ended by Ctrl-C (130) or stopped by SIGTERM (0)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamd.cli import commands as cli
from streamd.cli import main

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), **extra}


def test_conformance_verify_interrupted_exits_130_without_a_traceback(tmp_path: Path):
    # The adapter says it has started by opening a FIFO the test reads, then
    # hangs: the interrupt lands while a case is running, on no timer.
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    adapter = (f"{sys.executable} -c \"import os, time; "
               f"open({str(ready)!r}, 'w').write(str(os.getpid())); time.sleep(600)\"")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamd", "conformance", "verify",
         str(REPO / "conformance" / "stream"), "--adapter", adapter],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    try:
        adapter_pid = int(ready.read_text())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (130, b"", b"")
    with pytest.raises(ProcessLookupError):  # the adapter was killed on the way out
        os.kill(adapter_pid, 0)


@pytest.mark.parametrize("where", ["between steps", "inside a step"])
def test_index_interrupted_says_how_far_it_came_and_the_next_run_continues(
    slow_world, capsys, monkeypatch, where: str
):
    # A real SIGINT, where a person's Ctrl-C lands: between two steps of the
    # build (the progress line) or inside one (sealing a segment). Inside a
    # step it used to end the build there, unsaved: the next run started over.
    from streamd.cli import progress
    from streamd.recall.index import index

    monkeypatch.setattr(index, "SEGMENT_RECORDS", 100)  # sealed, and so saved, often
    stream, work = slow_world.path("a.jsonl"), slow_world.root / "wd"
    sent = []

    def interrupt_halfway(records: int) -> None:
        if records >= 1500 and not sent:
            sent.append(records)
            os.kill(os.getpid(), signal.SIGINT)

    real_update, real_seal = progress.Progress.update, index.Index.seal

    def update(self, consumer):
        real_update(self, consumer)
        if consumer is not None:
            interrupt_halfway(consumer.records_done)

    def seal(self):
        real_seal(self)
        interrupt_halfway(len(self.ids))

    # Only the first run is interrupted; the second runs as slow_world set it up.
    with monkeypatch.context() as patched:
        if where == "between steps":
            patched.setattr(progress.Progress, "update", update)
        else:
            patched.setattr(index.Index, "seal", seal)
        assert main(["index", str(stream), "--workdir", str(work)]) == 130
    assert sent
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    m = re.fullmatch(r"streamd: index interrupted at (\d+)%; what it indexed is kept in "
                     rf"--workdir {re.escape(str(work))}: run the same command again to "
                     r"continue", line)
    assert m and 40 <= int(m[1]) <= 60, line
    assert main(["index", str(stream), "--workdir", str(work)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("gen-1: 3000 records indexed, 0 failed")
    assert re.search(r"\(\d+\.\d MB were indexed before\)", err), err


@pytest.fixture
def sigterm_kept():
    """In-process runs of a server install their early SIGTERM handler here too."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("argv", [[], ["serve"], ["--db", "x.db"]])
def test_a_server_interrupted_before_it_serves_exits_0(argv, monkeypatch, sigterm_kept,
                                                       tmp_path: Path):
    # A Ctrl-C (or Recall's SIGINT) while the server still imports and sets
    # up: a stop, not a failure, and no traceback.
    from streamd import daemon

    monkeypatch.chdir(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(daemon, "Daemon", interrupted)
    assert cli.main(argv) == 0
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)


def test_log_tail_stopped_by_sigterm_exits_0(tmp_path: Path):
    db = tmp_path / "ev.db"
    assert main(["log", "--db", str(db), "append", "--app", "a", "--user", "u", "--session",
                 "s", "--author", "me", "--text", "first"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "streamd", "log", "--db", str(db), "tail"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    try:
        assert b"me: first" in proc.stdout.readline()  # it follows now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (0, b"")
