"""Relative paths through ``streamd attach`` and ``Client.connect`` mean what they
mean to the caller, though the daemon runs in ``/``; and a running daemon refuses
a client told to use another event log.

Real processes in a private world (``support.resident``). The relative names
start with ``proc/``: resolved against ``/`` (the bug) they would land in
procfs, where nothing can be created, so a regression fails loudly and never
writes outside the world, even as root.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.resident import Attached, World, make_world, point_clients_at, req

from streamd.client import Client
from streamd.errors import RpcError
from streamd.eventlog.model import Event
from streamd.resident import launch

pytestmark = pytest.mark.subprocess

APPEND = {"app": "app", "user": "u", "session": "s",
          "event": {"id": "e1", "author": "agent", "content": "hello"}}


@pytest.fixture
def world(attach_kind: str):
    yield from make_world(attach_kind)


def attach_here(world: World, cwd: Path, *args: str, env: dict | None = None) -> Attached:
    proc = subprocess.Popen(world.argv("attach", *args), env=env or world.env, cwd=cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    return Attached(proc)


def end(session: Attached) -> int:
    session.proc.stdin.close()
    assert session.at_eof()
    return session.proc.wait(timeout=30)


def test_a_relative_runtime_dir_serves_this_attach_and_every_later_one(world: World) -> None:
    # "run" from the world's root is the world's runtime directory; from "/"
    # it is /run, which belongs to root and is open to others: refused.
    env = {**world.env, "STREAMD_RUNTIME_DIR": world.runtime.name}
    first = attach_here(world, world.root, env=env)
    assert "result" in first.ask(world.initialize(1)), first.stderr()
    assert end(first) == 0
    (pid,) = world.daemons()
    assert world.daemon_pid() == pid  # on the world's socket, its path absolute
    second = attach_here(world, world.root, env=env)
    assert "result" in second.ask(world.initialize(1)), second.stderr()
    assert end(second) == 0
    assert world.daemons() == [pid]


def test_a_relative_home_names_the_same_runtime_dir_for_attach_and_its_daemon(
    world: World,
) -> None:
    # No runtime or state directory named: both come from HOME, "proc" from
    # the world's root. Resolved against the daemon's "/" it would be
    # /proc/.local/..., where nothing can be made.
    env = {k: v for k, v in world.env.items()
           if k not in ("STREAMD_RUNTIME_DIR", "XDG_STATE_HOME")}
    env["HOME"] = "proc"
    run = world.root / "proc" / ".local" / "state" / "streamd" / "run"
    try:
        session = attach_here(world, world.root, env=env)
        assert "result" in session.ask(world.initialize(1), 60), session.stderr()
        assert end(session) == 0, session.stderr()
        assert (run / "streamd.sock").exists()
    finally:
        # Not in the world's environment (no STREAMD_RUNTIME_DIR): ended here.
        lock = run / "streamd.lock"
        held = lock.read_text().split() if lock.exists() else []
        if held:
            os.kill(int(held[0]), signal.SIGKILL)


def test_a_runtime_dir_after_the_separator_is_where_attach_finds_its_daemon(
    world: World,
) -> None:
    # The daemon serves in "alt" (made absolute against our directory); an
    # attach looking in its default directory never found it, waited out its
    # start timeout and left it running.
    alt = world.root / "alt"
    pids = set()
    for _ in range(2):
        session = attach_here(world, world.root, "--start-timeout", "20", "--",
                              "--runtime-dir", "alt")
        assert "result" in session.ask(world.initialize(1), 60), session.stderr()
        assert end(session) == 0, session.stderr()
        pids.update(world.daemons())
    assert len(pids) == 1  # the second attach found the first one's daemon
    assert (alt / "streamd.sock").exists() and not world.socket.exists()


@pytest.mark.no_attach
def test_client_connect_finds_the_daemon_where_its_daemon_args_put_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_clients_at(world, monkeypatch)
    monkeypatch.chdir(world.root)
    for _ in range(2):
        with Client.connect(daemon_args=["--runtime-dir", "alt"], start_timeout=20) as client:
            event = Event(id="e1", author="agent", content="hello")
            client.append("app", "u", "s", event)
    assert len(world.daemons()) == 1
    assert (world.root / "alt" / "streamd.sock").exists() and not world.socket.exists()


@pytest.mark.parametrize("how", ["--db", "--db=", "STREAMD_DB"])
def test_a_relative_event_log_lands_beside_the_caller(world: World, how: str) -> None:
    (world.root / "proc").mkdir()
    env = dict(world.env)
    if how == "STREAMD_DB":
        env["STREAMD_DB"] = "proc/events.db"
        args: tuple[str, ...] = ()
    elif how == "--db":
        args = ("--", "--db", "proc/events.db")
    else:
        args = ("--", "--db=proc/events.db")
    session = attach_here(world, world.root, *args, env=env)
    answer = session.ask(req(1, "eventlog/append", **APPEND))
    assert answer["result"]["duplicate"] is False, answer
    assert end(session) == 0
    assert (world.root / "proc" / "events.db").exists()


@pytest.mark.no_attach
def test_a_client_connect_with_a_relative_db_writes_it_beside_the_caller(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    (world.root / "proc").mkdir()
    point_clients_at(world, monkeypatch)
    monkeypatch.chdir(world.root)
    with Client.connect(daemon_args=["--db", "proc/events.db"]) as client:
        event = Event(id="e1", author="agent", content="hello")
        assert client.append("app", "u", "s", event).seq == 1
    assert (world.root / "proc" / "events.db").exists()


def handshake(location: str, workdir: str) -> bytes:
    return req(1, "recall/initialize", protocol_version_min=1, protocol_version_max=1,
               workdir=workdir, source_id="signals", location=location, settings={})


def search_answer(world: World, argv: list[str], frames: list[bytes]) -> list[dict]:
    """Each frame after the previous answer (as a core drives it); the search's
    candidates."""
    session = Attached(subprocess.Popen(argv, env=world.env, cwd=world.root,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE))
    answers = [session.ask(frame, 60) for frame in frames]
    assert session.at_eof(60) and session.proc.wait(timeout=30) == 0
    for answer in answers:
        assert "result" in answer, (answer, session.stderr())
    return answers[1]["result"]["candidates"]


def test_a_relative_location_and_workdir_mean_the_same_through_attach_as_on_stdio(
    world: World,
) -> None:
    work = world.root / "proc" / "work"
    work.mkdir(parents=True)  # the host's to create, as Recall does
    frames = [
        handshake("data/a.jsonl", "proc/work"),
        req(2, "recall/search", query="deploy", filters={}, limit=5,
            deadline="2999-01-01T00:00:00Z"),
        req(3, "recall/refresh", deadline="2999-01-01T00:00:00Z"),  # saves to the workdir
        req(4, "recall/shutdown"),
    ]
    through_attach = search_answer(world, world.argv("attach"), frames)
    saved = sorted(os.listdir(work))
    assert saved  # the index went to the workdir the caller meant
    on_stdio = search_answer(world, world.argv(), frames)
    assert sorted(os.listdir(work)) == saved  # the same workdir, adopted
    assert len(through_attach) == 5
    assert [c["candidate_id"] for c in through_attach] == \
        [c["candidate_id"] for c in on_stdio]


@pytest.mark.no_attach
def test_a_relative_location_from_a_client_that_never_said_its_directory_is_refused(
    world: World,
) -> None:
    world.start_daemon()
    with world.connect() as conn:
        conn.send(handshake("data/a.jsonl", str(world.work)))
        reply = conn.frame()
    assert reply["error"]["code"] == -32602, reply
    assert "relative location" in reply["error"]["message"]


def test_a_running_daemon_refuses_an_attach_told_to_use_another_event_log(
    world: World,
) -> None:
    mine, other = world.root / "mine.db", world.root / "other.db"
    world.start_daemon("--db", str(mine))
    for args, env in (
        (("--", "--db", str(other)), world.env),
        ((), {**world.env, "STREAMD_DB": str(other)}),
    ):
        done = subprocess.run(world.argv("attach", *args), env=env, input=b"",
                              capture_output=True, timeout=60)
        assert done.returncode == 1 and done.stdout == b""
        lines = done.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and "refused" in lines[0], lines
        assert str(mine) in lines[0] and str(other) in lines[0]
    assert not other.exists()
    # The log it serves, named either way, is no mismatch.
    session = attach_here(world, world.root, "--", "--db", "mine.db")
    assert session.ask(req(1, "eventlog/append", **APPEND))["result"]["duplicate"] is False
    assert end(session) == 0


@pytest.mark.no_attach
def test_client_connect_told_to_use_another_event_log_raises_naming_both(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = world.root / "mine.db", world.root / "other.db"
    world.start_daemon("--db", str(mine))
    monkeypatch.setenv("STREAMD_RUNTIME_DIR", str(world.runtime))
    monkeypatch.setenv("STREAMD_DB", str(other))
    with pytest.raises(RpcError) as info:
        Client.connect()
    assert info.value.code == -32000
    assert str(mine) in info.value.message and str(other) in info.value.message


def test_every_spelling_of_a_path_option_is_made_absolute() -> None:
    cwd = "/home/me/project"
    home = os.path.expanduser("~")
    assert launch.absolute_args(
        ["--db", "ev.db", "--log-file=logs/d.log", "--d", "../x.db", "--idle-exit", "5",
         "--runtime-dir", "~/run", "--log-file", "-", "-v",
         "--db", "postgresql://u@/db?host=/tmp", "--synchronous", "NORMAL",
         "--db", "mysql://u@/db?unix_socket=/run/my.sock", "--db", "host=/tmp dbname=x",
         "--db", "./a=b.db"],
        cwd,
    ) == ["--db", "/home/me/project/ev.db", "--log-file=/home/me/project/logs/d.log",
          "--d", "/home/me/x.db", "--idle-exit", "5", "--runtime-dir", f"{home}/run",
          "--log-file", "-", "-v", "--db", "postgresql://u@/db?host=/tmp",
          "--synchronous", "NORMAL", "--db", "mysql://u@/db?unix_socket=/run/my.sock",
          "--db", "host=/tmp dbname=x", "--db", "/home/me/project/a=b.db"]
    env = launch.absolute_env({"STREAMD_DB": "a.db", "STREAMD_RUNTIME_DIR": "/abs",
                               "HOME": "h", "LANG": "C.UTF-8"}, cwd)
    assert env == {"STREAMD_DB": "/home/me/project/a.db", "STREAMD_RUNTIME_DIR": "/abs",
                   "HOME": "/home/me/project/h", "LANG": "C.UTF-8"}
