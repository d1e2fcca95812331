"""A newcomer's first contact: plain ``streamd`` or ``streamd attach`` started on
a terminal says, in one stderr line, that it waits for JSON-RPC on stdin
(spawned by a program it says nothing); the demo explains its terms where it
first uses them and ends with three commands to try; ``log append`` without
content is a usage error; a missing compiled core is said in one plain line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.resident import World, make_world

from streamd.cli.terminal import waiting_line

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), **extra}


def on_a_terminal(argv: list[str], environ: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal for stdin whose input is a Ctrl-D
    (end of input, as a person would type it; the terminal holds it until the
    command reads), and return its status and stderr."""
    master, slave = os.openpty()
    try:
        os.write(master, b"\x04")
        proc = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=environ)
        os.close(slave)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    return proc.returncode, err.decode()


def test_plain_streamd_on_a_terminal_says_what_it_waits_for(tmp_path: Path):
    code, err = on_a_terminal([sys.executable, "-m", "streamd", "--db", str(tmp_path / "x.db")],
                              env())
    assert code == 0
    assert err.splitlines() == [waiting_line("streamd")]
    assert err.startswith("streamd: waiting for JSON-RPC 2.0 requests on stdin, one per line")


def test_plain_streamd_spawned_by_a_program_says_nothing():
    done = subprocess.run([sys.executable, "-m", "streamd"], input=b"", capture_output=True,
                          env=env(), timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


@pytest.fixture
def world() -> Iterator[World]:
    yield from make_world()


def test_attach_on_a_terminal_says_it_relays_to_the_daemon(world: World):
    code, err = on_a_terminal(world.argv("attach"), world.env)
    assert code == 0
    assert err.splitlines()[0] == waiting_line("attach")
    assert "relays them to the resident daemon" in err
    world.run("stop")


def test_log_append_without_content_is_a_usage_error(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "streamd", "log", "--db", str(tmp_path / "e.db"),
                           "append", "--app", "a", "--user", "u", "--session", "s",
                           "--author", "me"], capture_output=True, text=True, env=env(),
                          timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("streamd: log append needs the event's content: --text TEXT or "
                           "--content JSON (see 'streamd log append --help')\n")
    assert not (tmp_path / "e.db").exists()


def test_the_demo_explains_its_terms_and_ends_with_three_commands(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "streamd", "demo"], capture_output=True,
                          text=True, env=env(), timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    said = out.replace("\n   ; ", " ")  # a note's lines, joined where they wrap
    # Each term is explained under the exchange that first shows it.
    health = said.index("== recall/health")
    assert said.index("gen-1 is the index's generation: a numbered snapshot") > health
    assert said.index("is the watermark: how far the index has read the stream") > health
    exact = said.index("== recall/search 'td-f62256'")
    assert exact < said.index("come first, as a partition of their own") < said.index(
        "== recall/search 'stream")
    assert ("So demo:v2/evt-010 (relevance 0.855) ranks above demo:v1/evt-001 (0.862): both "
            "are exact hits with score 1, and 2026-05-02T10:03:00Z is the newer.") in said
    *_, title, a, b, c = out.rstrip("\n").splitlines()
    assert title.startswith("== try next")
    assert a.startswith("   streamd search transcripts ")
    assert b.startswith("   streamd expand v2/evt-011 ")
    assert c.startswith("   streamd log --db demo.db append ")


def test_a_missing_compiled_core_is_said_in_one_plain_line(tmp_path: Path):
    stream = tmp_path / "s.jsonl"
    stream.write_text('{"schema": 2, "id": "r1", "event_time": "2026-05-02T10:00:00Z", '
                      '"title": "alpha"}\n')
    without_core = ("import sys; sys.modules['streamd._native'] = None; "
                    "from streamd.cli import main; sys.exit(main(sys.argv[1:]))")
    env_plain = env()
    env_plain.pop("STREAMD_NATIVE", None)
    done = subprocess.run([sys.executable, "-c", without_core, "search", "alpha", str(stream)],
                          capture_output=True, text=True, env=env_plain, timeout=120)
    assert done.returncode == 0, done.stderr
    notice, summary = done.stderr.splitlines()
    assert notice == (
        "streamd: the compiled indexing core is not installed (cargo was not on the PATH when "
        "recall-streamd was installed), so indexing takes the plain Python path, about six "
        "times slower; pip install -e . again in the clone (with cargo on the PATH) builds it")
    assert summary.startswith("1 matched of 1 records")
