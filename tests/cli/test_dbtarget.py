"""A database string that is not a path never becomes a file, and a secret in
one never shows: the real processes, as a person runs them.

Each refusal is checked for its exit code, its one line, and that nothing was
created in the working directory. The leak checks run every path that
describes the database (``log ping``, the daemon's ``event log at`` line,
``streamd/status``, ``streamd status``) with a secret-bearing ``STREAMD_DB``,
against a live server where one is needed and against none (a failed
connection must not show the secret either).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from support.resident import World, make_world, wait_for

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog import DbTargetError, EventLog

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
S = "s3cr3tPW"
SERVED = ("a postgresql:// URL, a postgres:// URL, a mysql:// URL, a mariadb:// URL, a libpq"
          " connection string, or a file path (SQLite)")


def streamd(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    base = {k: v for k, v in os.environ.items() if k != "STREAMD_DB"}
    done = subprocess.run(
        [sys.executable, "-m", "streamd", *args], cwd=cwd, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60,
        env={**base, "PYTHONPATH": str(REPO / "src"), "HOME": str(cwd),
             "XDG_STATE_HOME": str(cwd / "state"), **(env or {})},
    )
    return done.returncode, done.stdout, done.stderr


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if "compiled indexing core" not in ln]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "cwd"
    path.mkdir()
    return path


APPEND = ("log", "append", "--app", "a", "--user", "u", "--session", "s", "--author", "me",
          "--text", "hi")

REFUSED = [
    ("", f"event log database '': empty; give {SERVED}"),
    ("mysql://root@localhost/",
     "event log database mysql://…: not a usable MySQL URL: name one database as the path"
     " (mysql://user@host/DATABASE)"),
    ("mariadb://root@localhost/x?ssl=1",
     "event log database mariadb://…: not a usable MySQL URL: 'ssl' is not a key this URL"
     " takes (it takes unix_socket, read_default_file, read_default_group, connect_timeout;"
     " a password goes in MYSQL_PWD or an option file)"),
    ("http://example.com/x.db", f"event log database http://…: http:// is not served; give"
     f" {SERVED}"),
    ("sqlite:///x.db", "event log database sqlite://…: a SQLite file is given as its plain"
     " path, not a URL"),
    ("host=localhost dbname=events usr=agent", "event log database host=…: not a valid libpq"
     " connection string: \"usr\" is not a libpq keyword (a file whose name holds \"=\" is"
     " named as ./NAME)"),
]


@pytest.mark.parametrize(("db", "message"), REFUSED)
def test_a_db_flag_that_names_nothing_served_is_a_usage_error_and_creates_nothing(
    db: str, message: str, cwd: Path,
) -> None:
    for argv in (["log", "ping", "--db", db], ["--db", db, *APPEND], ["serve", "--db", db],
                 ["daemon", "--db", db]):
        code, out, err = streamd(*argv, cwd=cwd)
        assert (code, out) == (2, ""), (argv, err)
        assert one_line(err) == f"streamd: --db: {message}", argv
        assert list(cwd.iterdir()) == [], argv


@pytest.mark.parametrize(("db", "message"), [r for r in REFUSED if r[0]])
def test_streamd_db_that_names_nothing_served_is_a_usage_error_and_creates_nothing(
    db: str, message: str, cwd: Path,
) -> None:
    code, out, err = streamd(*APPEND, cwd=cwd, env={"STREAMD_DB": db})
    assert (code, out) == (2, "")
    assert one_line(err) == f"streamd: STREAMD_DB: {message}"
    assert list(cwd.iterdir()) == []


def test_a_missing_directory_is_refused_not_created(cwd: Path) -> None:
    for argv, env, setting in ((["log", "ping", "--db", "typo/x.db"], {}, "--db"),
                               ([*APPEND, "--db", "typo/x.db"], {}, "--db"),
                               (list(APPEND), {"STREAMD_DB": "typo/x.db"}, "STREAMD_DB"),
                               (["serve", "--db", "typo/x.db"], {}, "--db")):
        code, out, err = streamd(*argv, cwd=cwd, env=env)
        assert (code, out) == (2, ""), (argv, err)
        assert one_line(err) == (f"streamd: {setting}: event log database typo/x.db: directory"
                                 " typo does not exist (create it first: only the default"
                                 " location is created)"), argv
        assert list(cwd.iterdir()) == [], argv


def test_a_database_path_that_is_not_utf8_is_refused_naming_the_byte(cwd: Path) -> None:
    # "\udcff" is how Python hands over an argv or environment byte 0xff;
    # subprocess encodes it back. SQLite names files in UTF-8: such a path
    # ended in a traceback (the stdio server's answer too), after an empty
    # file had been made at it.
    bad = "b\udcffd.db"
    said = "event log database b\\xffd.db: not UTF-8 (byte 0xff at character 2)"
    for argv, env, setting in ((["log", "ping", "--db", bad], {}, "--db: "),
                               ([*APPEND, "--db", bad], {}, "--db: "),
                               (["log", "backup", "--db", bad, "copy.db"], {}, "--db: "),
                               (list(APPEND), {"STREAMD_DB": bad}, "STREAMD_DB: "),
                               (["--db", bad], {}, "--db: "),
                               (["serve", "--db", bad], {}, "--db: ")):
        code, out, err = streamd(*argv, cwd=cwd, env=env)
        assert (code, out) == (2, ""), (argv, err)
        assert one_line(err).startswith(f"streamd: {setting}{said}"), (argv, err)
        assert list(cwd.iterdir()) == [], argv
    state = cwd / "st\udcffte"  # the default location, under such a directory
    code, out, err = streamd(*APPEND, cwd=cwd, env={"XDG_STATE_HOME": str(state)})
    assert (code, out) == (2, ""), err
    assert one_line(err).startswith(f"streamd: event log database {cwd}/st\\xffte/streamd/"
                                    "events.db: not UTF-8 (byte 0xff at character"), err
    assert list(cwd.iterdir()) == []
    # A server's string may hold a password: it is not shown.
    code, out, err = streamd("log", "ping", "--db", "postgresql://u@h/d?sslcert=\udcff",
                             cwd=cwd)
    assert (code, out) == (2, "") and "(a string): not UTF-8" in one_line(err), err


def test_the_default_location_is_still_created(cwd: Path) -> None:
    code, _, err = streamd(*APPEND, cwd=cwd)
    assert (code, err) == (0, ""), err
    assert (cwd / "state" / "streamd" / "events.db").is_file()


def test_a_file_named_with_an_equals_sign_stays_a_file(cwd: Path) -> None:
    code, out, err = streamd(*APPEND, "--db", "a=b.db", cwd=cwd)
    assert (code, err) == (0, ""), err
    assert (cwd / "a=b.db").is_file()
    code, out, _ = streamd("log", "ping", "--db", "a=b.db", cwd=cwd)
    assert code == 0 and out == "ok: a=b.db (latest seq 1)\n"


@pytest.mark.parametrize(("db", "description"), [
    ("host={nowhere} dbname=events user=agent", "postgresql://agent@/events?host={nowhere}"),
    ("service=events", "postgresql://?service=events"),
    ("postgresql://agent@/events?host={nowhere}", "postgresql://agent@/events?host={nowhere}"),
])
def test_a_libpq_string_selects_postgresql_never_a_file(
    db: str, description: str, cwd: Path, tmp_path: Path,
) -> None:
    nowhere = tmp_path / "no-server"
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[events]\nhost={nowhere}\ndbname=events\n")
    env = {"STREAMD_DB": db.format(nowhere=nowhere), "PGSERVICEFILE": str(services)}
    code, out, err = streamd(*APPEND, cwd=cwd, env=env)
    assert (code, out) == (2, "")
    assert err.startswith("streamd: cannot connect to the event log's PostgreSQL database"
                          f" {description.format(nowhere=nowhere)}: "), err
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(("db", "message"), [
    (f"postgresql://u:{S}@/x?host=/nowhere", "--db holds a password (password), which every"
     " user of this machine can read in the process list; give it the libpq way: PGPASSWORD,"
     " ~/.pgpass (or PGPASSFILE), or a service file (PGSERVICEFILE), or put the database in"
     " STREAMD_DB"),
    ("mysql://root@localhost/", f"--db: {REFUSED[1][1]}"),
    (f"mysql://root:{S}@localhost/x", "--db holds a password (password), which every user of"
     " this machine can read in the process list; give it the MySQL way: MYSQL_PWD, or an"
     " option file (~/.my.cnf, or ?read_default_file=PATH), or put the database in STREAMD_DB"),
])
def test_attach_refuses_the_daemon_a_db_before_starting_one(
    db: str, message: str, cwd: Path, tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    for argv in (["attach", "--", "--db", db], ["attach", "--", f"--db={db}"]):
        code, out, err = streamd(*argv, cwd=cwd, env={"STREAMD_RUNTIME_DIR": str(run)})
        assert (code, out) == (2, ""), err
        assert one_line(err) == f"streamd: {message}"
        assert not run.exists() and list(cwd.iterdir()) == []


# --- the Python API --------------------------------------------------------------------


def test_the_python_api_refuses_the_same_strings(tmp_path: Path) -> None:
    with pytest.raises(DbTargetError) as info:
        EventLog("mysql://root@localhost/")
    assert str(info.value) == ("event log database mysql://…: not a usable MySQL URL: name one"
                               " database as the path (mysql://user@host/DATABASE)")
    with pytest.raises(DbTargetError):
        EventLog("")
    assert isinstance(info.value, ValueError)


async def test_the_python_api_refuses_a_missing_directory_at_first_use(tmp_path: Path) -> None:
    db = tmp_path / "typo" / "x.db"
    with trio.fail_after(20):
        async with EventLog(db) as log:
            with pytest.raises(RpcError) as info:
                await log.ping()
    assert info.value.code == SOURCE_UNAVAILABLE
    assert info.value.message == (f"event log database {db}: directory {db.parent} does not"
                                  " exist (create it first: only the default location is"
                                  " created)")
    assert list(tmp_path.iterdir()) == []


async def test_the_python_api_refuses_a_secret_in_its_argument_and_names_none(
    tmp_path: Path,
) -> None:
    # An argument is as often as not a command line's (a script's --db).
    with trio.fail_after(20):
        async with EventLog(f"host={tmp_path} dbname=x sslpassword='{S} x'") as log:
            assert log.where == f"postgresql:///x?host={tmp_path}"
            with pytest.raises(RpcError) as info:
                await log.ping()
    assert info.value.code == SOURCE_UNAVAILABLE
    assert info.value.message.startswith(
        "the database given holds a password (sslpassword), which every user of this machine"
        " can read in the process list; "
    )
    assert S not in info.value.message and list(tmp_path.iterdir()) == []


def test_a_client_refuses_a_password_in_its_daemon_args_before_starting_anything(
    tmp_path: Path,
) -> None:
    from streamd.client.sync import Client

    with pytest.raises(RpcError) as info:
        Client.spawn(["--db", f"postgresql://u:{S}@/x?host=/nowhere"])
    assert "--db holds a password (password)" in info.value.message
    assert S not in info.value.message
    with pytest.raises(RpcError) as info:
        Client.connect(str(tmp_path / "run"), daemon_args=[f"--db=host=/x sslpassword={S}"])
    assert "--db holds a password (sslpassword)" in info.value.message
    assert not (tmp_path / "run").exists()


# --- secrets never show ----------------------------------------------------------------

# Each libpq spelling of a secret, for a database at {host} (a socket
# directory) named {db}: (the string, what log ping says it is).
SPELLINGS = [
    ("postgresql://streamd:ab?cd{S}@/{db}?host={host}", "postgresql://streamd@/{db}?host={host}"),
    ("postgresql://streamd:ab#cd%40{S}%3F@/{db}?host={host}",
     "postgresql://streamd@/{db}?host={host}"),
    ("postgres://streamd@/{db}?host={host}&password={S}", "postgresql://streamd@/{db}?host={host}"),
    ("postgresql://streamd@/{db}?sslpassword={S}&host={host}",
     "postgresql://streamd@/{db}?host={host}"),
    ("host={host} user=streamd dbname={db} password={S}", "postgresql://streamd@/{db}?host={host}"),
    ("host={host} user=streamd dbname={db} password='{S} with \\'quotes\\' and spaces'",
     "postgresql://streamd@/{db}?host={host}"),
    ("host={host} user=streamd dbname={db} sslpassword='{S} x'",
     "postgresql://streamd@/{db}?host={host}"),
]


def _spelled(spelling: str, host: Path | str, db: str) -> str:
    return spelling.replace("{S}", S).replace("{host}", str(host)).replace("{db}", db)


@pytest.mark.parametrize(("spelling", "description"), SPELLINGS)
def test_a_failed_connection_shows_no_secret(
    spelling: str, description: str, cwd: Path, tmp_path: Path,
) -> None:
    host = tmp_path / "no-server"
    env = {"STREAMD_DB": _spelled(spelling, host, "events")}
    code, out, err = streamd("log", "ping", cwd=cwd, env=env)
    assert (code, out) == (2, "")
    # One line: libpq's hint line is joined to its message.
    assert one_line(err).startswith("streamd: cannot connect to the event log's PostgreSQL"
                                    f" database {_spelled(description, host, 'events')}: "), err
    assert S not in err
    assert list(cwd.iterdir()) == []


@pytest.fixture
def live(postgres_cluster: Any, postgres_db: str) -> tuple[Path, str]:
    """The socket directory and the name of a fresh database on a live server
    (which trusts its socket, so the passwords given are not checked)."""
    return postgres_cluster.socket_dir, psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"]


@pytest.mark.parametrize(("spelling", "description"), SPELLINGS)
def test_log_ping_on_a_live_server_shows_no_secret(
    spelling: str, description: str, live: tuple[Path, str], cwd: Path,
) -> None:
    host, db = live
    # The cluster's socket is .s.PGSQL.5432, libpq's default: no port needed.
    env = {"STREAMD_DB": _spelled(spelling, host, db)}
    code, out, err = streamd("log", "ping", cwd=cwd, env=env)
    assert (code, err) == (0, ""), err
    assert out == f"ok: {_spelled(description, host, db)} (latest seq 0)\n"
    assert S not in out


@pytest.fixture
def world() -> Iterator[World]:
    yield from make_world()


def test_the_daemon_status_and_log_show_no_secret(
    world: World, live: tuple[Path, str],
) -> None:
    host, db = live
    spelling, description = SPELLINGS[0]
    world.env["STREAMD_DB"] = _spelled(spelling, host, db)
    shown = _spelled(description, host, db)
    proc = world.start_daemon("-v")  # the "event log at" line is at INFO
    try:
        with world.connect(timeout=30) as conn:
            assert conn.result("eventlog/ping") == {}
            status = conn.result("streamd/status")
        assert status["db"] == shown
        people = world.run("status")
        machine = world.run("status", "--json")
        assert people.returncode == 0 and f"event log    {shown}" in people.stdout
        assert json.loads(machine.stdout)["db"] == shown
        wait_for(lambda: world.log.exists() and f"event log at {shown}" in world.log.read_text(),
                 20, "the daemon's event log line")
        ps = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        for text in (json.dumps(status), people.stdout + people.stderr,
                     machine.stdout + machine.stderr, world.log.read_text(), ps.decode()):
            assert S not in text
    finally:
        world.run("stop")
        proc.wait(timeout=20)


def test_the_daemon_answers_a_failed_connection_without_the_secret(world: World) -> None:
    nowhere = world.root / "no-server"
    world.env["STREAMD_DB"] = f"postgresql://u:ab?cd{S}@/events?host={nowhere}"
    proc = world.start_daemon()
    try:
        with world.connect(timeout=30) as conn:
            reply = conn.call("eventlog/ping")
            status = conn.result("streamd/status")
        assert reply["error"]["code"] == SOURCE_UNAVAILABLE
        assert reply["error"]["message"].startswith(
            f"cannot connect to the event log's PostgreSQL database postgresql://u@/events?host="
            f"{nowhere}: "
        )
        assert status["db"] == f"postgresql://u@/events?host={nowhere}"
        for text in (json.dumps(reply), json.dumps(status), world.log.read_text()):
            assert S not in text
    finally:
        world.run("stop")
        proc.wait(timeout=20)
