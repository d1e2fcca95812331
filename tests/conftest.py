"""Shared fixtures.

Recall stream adapter (tests/recall/): ``recall_world`` is a scratch
source on disk (stream files under ``data/``, a workdir under ``work/``) with
the few verbs those tests repeat: write and append records, initialize a
StreamAdapter on them, catch up the way the refresh scanner does, search and
expand. Expectations stay in the tests; nothing here computes one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import pytest

from streamd.recall import oneshot
from streamd.recall.adapter import StreamAdapter
from streamd.recall.generation import Generation
from streamd.recall.index import build
from streamd.recall.wire import ExpandParams, InitializeParams, SearchParams

# The event log's shared fixtures (fx: each storage backend; daemon: a served log).
pytest_plugins = [
    "support.eventlog_fixtures", "support.recall", "support.conformance", "support.faulty_disk",
    "support.postgres_store", "support.mysql_store",
]

# The shared JSON-RPC test client asserts too; keep pytest's detailed messages there.
pytest.register_assert_rewrite("support")

# A far-future deadline for params that require one; the adapter layer never
# enforces it (the RPC layer does).
RECALL_FAR_DEADLINE = "2999-01-01T00:00:00Z"
# Build time stamped by the fixed clock: 2027-01-15T08:00:00Z.
RECALL_BUILD_NS = 1_800_000_000 * 1_000_000_000


class RecallWorld:
    """A stream source in a directory, and the adapter calls the tests make on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.work = root / "work"
        self.data.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)

    # stream files

    @staticmethod
    def rec(id: str, at: str = "2026-05-02T10:00:00Z", *, schema: int = 2, **fields: Any) -> bytes:
        """One JSONL line (with its newline). Unset fields are left out."""
        body: dict[str, Any] = {"schema": schema, "id": id, "event_time": at}
        body.update(fields)
        return json.dumps(body, ensure_ascii=False).encode() + b"\n"

    def path(self, name: str) -> Path:
        return self.data / name

    def write(self, name: str, *lines: bytes) -> Path:
        p = self.path(name)
        p.write_bytes(b"".join(lines))
        return p

    def append(self, name: str, *lines: bytes) -> Path:
        p = self.path(name)
        with p.open("ab") as f:
            f.write(b"".join(lines))
        return p

    # the adapter

    def adapter(
        self,
        files: list[str] | None = None,
        *,
        workdir: str | None = None,
        location: str | None = None,
        source_id: str = "signals",
        **settings: Any,
    ) -> StreamAdapter:
        a = StreamAdapter(clock=lambda: RECALL_BUILD_NS)
        body = {"files": ["a.jsonl"] if files is None else files, **settings}
        a.initialize(
            InitializeParams(
                protocol_version_min=1,
                protocol_version_max=1,
                workdir=str(self.work) if workdir is None else workdir,
                source_id=source_id,
                location=str(self.data) if location is None else location,
                settings=body,
            )
        )
        return a

    @staticmethod
    def current(adapter: StreamAdapter, full: bool = False) -> Generation:
        """Catch up as the refresh scanner does: build only when needed."""
        return oneshot.current(adapter, full)

    @classmethod
    def search(
        cls,
        adapter: StreamAdapter,
        query: str = "",
        *,
        limit: int = 0,
        as_of: str | None = None,
        **filters: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "query": query, "filters": filters, "limit": limit, "deadline": RECALL_FAR_DEADLINE,
        }
        if as_of is not None:
            body["as_of"] = as_of
        params = msgspec.convert(body, SearchParams)
        generation = cls.current(adapter)
        return msgspec.to_builtins(oneshot.search(adapter, generation, params, RECALL_BUILD_NS))

    @classmethod
    def expand(
        cls, adapter: StreamAdapter, local: str, detail: str = "full", budget: int = 0
    ) -> dict[str, Any]:
        params = msgspec.convert(
            {"locator": f"signals:{local}", "detail": detail, "budget_bytes": budget,
             "deadline": RECALL_FAR_DEADLINE},
            ExpandParams,
        )
        adapter.parse_locator(params)
        return msgspec.to_builtins(oneshot.expand(adapter, cls.current(adapter), params))

    @staticmethod
    def health(adapter: StreamAdapter, generation: Generation | None = None) -> dict[str, Any]:
        """Health of ``generation`` (the published generation by default), as on the wire."""
        generation = adapter.generation if generation is None else generation
        assert generation is not None
        return msgspec.to_builtins(adapter.health(generation))


@pytest.fixture
def recall_world(tmp_path: Path) -> RecallWorld:
    return RecallWorld(tmp_path)


@pytest.fixture(scope="session")
def make_recall_world():
    """For hypothesis tests, which cannot take function-scoped fixtures."""
    return RecallWorld


# A stream whose build outlasts short deadlines.
SLOW_RECORDS = 3_000


@pytest.fixture
def slow_world(recall_world, monkeypatch):
    """A stream whose build takes about 3 s: each line costs a millisecond."""
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r-{i}", title=f"record {i}") for i in range(SLOW_RECORDS)))
    real = build.Consumer.consume

    def slow(self, cur, file_no, line):
        time.sleep(0.001)
        real(self, cur, file_no, line)

    monkeypatch.setattr(build.Consumer, "consume", slow)
    monkeypatch.setattr(build, "PLAIN_SLICE", 50)
    # The slowness is put in the plain path's per-line step, which the
    # compiled path does not take.
    monkeypatch.setenv("STREAMD_NATIVE", "0")
    return w


@pytest.fixture
def gated_world(recall_world, monkeypatch):
    """A stream of ``SLOW_RECORDS`` whose build waits at a gate after its
    first step (``support.build_gate``): ``(world, gate)``. The gate is opened at
    the end of the test, so no build thread outlives it."""
    from support.build_gate import gate_builds  # after the assert rewrite is registered

    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r-{i}", title=f"record {i}") for i in range(SLOW_RECORDS)))
    gate = gate_builds(monkeypatch)
    yield w, gate
    gate.open()


# --- PostgreSQL (tests/pg_cluster.py) ----------------------------------------------
#
# One throwaway cluster per test run, started on first use; each test that asks
# for ``postgres_db`` gets a database of its own, copied from a migrated
# template. Where no cluster can be started (no binaries and no apt, no way to
# run the server as a non-root user), the PostgreSQL tests alone are skipped,
# loudly: a warning, a line on stderr at once, and a line in the summary; with
# CI=true the run fails instead, so CI is never green with a backend untested.

_SERVERS_SKIPPED: list[str] = []


@pytest.fixture(scope="session")
def postgres_cluster():
    """The running cluster (``pg_cluster.Cluster``), or a loud skip."""
    try:
        import psycopg  # noqa: F401  (the driver is part of the test install)
        from support import pg_cluster
    except ImportError as exc:
        reason = f"the PostgreSQL driver is not installed ({exc})"
        cluster = None
    else:
        try:
            cluster = pg_cluster.start()
        except pg_cluster.Unavailable as exc:
            reason, cluster = str(exc), None
    if cluster is None:
        _server_missing(
            f"PostgreSQL tests SKIPPED: no PostgreSQL cluster could be started: {reason}"
        )
    yield cluster
    cluster.destroy()


def _server_missing(message: str) -> NoReturn:
    """A loud skip; under CI (``CI=true``) a failure, so that CI is never green
    with a backend untested."""
    import sys
    import warnings

    _SERVERS_SKIPPED.append(message)
    print(f"\n*** {message}", file=sys.stderr, flush=True)
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"{message} (CI=true: a database server the tests need must start)")
    warnings.warn(message, pytest.PytestWarning, stacklevel=2)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_conninfo(postgres_cluster) -> str:
    """The conninfo of the cluster's maintenance database (superuser, socket)."""
    return postgres_cluster.conninfo()


def _migrate_template(conninfo: str) -> None:
    from streamd.eventlog.postgres.store import PostgresStore

    PostgresStore.open(conninfo).close()


@pytest.fixture
def postgres_db(postgres_cluster):
    """The conninfo of a fresh database of its own holding a migrated event
    log; dropped after the test."""
    conninfo = postgres_cluster.fresh_database(_migrate_template)
    yield conninfo
    postgres_cluster.drop_database(conninfo)


_POSTGRES_FIXTURES = frozenset({"postgres_cluster", "postgres_conninfo", "postgres_db"})


# --- MariaDB (tests/support/mariadb_server.py) -------------------------------------
#
# The same arrangement for the MySQL backend: one throwaway server per run,
# started on first use, a fresh database per test that asks for ``mysql_db``.


@pytest.fixture(scope="session")
def mysql_server():
    """The running server (``mariadb_server.Server``), or a loud skip."""
    try:
        import MySQLdb  # noqa: F401  (the driver is part of the test install)
        from support import mariadb_server
    except ImportError as exc:
        _server_missing(f"MySQL tests SKIPPED: the MySQL driver is not installed ({exc})")
    try:
        server = mariadb_server.start()
    except mariadb_server.Unavailable as exc:
        _server_missing(f"MySQL tests SKIPPED: no MariaDB server could be started: {exc}")
    yield server
    server.destroy()


@pytest.fixture
def mysql_db(mysql_server) -> Iterator[str]:
    """The URL of a fresh, empty database of its own; dropped after the test."""
    url = mysql_server.fresh_database()
    yield url
    mysql_server.drop_database(url)


_MYSQL_FIXTURES = frozenset({"mysql_server", "mysql_db"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test needs PostgreSQL when it asks for the cluster, directly or through
    # a fixture, or runs as the postgres case of a per-backend fixture (fx):
    # marking it here, from what it asks for, cannot miss a new test.
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend_ids = set(callspec.id.split("-")) if callspec is not None else set()
        fixtures = set(getattr(item, "fixturenames", ()))
        if _POSTGRES_FIXTURES & fixtures or "postgres" in backend_ids:
            item.add_marker(pytest.mark.postgres)
        if _MYSQL_FIXTURES & fixtures or "mysql" in backend_ids:
            item.add_marker(pytest.mark.mysql)


def pytest_terminal_summary(terminalreporter) -> None:
    for message in _SERVERS_SKIPPED:
        terminalreporter.write_line(message, red=True, bold=True)
