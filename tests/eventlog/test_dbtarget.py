"""What a ``--db`` / ``STREAMD_DB`` string names, and that no spelling of a
secret ever reaches its description.

The expected descriptions are written out by hand from libpq's documented
grammar; the pure parser is checked against libpq itself (psycopg's
``PQconninfoParse``) case by case and on generated strings, and every
description is checked to be a connection string libpq reads as the same
connection minus its secrets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamd.eventlog import dbtarget
from streamd.eventlog.dbtarget import DbTargetError, classify
from streamd.eventlog.postgres import conninfo

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
S = "s3cr3tPW"  # every secret below holds these bytes, so one check finds any part

# (the string, its description, the secret keywords it carries)
SECRET_SPELLINGS = [
    # URL userinfo: libpq reads the password up to the first "@" (before any
    # "/"), so "?" and "#" are part of it, and %-escapes are decoded.
    (f"postgresql://u:ab?cd{S}@/db?host=/tmp", "postgresql://u@/db?host=/tmp", ("password",)),
    (f"postgresql://u:ab#cd{S}@h/db", "postgresql://u@h/db", ("password",)),
    (f"postgresql://u:a%40b{S}%23@h:5433/db", "postgresql://u@h:5433/db", ("password",)),
    (f"postgres://u:{S}?x=1#y@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require",
     ("password",)),
    (f"postgresql://u:{S}%2F%3F@[::1]:5432/db", "postgresql://u@/db?host=::1&port=5432",
     ("password",)),
    (f"postgresql://:{S}@h/db", "postgresql://h/db", ("password",)),
    # URL query parameters.
    (f"postgresql://u@h/db?password={S}", "postgresql://u@h/db", ("password",)),
    (f"postgresql://u@h/db?password={S}%26x%3D1&sslmode=require",
     "postgresql://u@h/db?sslmode=require", ("password",)),
    (f"postgresql://u@h/db?sslpassword={S}&sslkey=/k.pem", "postgresql://u@h/db?sslkey=/k.pem",
     ("sslpassword",)),
    (f"postgresql://u:{S}1@h/db?sslpassword={S}2", "postgresql://u@h/db",
     ("password", "sslpassword")),
    (f"postgresql:///db?host=/tmp&oauth_client_secret={S}&oauth_client_id=c",
     "postgresql:///db?host=/tmp&oauth_client_id=c", ("oauth_client_secret",)),
    # keyword/value strings: bare, quoted with spaces, escaped quotes and backslashes.
    (f"host=/tmp dbname=ev password={S}", "postgresql:///ev?host=/tmp", ("password",)),
    (f"host=/tmp password = '{S} with spaces'", "postgresql://?host=/tmp", ("password",)),
    (f"host=/tmp password='it\\'s {S}\\\\'", "postgresql://?host=/tmp", ("password",)),
    (f"host=/tmp password={S}\\ and\\'more", "postgresql://?host=/tmp", ("password",)),
    (f"sslpassword={S} host=db.example user=agent", "postgresql://agent@db.example",
     ("sslpassword",)),
    (f"host=/tmp sslpassword='{S} x' password={S}", "postgresql://?host=/tmp",
     ("password", "sslpassword")),
    (f"dbname=ev\tpassword={S}\nhost=h", "postgresql://h/ev", ("password",)),
    (f"host=h scram_client_key={S}a scram_server_key={S}b", "postgresql://h",
     ("scram_client_key", "scram_server_key")),
    (f"host=h oauth_client_secret='{S}'", "postgresql://h", ("oauth_client_secret",)),
]

NO_SECRET = [
    ("host=localhost dbname=events user=agent", "postgresql://agent@localhost/events"),
    ("service=events", "postgresql://?service=events"),
    ("postgresql://", "postgresql://"),
    ("postgresql://streamd@/x?host=/s&port=5433", "postgresql://streamd@/x?host=/s&port=5433"),
    ("postgresql://h1:1,h2:2/d", "postgresql:///d?host=h1,h2&port=1,2"),
    ("postgresql://h/d?application_name=a%20b&ssl=true",
     "postgresql://h/d?application_name=a%20b&sslmode=require"),
    ("host=/tmp requiressl=1", "postgresql://?host=/tmp&sslmode=require"),
    ("user='a b' dbname=x%y host=h", "postgresql://a%20b@h/x%25y"),
]

FILES = [
    "events.db", "a=b.db", "dir/a=b.db", "./host=x.db", "notes:2024.db", "my notes=1.db",
    "weird name.db", "-dash.db",
]

REFUSED = [
    ("", "event log database '': empty; give a postgresql:// URL, a postgres:// URL, a"
     " mysql:// URL, a mariadb:// URL, a libpq connection string, or a file path (SQLite)"),
    ("   ", "event log database '   ': empty; give a postgresql:// URL, a postgres:// URL, a"
     " mysql:// URL, a mariadb:// URL, a libpq connection string, or a file path (SQLite)"),
    (f"mysql://root:{S}@localhost/", "event log database mysql://…: not a usable MySQL URL:"
     " name one database as the path (mysql://user@host/DATABASE)"),
    (f"mariadb://root:{S}@localhost/x?password={S}", "event log database mariadb://…: not a"
     " usable MySQL URL: 'password' is not a key this URL takes (it takes unix_socket,"
     " read_default_file, read_default_group, connect_timeout; a password goes in MYSQL_PWD"
     " or an option file)"),
    (f"mysql://root:{S}@h/x#frag", "event log database mysql://…: not a usable MySQL URL: a"
     " MySQL URL has no #fragment (a # in a password is written %23)"),
    (f"mysql://root:{S}@h:port/x", "event log database mysql://…: not a usable MySQL URL: not"
     " a valid URL (a bad host or port)"),
    (f"mysql://root:{S}@h/x?connect_timeout=soon", "event log database mysql://…: not a usable"
     " MySQL URL: connect_timeout is a whole number of seconds"),
    (f"MySQL://root:{S}@h/x", "event log database MySQL://…: a mysql URL starts with mysql://"
     " in lower case"),
    (f"http://u:{S}@x/y", "event log database http://…: http:// is not served; give a"
     " postgresql:// URL, a postgres:// URL, a mysql:// URL, a mariadb:// URL, a libpq"
     " connection string, or a file path (SQLite)"),
    ("sqlite:///x.db", "event log database sqlite://…: a SQLite file is given as its plain"
     " path, not a URL"),
    ("file:x.db", "event log database file:…: a SQLite file is given as its plain path, not a"
     " URL"),
    (f"POSTGRESQL://u:{S}@h/d", "event log database POSTGRESQL://…: a postgresql URL starts"
     " with postgresql:// in lower case"),
    ("postgres:/db", "event log database postgres:…: a postgres URL starts with postgres://"
     " in lower case"),
    (f"host=h usr=agent password={S}", "event log database host=…: not a valid libpq"
     " connection string: \"usr\" is not a libpq keyword (a file whose name holds \"=\" is"
     " named as ./NAME)"),
    (f"host=h password='{S}", "event log database host=…: not a valid libpq connection"
     " string: a quoted value is not closed"),
    (f"host=h {S}", "event log database host=…: not a valid libpq connection string: a word"
     " is missing its \"=\" (keyword=value)"),
    # libpq would take the host to be "b@h" (or the port "ab", the database
    # "cd@h/db"), showing the rest of the password: refused instead.
    (f"postgresql://u:a@b{S}@h/db", "event log database postgresql://…: not a valid libpq URL:"
     " an \"@\" follows the user name and password: write an \"@\" inside either as %40"),
    (f"postgresql://u:ab/cd{S}@h/db", "event log database postgresql://…: not a valid libpq"
     " URL: the database name holds an \"@\": write \"@\" and \"/\" in a user name, password"
     " or database name as %40 and %2F"),
    (f"dbname=postgresql://u:{S}@h/d", "event log database dbname=…: not a valid libpq"
     " connection string: its dbname is itself a connection string; give that string itself"),
    (f"postgresql://u:{S}@h/d?nosuch=1", "event log database postgresql://…: not a valid"
     " libpq URL: \"nosuch\" is not a libpq keyword"),
    (f"postgresql://u:{S}%zz@h/d", "event log database postgresql://…: not a valid libpq URL:"
     " a %-escape is not two hexadecimal digits"),
    (f"postgresql://u:{S}@h/d?password", "event log database postgresql://…: not a valid"
     " libpq URL: a query parameter has no \"=\""),
]


# --- secrets ------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "description", "keys"), SECRET_SPELLINGS)
def test_every_spelling_of_a_secret_is_found_and_never_described(
    value: str, description: str, keys: tuple[str, ...],
) -> None:
    target = classify(value, origin="environment")
    assert target.kind == "postgres" and target.conninfo == value
    assert target.description == description
    assert target.secret_keys == keys
    assert all(S in secret for secret in target.secrets)
    for shown in (target.description, str(target), repr(target)):
        assert S not in shown


@pytest.mark.parametrize(("value", "description", "keys"), SECRET_SPELLINGS)
def test_a_secret_on_the_command_line_is_refused_naming_the_keyword_only(
    value: str, description: str, keys: tuple[str, ...],
) -> None:
    message = dbtarget.command_line_error(value)
    assert message == (
        f"--db holds a password ({', '.join(keys)}), which every user of this machine can"
        " read in the process list; give it the libpq way: PGPASSWORD, ~/.pgpass (or"
        " PGPASSFILE), or a service file (PGSERVICEFILE), or put the database in STREAMD_DB"
    )
    assert S not in message


@pytest.mark.parametrize("value", [v for v, _, _ in SECRET_SPELLINGS] + [v for v, _ in NO_SECRET])
def test_the_pure_parser_reads_each_string_as_libpq_does(value: str) -> None:
    pure, libpq = conninfo.parse_pure(value), conninfo.parse_libpq(value)
    assert libpq is not None  # psycopg is part of the test install
    assert dict(pure.values) == dict(libpq.values)
    assert pure.secret_keys == libpq.secret_keys and pure.hidden == libpq.hidden


@pytest.mark.parametrize("value", [v for v, _, _ in SECRET_SPELLINGS] + [v for v, _ in NO_SECRET])
def test_a_description_is_the_same_connection_without_its_secrets(value: str) -> None:
    target = classify(value)
    full = conninfo.parse_libpq(value)
    again = conninfo.parse_libpq(target.description)
    assert full is not None and again is not None
    assert dict(again.values) == full.shown


_PIECES = st.sampled_from([
    *"ab:@/?#&=%,[]' \\\t", "%40", "%2F", "%00", "%zz", "%ff", "host", "password", "user",
    "dbname", "sslpassword", "ssl", "true", "requiressl", "1", "é",
])


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["postgresql://", "postgres://", "", "host=", "password='"]),
       st.lists(_PIECES, max_size=14))
def test_the_pure_parser_never_reads_a_string_otherwise_than_libpq(
    prefix: str, pieces: list[str],
) -> None:
    # It may refuse more (what would mislead), never read differently.
    value = prefix + "".join(pieces)
    try:
        pure = dict(conninfo.parse_pure(value).values)
    except conninfo.ConninfoError:
        return
    libpq = conninfo.parse_libpq(value)
    assert libpq is not None and dict(libpq.values) == pure


def test_without_psycopg_the_same_strings_are_read_and_described_alike() -> None:
    # The SQLite-only install has no psycopg: the pure parser answers alone.
    script = (
        "import sys, json; sys.modules['psycopg'] = None\n"
        "from streamd.eventlog.dbtarget import classify\n"
        "values = json.loads(sys.stdin.read())\n"
        "print(json.dumps([[classify(v).description, list(classify(v).secret_keys)]"
        " for v in values]))\n"
    )
    import json

    values = [v for v, _, _ in SECRET_SPELLINGS]
    done = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(values), capture_output=True,
        text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[d, list(k)] for _, d, k in SECRET_SPELLINGS]


# --- what is PostgreSQL, what is a file, what is refused -----------------------------


@pytest.mark.parametrize(("value", "description"), NO_SECRET)
def test_a_libpq_string_or_url_selects_postgresql(value: str, description: str) -> None:
    target = classify(value)
    assert (target.kind, target.description, target.secret_keys) == (
        "postgres", description, ()
    )
    assert target.path is None and dbtarget.command_line_error(value) is None


@pytest.mark.parametrize("value", FILES)
def test_a_string_that_is_not_all_libpq_keywords_is_a_file(value: str) -> None:
    target = classify(value)
    assert (target.kind, target.path, target.description) == ("sqlite", Path(value), value)


def test_a_path_object_is_always_a_file() -> None:
    target = classify(Path("host=x"))
    assert (target.kind, target.path) == ("sqlite", Path("host=x"))


@pytest.mark.parametrize(("value", "message"), REFUSED)
def test_a_string_that_names_nothing_served_is_refused_with_its_cause(
    value: str, message: str,
) -> None:
    with pytest.raises(DbTargetError) as info:
        classify(value)
    assert str(info.value) == message and S not in message
    assert dbtarget.command_line_error(value) == f"--db: {message}"
    if value:  # an empty variable is an unset one, as in the shell
        assert dbtarget.usage_error(None, {"STREAMD_DB": value}) == f"STREAMD_DB: {message}"


def test_every_dialect_is_one_entry_and_each_is_served() -> None:
    assert [(d.kind, d.schemes, d.served) for d in dbtarget.DIALECTS] == [
        ("postgres", ("postgresql", "postgres"), True),
        ("mysql", ("mysql", "mariadb"), True),
    ]


MYSQL = [
    (f"mysql://agent:{S}@db.example:3307/events", "mysql://agent@db.example:3307/events"),
    (f"mariadb://a%40b:{S}%3F%23@/ev?unix_socket=/run/my.sock",
     "mariadb://a%40b@/ev?unix_socket=/run/my.sock"),
    ("mysql://agent@localhost/events?read_default_file=~/.ev.cnf&read_default_group=ev",
     "mysql://agent@localhost/events?read_default_file=~/.ev.cnf&read_default_group=ev"),
]


@pytest.mark.parametrize(("value", "described"), MYSQL)
def test_a_mysql_url_is_described_without_its_password(value: str, described: str) -> None:
    target = classify(value, origin="environment")
    assert (target.kind, target.description, target.conninfo) == ("mysql", described, value)
    assert S not in target.description and S not in repr(target)
    assert target.secret_keys == (("password",) if S in value else ())
    if S in value:
        refused = dbtarget.command_line_error(value)
        assert refused is not None and S not in refused and "MYSQL_PWD" in refused


# --- where the string comes from, and the directory ------------------------------------


def test_the_flag_wins_then_the_environment_then_the_default() -> None:
    env = {"XDG_STATE_HOME": "/x/state", "STREAMD_DB": "host=/tmp dbname=e"}
    assert dbtarget.resolve("f.db", env).origin == "argument"
    from_env = dbtarget.resolve(None, env)
    assert (from_env.origin, from_env.kind) == ("environment", "postgres")
    default = dbtarget.resolve(None, {"XDG_STATE_HOME": "/x/state", "STREAMD_DB": ""})
    assert (default.origin, default.path) == ("default", Path("/x/state/streamd/events.db"))


def test_an_explicit_file_needs_its_directory_and_the_default_does_not(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "x.db"
    assert classify(str(missing)).file_error() == (
        f"event log database {missing}: directory {missing.parent} does not exist"
        " (create it first: only the default location is created)"
    )
    assert classify(str(tmp_path)).file_error() == (
        f"event log database {tmp_path}: is a directory; give a file path"
    )
    (tmp_path / "f").write_text("")
    under_file = tmp_path / "f" / "x.db"
    assert classify(str(under_file)).file_error() == (
        f"event log database {under_file}: directory {tmp_path / 'f'} is not a directory"
        " (create it first: only the default location is created)"
    )
    assert classify(str(tmp_path / "x.db")).file_error() is None
    (tmp_path / "x.db").write_text("")
    assert classify(str(tmp_path / "x.db")).file_error() is None  # an existing file
    default = dbtarget.resolve(None, {"XDG_STATE_HOME": str(tmp_path / "none")})
    assert default.file_error() is None
    assert sorted(tmp_path.iterdir()) == [tmp_path / "f", tmp_path / "x.db"]  # nothing made


@pytest.mark.parametrize("spelling", [["--db", "{v}"], ["--db={v}"], ["--d", "{v}"], ["--d={v}"]])
def test_a_secret_in_a_daemons_arguments_is_refused_in_every_spelling_argparse_takes(
    spelling: list[str],
) -> None:
    # The daemon's parser takes "--d" for "--db": a password given that way
    # would sit in the daemon's command line, for ps to show, all its life.
    value = f"postgresql://u:{S}@h/db"
    argv = ["--idle-exit", "60", *(part.format(v=value) for part in spelling)]
    refused = dbtarget.argv_error(argv)
    assert refused is not None and "password" in refused and S not in refused


def test_a_device_a_named_pipe_or_a_socket_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    """SQLite would fail on each with only "disk I/O error" to say."""
    import os
    import socket
    import tempfile

    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    assert classify(str(fifo)).file_error() == (
        f"event log database {fifo}: is a named pipe (FIFO), not a regular file;"
        " give a file path"
    )
    assert classify("/dev/null").file_error() == (
        "event log database /dev/null: is a character device, not a regular file;"
        " give a file path"
    )
    # A socket's path is bounded (108 bytes): made in a short directory.
    short = Path(tempfile.mkdtemp(prefix="sd"))
    sock_path = short / "s.db"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert classify(str(sock_path)).file_error() == (
            f"event log database {sock_path}: is a socket, not a regular file; give a file path"
        )
    sock_path.unlink()
    short.rmdir()
    link = tmp_path / "link.db"
    link.symlink_to("/dev/null")
    assert "is a character device" in (classify(str(link)).file_error() or "")
    (tmp_path / "real.db").write_text("")
    (tmp_path / "to-real.db").symlink_to(tmp_path / "real.db")
    assert classify(str(tmp_path / "to-real.db")).file_error() is None
