"""``streamd attach``: what a Recall core spawns, relayed to the resident daemon.

Real processes in a private world (``support.resident``); every wait is bounded
by a subprocess timeout, a queue timeout or a polled condition with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from support.resident import (
    FAR_DEADLINE,
    Attached,
    World,
    frames,
    make_world,
    pid_alive,
    req,
    wait_for,
)

import streamd
from streamd.resident import stopmark

pytestmark = pytest.mark.subprocess


@pytest.fixture
def world(attach_kind: str):
    yield from make_world(attach_kind)


def check_session(out: bytes) -> None:
    got = frames(out)
    assert set(got) == {1, 2, 3, 4}, out
    assert got[1]["result"]["adapter_id"] == "recall-stream/1"
    assert got[2]["result"]["status"] == "healthy"
    assert len(got[3]["result"]["candidates"]) == 3
    # The shutdown answer is the last frame.
    assert json.loads(out.splitlines()[-1]) == {"jsonrpc": "2.0", "id": 4, "result": {}}


def test_attach_starts_the_daemon_and_relays_a_whole_recall_session_in_lockstep(
    world: World,
) -> None:
    assert world.daemons() == []
    proc = world.attach()
    # stdin stays open to the end: the daemon's close after the shutdown
    # answer is what ends attach, and its stdout's EOF is how the core learns it.
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    check_session(out)
    (pid,) = world.daemons()
    assert world.daemon_pid() == pid  # the daemon outlives the session


def test_a_second_session_is_served_by_the_same_warm_daemon(world: World) -> None:
    first = world.attach()
    out, err = world.lockstep(first)
    assert first.returncode == 0, err
    pid = world.daemon_pid()
    second = world.attach()
    out, err = world.lockstep(second)
    assert second.returncode == 0, err
    check_session(out)
    assert world.daemons() == [pid]


def test_at_end_of_input_attach_half_closes_and_relays_every_answer_still_due(
    world: World,
) -> None:
    world.start_daemon()
    proc = world.attach()
    requests = world.initialize(1) + b"".join(
        req(i, "recall/health", deadline=FAR_DEADLINE) for i in range(2, 12)
    )
    out, err = proc.communicate(requests, timeout=60)
    assert proc.returncode == 0, err
    got = frames(out)
    # Each request is answered exactly once: a result, or -32007 if end of
    # input cancelled it first.
    assert sorted(got) == list(range(1, 12)) and len(out.splitlines()) == 11
    for frame in got.values():
        assert "result" in frame or frame["error"]["code"] == -32007


def open_descriptors(pid: int) -> dict[int, str]:
    """What each descriptor of ``pid`` refers to (one closed meanwhile is skipped)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            pass
    return out


def test_the_daemon_attach_starts_has_its_own_session_and_none_of_our_descriptors(
    world: World,
) -> None:
    extra_read, extra_write = os.pipe()  # a descriptor the core leaks to its adapter
    os.set_inheritable(extra_write, True)
    try:
        # In a group of its own, as the Recall core starts its adapter.
        proc = world.attach(pass_fds=(extra_write,), start_new_session=True)
        session = Attached(proc)
        assert "result" in session.ask(world.initialize(1))
        pid = world.daemon_pid()
        ours = {f"pipe:[{os.fstat(fd).st_ino}]" for fd in (
            extra_write, proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno())}
        fds = open_descriptors(pid)
        assert fds[0] == fds[1] == fds[2] == "/dev/null", fds
        assert not ours & set(fds.values()), fds
        assert os.getsid(pid) not in (os.getsid(0), os.getsid(proc.pid))
        assert os.getpgid(pid) not in (os.getpgid(0), os.getpgid(proc.pid))
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        # The core closes by signalling the adapter's whole group: the daemon
        # is not in it.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert pid_alive(pid) and world.daemon_pid() == pid
    finally:
        os.close(extra_read)
        os.close(extra_write)


def test_the_daemon_attach_starts_is_told_when_it_was_spawned(world: World) -> None:
    # So that a stop asked after the spawn keeps it from serving (stopmark).
    before = stopmark.now()
    proc = world.attach()
    out, err = world.lockstep(proc)
    check_session(out)
    assert proc.returncode == 0, err
    environ = dict(item.split(b"=", 1) for item in
                   Path(f"/proc/{world.daemon_pid()}/environ").read_bytes().split(b"\0")
                   if b"=" in item)
    spawned = float(environ[stopmark.SPAWNED_AT_ENV.encode()])
    assert before <= spawned <= stopmark.now()


def test_a_daemon_killed_with_9_is_replaced_by_the_next_attach(world: World) -> None:
    first = world.attach()
    world.lockstep(first)
    assert first.returncode == 0
    pid = world.daemon_pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 10, "the killed daemon to be gone")
    assert world.socket.exists()  # left behind, with nobody listening
    second = world.attach()
    out, err = world.lockstep(second)
    assert second.returncode == 0, err
    check_session(out)
    assert world.daemon_pid() != pid


def test_two_attaches_racing_to_start_a_daemon_end_with_one_and_both_answered(
    world: World,
) -> None:
    procs = [world.attach(), world.attach()]
    results: list[tuple[bytes, bytes] | None] = [None, None]

    def drive(i: int) -> None:
        results[i] = world.lockstep(procs[i])

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for proc, result in zip(procs, results, strict=True):
        assert result is not None and proc.returncode == 0, result
        check_session(result[0])
    pid = world.daemon_pid()
    wait_for(lambda: world.daemons() == [pid], 10, "exactly one daemon")


def test_attach_says_one_line_and_exits_1_when_the_daemon_dies_mid_session(
    world: World,
) -> None:
    proc = world.attach()
    session = Attached(proc)
    assert "result" in session.ask(world.initialize(1))
    os.kill(world.daemon_pid(), signal.SIGKILL)
    assert session.at_eof()  # nothing more is written
    assert proc.wait(timeout=10) == 1
    err = session.stderr().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("streamd attach: "), err


def test_a_daemon_whose_socket_file_was_deleted_serves_the_next_attach(world: World) -> None:
    # A cleaner of /tmp took the socket file. The daemon holds the lock, so
    # the one attach starts cannot serve: only the first one binding its
    # name again lets anyone in (every attach failed after its start timeout).
    daemon = world.start_daemon()
    world.socket.unlink()
    proc = world.attach("--start-timeout", "30")
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    check_session(out)
    assert world.daemon_pid() == daemon.pid


def closing(fds: str, argv: list[str]) -> list[str]:
    """``argv`` run with the descriptors ``fds`` ("<&-", "2>&-") closed, as a
    careless spawner leaves them."""
    return ["sh", "-c", f'exec "$@" {fds}', "sh", *argv]


def test_attach_started_with_stdin_closed_ends_as_at_end_of_input(world: World) -> None:
    world.start_daemon()
    # The daemon socket must not take descriptor 0: attach would read its
    # own socket as its input and wait on it forever.
    done = subprocess.run(closing("<&-", world.argv("attach")), env=world.env,
                          capture_output=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


def test_attach_started_with_stderr_closed_writes_only_frames_to_stdout(
    world: World,
) -> None:
    world.start_daemon()
    proc = subprocess.Popen(closing("2>&-", world.argv("attach")), env=world.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    session = Attached(proc)
    assert "result" in session.ask(world.initialize(1))
    os.kill(world.daemon_pid(), signal.SIGKILL)
    # Its one line of why goes nowhere; never among the frames.
    assert session.at_eof()
    assert proc.wait(timeout=10) == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_attach_at_once_and_the_daemon_serves_on(
    world: World, signum: int
) -> None:
    proc = world.attach()
    session = Attached(proc)
    assert "result" in session.ask(world.initialize(1))
    pid = world.daemon_pid()
    # The daemon keeps the connection open and stdin stays open: an attach that
    # did not end on the signal itself would relay forever, and the bounded
    # wait (a hang guard, not a speed goal) would fail.
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 0
    assert world.daemon_pid() == pid


def test_an_older_daemon_is_retired_and_a_new_one_serves(world: World) -> None:
    old = world.start_daemon("--announce-version", "0.0.1")
    with world.connect() as held:
        held.send(world.initialize(1))
        assert "result" in held.frame()
        proc = world.attach()
        out, err = world.lockstep(proc)
        assert proc.returncode == 0, err
        check_session(out)
        info = world.hello()
        assert info["pid"] != old.pid and info["version"] == streamd.__version__
        # The old daemon finishes the client it had...
        held.send(req(2, "recall/health", deadline=FAR_DEADLINE))
        assert held.frame()["result"]["status"] == "healthy"
    # ...and exits when it is gone.
    assert old.wait(timeout=10) == 0
    assert world.hello()["pid"] == info["pid"]


def test_a_newer_daemon_is_used_as_it_is(world: World) -> None:
    newer = world.start_daemon("--announce-version", "99.0")
    proc = world.attach()
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    check_session(out)
    assert world.daemons() == [newer.pid]


def test_a_daemon_that_cannot_start_is_reported_at_once_in_its_own_words(
    world: World,
) -> None:
    # The arguments after -- go to `streamd daemon`, which refuses these. The
    # start timeout is far longer than the subprocess may take: attach must
    # learn of the exit from the daemon, not from running out of time.
    proc = world.attach("--start-timeout", "600", "--", "--max-sources", "0")
    out, err = proc.communicate(world.initialize(1), timeout=60)
    assert proc.returncode == 1 and out == b""
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "the daemon it started (pid " in lines[0] and "exited with status 2" in lines[0]
    assert "--max-sources must be at least 1" in lines[0]


def test_arguments_after_the_separator_configure_the_daemon_attach_starts(
    world: World,
) -> None:
    proc = world.attach("--", "--idle-exit", "0.5")
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    check_session(out)
    (pid,) = world.daemons()
    wait_for(lambda: not pid_alive(pid), 20, "the daemon's idle exit")
    assert not world.socket.exists()


def test_attach_refuses_a_stray_argument(world: World) -> None:
    done = world.run("attach", "--bogus", input="")
    assert done.returncode == 2 and "unrecognized argument '--bogus'" in done.stderr
    assert world.daemons() == []
    assert subprocess.run(world.argv("attach", "--help"), env=world.env, capture_output=True,
                          timeout=30).returncode == 0


def test_attach_help_keeps_its_exit_code_when_nobody_reads_it(world: World) -> None:
    # `streamd attach --help | head -1`: a BrokenPipeError traceback, exit 1
    # (or "Exception ignored", 120), where `status --help` exits 0 silently.
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        done = subprocess.run(world.argv("attach", "--help"), env=world.env, stdout=write_end,
                              stderr=subprocess.PIPE, timeout=30)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_frame_of_many_chunks_is_relayed_whole_and_unchanged(world: World) -> None:
    world.start_daemon()
    content = "x" * (3 << 20)  # an answer of ~3 MiB arrives in many reads
    event = {"app": "app", "user": "u", "session": "s",
             "event": {"id": "big", "author": "agent", "content": content}}
    proc = world.attach()
    session = Attached(proc)
    assert session.ask(req(1, "eventlog/append", **event), 60)["result"]["duplicate"] is False
    session.send(req(2, "eventlog/since", from_seq=0))
    line = session.line(60)
    assert line is not None and line.endswith(b"\n")
    (entry,) = json.loads(line)["result"]["entries"]
    assert entry["event"]["content"] == content
    proc.stdin.close()
    assert session.at_eof() and proc.wait(timeout=10) == 0


SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(("db", "said"), [
    (f"postgresql://u:{SECRET}@/x?host=/nowhere", "--db holds a password (password), which"),
    (f"mysql://root:{SECRET}@localhost/x", "--db holds a password (password), which"),
    ("{root}/no-such-dir/e.db", "--db: event log database {root}/no-such-dir/e.db: directory "
     "{root}/no-such-dir does not exist (create it first: only the default location is "
     "created)"),
    ("{root}", "--db: event log database {root}: is a directory; give a file path"),
    ("/dev/null", "--db: event log database /dev/null: is a character device, not a regular"
     " file; give a file path"),
    ("{root}/pipe.db", "--db: event log database {root}/pipe.db: is a named pipe (FIFO), not a"
     " regular file; give a file path"),
])
def test_a_db_the_daemon_must_not_be_started_with_is_refused_before_any_daemon(
    world: World, db: str, said: str,
) -> None:
    # The compiled attach checks a plain file name itself and hands anything
    # else to streamd's own parser: both must say what `streamd attach` says.
    db, said = db.format(root=world.root), said.format(root=world.root)
    if db.endswith("pipe.db"):
        os.mkfifo(db)
    for args in (("--", "--db", db), ("--", f"--db={db}")):
        done = subprocess.run(world.argv("attach", *args), env=world.env, input=b"",
                              capture_output=True, timeout=60)
        err = done.stderr.decode()
        assert (done.returncode, done.stdout) == (2, b""), err
        (line,) = err.splitlines()
        assert line.startswith(f"streamd: {said}"), line
        assert SECRET not in err
    assert world.daemons() == [] and not world.runtime.exists()


def test_a_db_it_may_use_reaches_the_daemon_it_starts(world: World) -> None:
    db = world.root / "e.db"
    proc = world.attach("--", "--db", str(db))
    session = Attached(proc)
    event = {"app": "a", "user": "u", "session": "s",
             "event": {"id": "e1", "author": "agent", "content": "hi"}}
    assert session.ask(req(1, "eventlog/append", **event))["result"]["duplicate"] is False
    proc.stdin.close()
    assert session.at_eof() and proc.wait(timeout=30) == 0
    assert db.exists()


@pytest.mark.no_attach
def test_streamd_attach_without_streamd_beside_it_uses_a_running_daemon_and_starts_none(
    world: World, streamd_attach: Path,
) -> None:
    # The daemon is started with the Python of the `streamd` script beside the
    # binary. A copy without one still relays to a running daemon (it needs
    # no Python for that) and, with none running, says why it cannot start one.
    alone = world.root / "bin" / "streamd-attach"
    alone.parent.mkdir()
    shutil.copy2(streamd_attach, alone)
    done = subprocess.run([str(alone)], env=world.env, input=world.initialize(1),
                          capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode().splitlines() == [
        f"streamd attach: cannot start a daemon: no 'streamd' script or 'python3' beside "
        f"{alone} to run it with (streamd-attach belongs in the bin directory of a streamd "
        "install)"]
    assert world.daemons() == []
    world.start_daemon()
    proc = subprocess.Popen([str(alone)], env=world.env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = world.lockstep(proc)
    assert proc.returncode == 0, err
    check_session(out)


@pytest.mark.no_attach
def test_the_compiled_db_check_never_imports_from_the_callers_working_directory(
    world: World, streamd_attach: Path,
) -> None:
    # streamd-attach asks streamd's own parser about a --db that is not a
    # plain file name, in a Python it starts. That Python must read the
    # installed streamd, as the `streamd` script does: a `streamd` package in
    # whatever directory the caller runs from would be handed the --db (and
    # its password) and decide the check.
    planted = world.work / "streamd" / "eventlog"
    planted.mkdir(parents=True)
    (planted.parent / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "dbtarget.py").write_text("def argv_error(argv):\n    return 'PLANTED'\n")
    done = subprocess.run([str(streamd_attach), "--", "--db", f"mysql://root:{SECRET}@h/x"],
                          env=world.env, cwd=world.work, input=b"", capture_output=True,
                          timeout=60)
    err = done.stderr.decode()
    assert (done.returncode, done.stdout) == (2, b""), err
    assert "PLANTED" not in err
    assert err.startswith("streamd: --db holds a password (password), which"), err
    assert world.daemons() == []
