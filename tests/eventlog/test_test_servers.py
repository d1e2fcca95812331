"""The database servers the fixtures start serve the whole run, so they take
nothing of the environment of the test that happened to start them. A
resident-daemon test's teardown kills every process whose environment names
its world (``STREAMD_RUNTIME_DIR``); the MariaDB server, started inside such a
test (the first of the run to ask for a MySQL database), carried that name and
was stopped a second after it began, failing every later MySQL test of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode(errors="replace").partition("=")[::2]
                for entry in raw.split(b"\0") if entry)


def _of_the_tests(env: dict[str, str]) -> list[str]:
    """The names only a test's process has (pytest's, streamd's)."""
    return sorted(k for k in env if k.startswith(("PYTEST_", "STREAMD_")))


def test_the_mariadb_server_takes_nothing_of_a_tests_environment(mysql_server: Any) -> None:
    assert mysql_server.proc is not None
    assert _of_the_tests(_environment(mysql_server.proc.pid)) == []


def test_the_postgresql_server_takes_nothing_of_a_tests_environment(
    postgres_cluster: Any,
) -> None:
    postmaster = postgres_cluster.pids()[0]
    assert _of_the_tests(_environment(postmaster)) == []

