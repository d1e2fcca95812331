"""``streamd daemon``: one per user, peers of this uid only, idle exit, retirement,
and ``streamd status`` / ``streamd stop`` for people.

Every test runs real processes in a private world (``support.resident``), each
wait bounded by a subprocess timeout or a polled condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest
from support.resident import FAR_DEADLINE, World, make_world, req, wait_for

import streamd
from streamd.resident import stopmark

pytestmark = pytest.mark.subprocess


@pytest.fixture
def world():
    yield from make_world()


def test_a_second_daemon_exits_1_with_one_line_and_the_first_serves_on(world: World) -> None:
    first = world.start_daemon()
    second = world.run("daemon")
    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert "another streamd daemon is already running" in lines[0]
    assert f"pid {first.pid}" in lines[0]
    assert world.daemon_pid() == first.pid
    assert world.daemons() == [first.pid]


def test_the_socket_directory_is_made_private_and_the_socket_is_0600(world: World) -> None:
    world.start_daemon()
    assert stat.S_IMODE(os.stat(world.runtime).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(world.socket).st_mode) == 0o600
    assert (world.runtime / "streamd.lock").exists()


def test_a_socket_directory_open_to_others_is_refused_not_repaired(world: World) -> None:
    world.runtime.mkdir(mode=0o700)
    os.chmod(world.runtime, 0o755)
    daemon = world.run("daemon")
    assert daemon.returncode == 1
    assert "must be 0700" in daemon.stderr and len(daemon.stderr.strip().splitlines()) == 1
    attach = world.run("attach", input="")
    assert attach.returncode == 1 and "must be 0700" in attach.stderr
    assert stat.S_IMODE(os.stat(world.runtime).st_mode) == 0o755
    assert world.daemons() == []


def test_status_and_stop_say_the_directory_is_refused_not_that_a_daemon_is_silent(
    world: World,
) -> None:
    # status said "not answering on .../streamd.sock", as if a daemon hung there.
    world.runtime.mkdir(mode=0o700)
    os.chmod(world.runtime, 0o755)
    why = f"{world.runtime} has mode 0755; it must be 0700 (no group or other access)"
    for command in ("status", "stop"):
        done = world.run(command)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"streamd {command}: {why}\n")


def test_status_and_stop_say_a_socket_path_too_long_is_one_no_daemon_can_serve(
    world: World,
) -> None:
    # One byte past what sun_path holds: attach and the daemon named the path
    # and the fix; status said "not answering on ...: AF_UNIX path too long",
    # as if a daemon hung there, and stop said only "AF_UNIX path too long".
    runtime = world.root / ("r" * (108 - len(f"{world.root}/") - len("/streamd.sock")))
    runtime.mkdir(mode=0o700)
    sock = runtime / "streamd.sock"
    assert len(os.fsencode(sock)) == 108
    why = (f"socket path {sock} is longer than the 107 bytes a Unix socket address can "
           "hold; set STREAMD_RUNTIME_DIR to a shorter directory")
    env = {"STREAMD_RUNTIME_DIR": str(runtime)}
    for command in ("status", "stop", "daemon"):
        done = world.run(command, env=env)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"streamd {command}: {why}\n")
    assert json.loads(world.run("status", "--json", env=env).stdout)["error"] == why


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a peer as another uid")
def test_a_peer_of_another_uid_is_closed_without_an_answer(world: World) -> None:
    world.start_daemon()
    # Open the way to the socket, as a careless admin might: the daemon must
    # still refuse the peer by its credentials.
    for d in (world.root, world.runtime):
        os.chmod(d, 0o711)
    os.chmod(world.socket, 0o666)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(str(world.socket))
            got = b""
            try:
                # The daemon may have closed already: then this write fails.
                s.sendall(req(1, "streamd/hello", client_version="0"))
                while chunk := s.recv(65536):
                    got += chunk
            except (BrokenPipeError, ConnectionResetError):
                pass
            os.write(write_end, f"closed after {len(got)} bytes".encode())
        except BaseException as exc:
            os.write(write_end, f"error {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        outcome = f.read().decode()
    os.waitpid(child, 0)
    assert outcome == "closed after 0 bytes", outcome
    wait_for(lambda: "refused a connection from uid 65534" in world.log.read_text(), 10,
             "the refusal in the daemon's log")
    assert world.hello()["version"] == streamd.__version__  # this uid is still served


def test_a_daemon_without_clients_for_its_idle_time_exits_and_frees_its_name(
    world: World,
) -> None:
    proc = world.start_daemon("--idle-exit", "0.5")
    assert proc.wait(timeout=20) == 0
    assert not world.socket.exists()
    assert "no client for 0.5 s: exiting" in world.log.read_text()
    # The lock is free, and no stop was asked: even a daemon a client spawned
    # before the idle exit serves (only a stop leaves the mark, see stopmark).
    assert not (world.runtime / stopmark.MARK_NAME).exists()
    world.start_daemon(env={stopmark.SPAWNED_AT_ENV: "0.0"})


def test_a_connected_client_keeps_an_idle_daemon_running(world: World) -> None:
    proc = world.start_daemon("--idle-exit", "1")
    with world.connect() as conn:
        conn.result("streamd/hello", client_version="0")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2.5)
        assert conn.result("streamd/status")["pid"] == proc.pid
    assert proc.wait(timeout=20) == 0


def test_recall_shutdown_ends_its_connection_and_never_the_daemon(world: World) -> None:
    proc = world.start_daemon()
    with world.connect() as conn:
        conn.send(world.initialize(1))
        assert conn.frame()["result"]["adapter_id"] == "recall-stream/1"
        conn.send(req(2, "recall/shutdown"))
        assert conn.frame() == {"jsonrpc": "2.0", "id": 2, "result": {}}
        assert conn.closed()
    assert proc.poll() is None
    assert world.daemon_pid() == proc.pid


def test_status_and_stop_answer_people_with_systemctl_exit_codes(world: World) -> None:
    status = world.run("status")
    assert status.returncode == 3 and "not running" in status.stdout
    stop = world.run("stop")
    assert stop.returncode == 0 and "not running" in stop.stdout

    proc = world.start_daemon()
    with world.connect() as held:
        held.result("streamd/hello", client_version="0")
        status = world.run("status")
        assert status.returncode == 0, status.stderr
        assert f"pid {proc.pid}" in status.stdout and "1 connected" in status.stdout
        info = json.loads(world.run("status", "--json").stdout)
        assert info["running"] is True and info["pid"] == proc.pid
        assert info["version"] == streamd.__version__
        assert info["socket"] == str(world.socket)
        assert info["log"] == str(world.log)
        assert info["db"] == str(world.state / "streamd" / "events.db")
        assert info["connections"] == 1 and info["sources"] == 0
        assert info["uptime_s"] >= 0

        stop = world.run("stop")
        assert stop.returncode == 0 and f"stopped (pid {proc.pid})" in stop.stdout
        assert held.closed()
    assert proc.wait(timeout=10) == 0
    assert not world.socket.exists()
    assert world.run("status").returncode == 3


def test_status_and_stop_keep_their_exit_codes_when_nobody_reads_their_output(
    world: World,
) -> None:
    def unread(*args: str) -> tuple[int, bytes]:
        """``streamd ARGS`` with stdout a pipe whose reader is gone (``| head -0``)."""
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run(world.argv(*args), env=world.env, stdout=write_end,
                                  stderr=subprocess.PIPE, timeout=60)
        finally:
            os.close(write_end)
        return done.returncode, done.stderr

    assert unread("status") == (3, b"")
    assert unread("status", "--help") == (0, b"")
    proc = world.start_daemon()
    assert unread("status") == (0, b"")
    assert unread("status", "--json") == (0, b"")
    assert unread("stop") == (0, b"")
    assert proc.wait(timeout=10) == 0


def test_stop_stops_a_daemon_whose_socket_file_was_deleted(world: World) -> None:
    # A cleaner of /tmp took the socket file: until the daemon binds it again
    # (or if it cannot), it serves nobody, and its lock keeps every daemon a
    # client starts from serving. `stop` said "not running; nothing to stop".
    proc = world.start_daemon()
    world.socket.unlink()
    stop = world.run("stop")
    assert stop.returncode == 0, stop.stderr
    assert f"stopped (pid {proc.pid})" in stop.stdout, stop
    assert proc.wait(timeout=10) == 0
    assert world.run("status").returncode == 3


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_daemon_as_streamd_stop_does(world: World, signum: int) -> None:
    proc = world.start_daemon()
    with world.connect() as conn:
        conn.send(world.initialize(1))
        assert "result" in conn.frame()
        proc.send_signal(signum)
        assert conn.closed()
    assert proc.wait(timeout=10) == 0
    assert not world.socket.exists()
    assert "stopping" in world.log.read_text()


@pytest.mark.parametrize("how", ["stop", "SIGTERM"])
def test_a_daemon_spawned_before_a_stop_does_not_serve_after_it(world: World, how: str) -> None:
    # Clients racing to start the daemon each spawn one; a loser still starting
    # when the winner is stopped must not take the freed lock and serve.
    proc = world.start_daemon()
    spawned = {stopmark.SPAWNED_AT_ENV: f"{stopmark.now():.6f}"}  # the loser's spawn
    if how == "stop":
        assert world.run("stop").returncode == 0
    else:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0

    late = world.run("daemon", env=spawned)
    assert late.returncode == 1
    lines = late.stderr.strip().splitlines()
    assert len(lines) == 1 and "not starting" in lines[0] and "stopped" in lines[0], late.stderr
    assert world.run("status").returncode == 3
    assert not world.socket.exists()

    # Spawned after the stop, or started by hand: it serves.
    after = world.start_daemon(env={stopmark.SPAWNED_AT_ENV: f"{stopmark.now():.6f}"})
    assert world.daemon_pid() == after.pid
    assert world.run("stop").returncode == 0
    assert after.wait(timeout=10) == 0
    by_hand = world.start_daemon()
    assert world.daemon_pid() == by_hand.pid


def test_status_says_why_the_event_log_could_not_be_opened_and_never_the_password(
    world: World,
) -> None:
    # A server that does not answer (nothing listens on port 1): each call
    # fails and tries again; status says why, as a person asks for it.
    db = "postgresql://streamd:hunter2@127.0.0.1:1/events"
    world.start_daemon(env={"STREAMD_DB": db})
    with world.connect() as conn:
        reply = conn.call("eventlog/ping")
        assert reply["error"]["code"] == -32000
        fault = conn.result("streamd/status")["db_fault"]
        assert fault.startswith(reply["error"]["message"])
        assert fault.endswith("(tried again at the next call)")
    status = world.run("status")
    assert status.returncode == 0 and "EVENT LOG FAULT  cannot connect to" in status.stdout
    assert "hunter2" not in status.stdout + world.run("status", "--json").stdout


def test_status_leaves_no_stop_mark(world: World) -> None:
    # Only a stop holds back the daemons still starting: asking how the
    # daemon is must not keep one a client is starting from serving.
    world.runtime.mkdir(mode=0o700)
    assert world.run("status").returncode == 3
    assert not (world.runtime / stopmark.MARK_NAME).exists()


def test_status_names_a_pid_as_the_lock_holder_only_while_it_holds_the_lock(
    world: World,
) -> None:
    """A daemon killed with -9 leaves its pid in the lock file, and the number
    may be given to another process: only the lock's real holder is named."""
    world.runtime.mkdir(mode=0o700)
    lock = world.runtime / "streamd.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys\n"
         f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
         "print('locked', flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        status = world.run("status", "--json")
        assert status.returncode == 1
        assert json.loads(status.stdout)["lock_holder"] == holder.pid
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    # The same file naming a live process that holds no lock (this test's own,
    # as a pid given anew would be): no daemon, nobody holds the lock.
    lock.write_text(f"{os.getpid()}\n")
    status = world.run("status")
    assert status.returncode == 3, status.stdout + status.stderr
    assert "not running" in status.stdout and str(os.getpid()) not in status.stdout


def test_a_stop_with_no_daemon_serving_yet_holds_back_those_starting(world: World) -> None:
    # Racing clients' daemons may all be starting (importing) when the stop
    # comes, none serving: the stop itself leaves the mark.
    spawned = {stopmark.SPAWNED_AT_ENV: f"{stopmark.now():.6f}"}
    world.runtime.mkdir(mode=0o700)
    stop = world.run("stop")
    assert stop.returncode == 0 and "not running" in stop.stdout
    late = world.run("daemon", env=spawned)
    assert late.returncode == 1 and "not starting" in late.stderr
    assert world.run("status").returncode == 3


def test_a_retired_daemon_stopped_leaves_its_successor_serving(world: World) -> None:
    # Stopping the old daemon after its retirement (a signal, as a service
    # manager sends) says nothing of the directory, which its successor has.
    old = world.start_daemon()
    with world.connect() as held:
        held.result("streamd/hello", client_version="0")
        with world.connect() as retiring:
            assert retiring.result("streamd/retire") == {}
        spawned = {stopmark.SPAWNED_AT_ENV: f"{stopmark.now():.6f}"}
        old.send_signal(signal.SIGTERM)
        assert old.wait(timeout=10) == 0
    new = world.start_daemon(env=spawned)
    assert world.daemon_pid() == new.pid


def test_retire_hands_over_the_name_at_once_and_serves_its_clients_to_their_end(
    world: World,
) -> None:
    old = world.start_daemon()
    with world.connect() as held:
        held.send(world.initialize(1))
        assert "result" in held.frame()
        with world.connect() as retiring:
            assert retiring.result("streamd/retire") == {}
            # Released before the answer: the asker may start a successor now.
            assert not world.socket.exists()
        new = world.start_daemon()
        assert world.daemon_pid() == new.pid
        held.send(req(2, "recall/health", deadline=FAR_DEADLINE))
        assert held.frame()["result"]["status"] == "healthy"
        assert old.poll() is None
    assert old.wait(timeout=10) == 0
    # The old daemon left its successor's socket alone.
    assert world.daemon_pid() == new.pid


def test_the_control_methods_are_not_served_on_stdio(world: World) -> None:
    done = subprocess.run(world.argv(), input=req(1, "streamd/hello", client_version="0"),
                          env=world.env, capture_output=True, timeout=60)
    assert done.returncode == 0
    reply = json.loads(done.stdout)
    assert reply["error"]["code"] == -32601


def test_the_daemon_logs_to_its_rotated_file_under_the_state_dir(world: World) -> None:
    proc = world.start_daemon("--idle-exit", "0")
    text = wait_for(lambda: world.log.exists() and world.log.read_text(), 10, "the log")
    assert f" {proc.pid} INFO streamd.resident: streamd daemon {streamd.__version__} started" \
        in text
    assert "idle exit never" in text
    assert stat.S_IMODE(os.stat(world.state / "streamd").st_mode) == 0o700


def test_daemon_options_are_checked_before_anything_starts(world: World) -> None:
    bad = world.run("daemon", "--max-sources", "0")
    assert bad.returncode == 2 and "--max-sources" in bad.stderr
    bad = world.run("daemon", "--idle-exit", "-1")
    assert bad.returncode == 2 and "--idle-exit" in bad.stderr
    assert not world.runtime.exists()
    assert sys.executable  # the same interpreter ran them


def test_recall_sources_stay_open_after_their_connection_until_source_idle(
    world: World,
) -> None:
    world.start_daemon("--source-idle", "1", "--max-sources", "2")
    with world.connect() as conn:
        conn.send(world.initialize(1))
        assert "result" in conn.frame()
        conn.send(req(2, "recall/shutdown"))
        assert conn.frame()["result"] == {}
    with world.connect() as conn:
        # The source outlives the connection that opened it...
        assert conn.result("streamd/status")["sources"] == 1
        # ...until no connection has held it for --source-idle.
        wait_for(lambda: conn.result("streamd/status")["sources"] == 0, 20,
                 "the idle source to close")


def test_a_file_in_the_sockets_place_is_refused_and_left_alone(world: World) -> None:
    world.runtime.mkdir(mode=0o700)
    world.socket.write_text("not a socket")
    daemon = world.run("daemon")
    assert daemon.returncode == 1
    assert daemon.stderr.strip() == f"streamd daemon: {world.socket} exists and is not a socket"
    assert world.socket.read_text() == "not a socket"
    # The refusal let go of the lock: a daemon can start once the file is gone.
    world.socket.unlink()
    world.start_daemon()


def test_the_event_log_is_served_and_shared_by_every_connection(world: World) -> None:
    world.start_daemon()
    event = {"app": "app", "user": "u", "session": "s",
             "event": {"id": "e1", "author": "agent", "content": "hello"}}
    with world.connect() as a, world.connect() as b:
        assert a.result("eventlog/append", **event)["duplicate"] is False
        page = b.result("eventlog/since", from_seq=0)
        assert [e["event"]["id"] for e in page["entries"]] == ["e1"]
    assert (world.state / "streamd" / "events.db").exists()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_status_shows_a_connect_the_server_never_answers_and_never_the_password(
    world: World, scheme: str,
) -> None:
    # No attempt has failed yet (none ends, with connect_timeout=0), so no
    # db_fault: before, status showed a healthy daemon while every event-log
    # call waited.
    pytest.importorskip("psycopg" if scheme == "postgresql" else "MySQLdb")
    from support.black_hole import BlackHole

    with BlackHole() as hole:
        db = f"{scheme}://agent:hunter2@127.0.0.1:{hole.port}/events?connect_timeout=0"
        world.start_daemon(env={"STREAMD_DB": db})
        with world.connect() as conn:
            conn.send(req(1, "eventlog/ping"))
            assert hole.wait_held_blocking(1)
            status = conn.result("streamd/status")
            assert status["db_fault"] is None
            # Its presence and shape: how long is the machine's business.
            assert isinstance(status["db_connecting_s"], float | int)
            assert status["db_connecting_s"] >= 0
            text = world.run("status")
            assert text.returncode == 0, text.stderr
            assert f"connecting to {scheme}://agent@127.0.0.1:{hole.port}/events" in text.stdout
            assert "hunter2" not in text.stdout + world.run("status", "--json").stdout


@pytest.mark.parametrize("backend", ["postgres", "mysql"])
def test_status_shows_a_reconnect_the_server_never_answers_and_never_the_password(
    world: World, backend: str, request: pytest.FixtureRequest,
) -> None:
    # The daemon reached its server, then lost its connections, and the
    # server left their reconnects unanswered: no attempt failed, and the
    # connect under way was a connection's own. Before: status showed a
    # healthy daemon (db_connecting_s null, no fault) and had no word for an
    # outage. The password holds what a URL escapes, and is written escaped.
    import tempfile
    import threading
    from pathlib import Path
    from urllib.parse import quote

    from support.black_hole import Proxy

    secret = "p@ss?w#rd%&"
    escaped = quote(secret, safe="")
    with tempfile.TemporaryDirectory(prefix="bh") as short:  # a socket path fits 108 bytes
        if backend == "postgres":
            pytest.importorskip("psycopg")
            from psycopg.conninfo import conninfo_to_dict
            from support import pg_cluster

            cluster = request.getfixturevalue("postgres_cluster")
            name = conninfo_to_dict(request.getfixturevalue("postgres_db"))["dbname"]
            upstream = cluster.socket_dir / f".s.PGSQL.{pg_cluster.PORT}"
            proxied = Path(short) / upstream.name
            db = (f"postgresql://{pg_cluster.SUPERUSER}:{escaped}@/{name}?host={short}"
                  f"&port={pg_cluster.PORT}&connect_timeout=0")
        else:
            pytest.importorskip("MySQLdb")
            server = request.getfixturevalue("mysql_server")
            name = request.getfixturevalue("mysql_db").split("/")[3].split("?")[0]
            server.sql(f"CREATE USER IF NOT EXISTS 'streamd_esc'@'localhost' IDENTIFIED BY"
                       f" '{secret}'")
            server.sql("GRANT ALL ON *.* TO 'streamd_esc'@'localhost'")
            upstream, proxied = server.socket, Path(short) / "mysqld.sock"
            db = f"mysql://streamd_esc:{escaped}@/{name}?unix_socket={proxied}&connect_timeout=0"
        stuck = threading.Event()

        def ping_until_answered_no_more() -> None:
            # The first ping may meet the broken connection; a later one
            # reconnects, and waits until the proxy lets its connect go.
            try:
                with world.connect() as pinger:
                    while "cannot connect" not in json.dumps(pinger.call("eventlog/ping")):
                        pass
            except (OSError, AssertionError):
                pass  # the daemon gone first
            finally:
                stuck.set()

        with Proxy(upstream, proxied) as proxy:
            world.start_daemon(env={"STREAMD_DB": db})
            with world.connect() as conn:
                assert "result" in conn.call("eventlog/ping")
            proxy.hold_new()
            proxy.cut_forwarded()
            pinger = threading.Thread(target=ping_until_answered_no_more, daemon=True)
            pinger.start()
            assert proxy.wait_held_blocking(1)
            with world.connect() as conn:
                status = conn.result("streamd/status")
            waited = status["db_connecting_s"]
            assert isinstance(waited, float | int) and waited >= 0
            lost = status["db_reconnecting_s"]
            assert isinstance(lost, float | int) and lost >= waited
            assert status["db_fault"] is None
            text = world.run("status")
            assert text.returncode == 0, text.stderr
            assert f"reconnecting to {status['db']} for " in text.stdout
            assert "an attempt unanswered for" in text.stdout
            shown = text.stdout + world.run("status", "--json").stdout
        assert stuck.wait(30)  # the proxy gone, the attempt failed
        pinger.join(30)
    shown += world.log.read_text() if world.log.exists() else ""
    for form in (secret, escaped, quote(secret)):
        assert form not in shown
