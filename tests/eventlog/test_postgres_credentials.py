"""PostgreSQL credentials never show: a password from a passfile, a service
file, a wrong password's error, a password in ``--db`` refused and in
``STREAMD_DB`` taken, none of them in errors, logs, ``status`` or ``ps``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from support.postgres_store import T0, ap

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.postgres.store import PostgresStore, describe

REPO = Path(__file__).resolve().parents[2]

# --- credentials -----------------------------------------------------------------------

SECRET = "s3cret-Pw-that-must-not-show"


@pytest.fixture
def password_db(postgres_cluster: Any) -> Iterator[str]:
    """A database owned by a role that must log in with :data:`SECRET`; its
    conninfo without the password."""
    from support import pg_cluster

    admin_info = postgres_cluster.conninfo()
    name = f"pw{os.getpid()}"
    with psycopg.connect(admin_info, autocommit=True) as admin:
        admin.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname ="
            f" '{pg_cluster.PASSWORD_ROLE}') THEN CREATE ROLE {pg_cluster.PASSWORD_ROLE}"
            f" LOGIN; END IF; END $$"
        )
        admin.execute(f"ALTER ROLE {pg_cluster.PASSWORD_ROLE} PASSWORD '{SECRET}'")
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name} OWNER {pg_cluster.PASSWORD_ROLE}")
    yield postgres_cluster.conninfo(name, user=pg_cluster.PASSWORD_ROLE)
    with psycopg.connect(admin_info, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_password_comes_from_a_passfile_and_never_shows(
    password_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(password_db)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"{params['host']}:{params['port']}:*:{params['user']}:{SECRET}\n")
    passfile.chmod(0o600)  # libpq ignores a passfile others can read
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    store = PostgresStore.open(password_db)
    store.append(ap("e1"), T0)
    store.close()
    assert SECRET not in caplog.text


def test_a_service_file_names_the_database(
    password_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(password_db)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        "[streamd-test]\n"
        + "".join(f"{k}={v}\n" for k, v in params.items())
        + f"password={SECRET}\n"
    )
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    store = PostgresStore.open("service=streamd-test")
    assert store.latest_seq(None) == 0
    assert SECRET not in store.where
    store.close()


def test_a_wrong_password_is_a_clear_error_that_names_no_password(
    password_db: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-" + SECRET
    with pytest.raises(RpcError) as info:
        PostgresStore.open(password_db + f" password={wrong}")
    text = f"{info.value.message} {info.value.data}"
    assert info.value.code == SOURCE_UNAVAILABLE
    assert "password authentication failed" in text
    assert "streamd_pw" in text  # which role, so the operator can act
    assert wrong not in text and SECRET not in text
    # Not chained to the driver's exception either, so no traceback shows it.
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert wrong not in caplog.text
    url = "postgresql://streamd_pw:" + wrong + "@/x?host=/nowhere"
    assert wrong not in describe(url)


# --- passwords: STREAMD_DB may hold one, --db may not ----------------------------------


def test_streamd_db_may_hold_a_password_for_the_log_commands(
    postgres_cluster: Any,
    postgres_db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from streamd.eventlog.cli import main as log_main

    name = psycopg.conninfo.conninfo_to_dict(postgres_db)["dbname"]
    # The cluster trusts the socket, so the password is ignored; it must still
    # never show.
    url = postgres_cluster.url(name).replace("streamd@", f"streamd:{SECRET}@")
    monkeypatch.setenv("STREAMD_DB", url)
    assert (
        log_main(
            [
                "append",
                "--app",
                "a",
                "--user",
                "u",
                "--session",
                "s",
                "--author",
                "me",
                "--text",
                "hello",
                "--id",
                "e1",
            ]
        )
        == 0
    )
    assert log_main(["since", "--app", "a"]) == 0
    assert log_main(["ping"]) == 0
    out, err = capsys.readouterr()
    assert "hello" in out
    assert SECRET not in out and SECRET not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--db", "{url}", "serve"],
        ["serve", "--db", "{url}"],
        ["daemon", "--db", "{url}"],
        ["log", "--db", "{url}", "ping"],
        ["--db", "{url}", "log", "ping"],
        ["serve", "--db", "{query_url}"],
    ],
)
def test_a_password_in_db_is_refused_as_the_command_line_is_read(
    argv: list[str],
    tmp_path: Path,
) -> None:
    url = f"postgresql://streamd:{SECRET}@/x?host=/nowhere"
    query_url = f"postgresql://streamd@/x?host=/nowhere&password={SECRET}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(tmp_path),
    }
    env.pop("STREAMD_DB", None)
    done = subprocess.run(
        [sys.executable, "-m", "streamd", *(a.format(url=url, query_url=query_url) for a in argv)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "--db holds a password" in lines[0]
    assert "process list" in lines[0] and SECRET not in done.stderr


async def test_a_password_in_the_db_url_is_refused_and_never_shown(postgres_cluster: Any) -> None:
    from streamd.eventlog.log import EventLog

    url = postgres_cluster.url("postgres").replace("streamd@", f"streamd:{SECRET}@")
    with trio.fail_after(10):
        async with EventLog(url) as log:
            assert SECRET not in log.where and "streamd@" in log.where
            with pytest.raises(RpcError) as info:
                await log.ping()
    assert info.value.code == SOURCE_UNAVAILABLE
    assert "process list" in info.value.message and SECRET not in info.value.message
