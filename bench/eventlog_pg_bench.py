"""The event log on PostgreSQL, measured the way a client sees it.

Every number comes from real ``python -m streamd serve --socket`` daemons on one
database of a throwaway local cluster (``tests/pg_cluster.py``: PostgreSQL from
the OS packages, Unix socket only, ``fsync=on``, ``synchronous_commit=on``), or
from a database you name with ``--db`` (credentials the libpq way: environment,
``~/.pgpass``, a service file). Like the other benches it asserts nothing; it
prints a table with the issue's targets beside the numbers and writes JSON.

    .venv/bin/python bench/eventlog_pg_bench.py [--out bench/results/eventlog_pg.json] [--quick]
    python bench/eventlog_pg_bench.py --dispatch [--calls 2000]

Rows:

* append, 1 / 4 / 16 clients spread over 2 daemons (round robin) on one database,
  each client a socket connection with 200 appends in flight, each answered only
  after its commit (synchronous_commit on): appends/s over all clients.
* since: pages of 10,000 over a 100,000-entry log through one daemon, entries/s end
  to end (the client reads every frame).
* watch latency across daemons: a client of daemon A watches, a client of daemon
  B appends one event at a time; time from sending the append to B until A's
  notification arrives (LISTEN/NOTIFY; no polling).

``--dispatch`` measures how a Trio program can drive PostgreSQL, with raw SQL and
no streamd code, in whatever environment runs it (the drivers that are missing
are reported as such): psycopg's synchronous API inline (blocks the event loop: a
baseline), the same on a worker thread per call (what streamd does), psycopg's
AsyncConnection under trio-asyncio, and asyncpg under trio-asyncio. Per driver:
the median of ``--calls`` calls of ``SELECT 1``, of a 100-row page, and of one
insert committed alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from server_daemons import (
    Daemons,
    append_rows,
    machine,
    since_rate,
    stop,
    two_daemons,
    wait_socket,
    watch_latency,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
DEFAULT_OUT = ROOT / "bench" / "results" / "eventlog_pg.json"
TARGETS = {
    "append_4_clients_2_daemons": ">= 5,000/s",
    "since": ">= 100,000 entries/s",
    "watch_cross_daemon_p50_ms": "<= 10 ms",
}


def _cluster_url(args: argparse.Namespace) -> tuple[str, Any]:
    """The database to measure on: ``--db``, or a fresh throwaway cluster."""
    if args.db:
        return args.db, None
    from support import pg_cluster

    cluster = pg_cluster.start()
    return cluster.url(), cluster


def _fresh_db(url: str, cluster: Any, name: str) -> str:
    """A new database for one measurement (on the throwaway cluster), or the
    given one wiped (its streamd schema dropped)."""
    import psycopg

    if cluster is None:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("DROP SCHEMA IF EXISTS streamd CASCADE")
        return url
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return cluster.url(name)


# --- dispatch ----------------------------------------------------------------------


async def _timed(call: Callable[[], Awaitable[Any]], n: int) -> float:
    """Median microseconds of ``n`` awaited calls."""
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples)


def _dispatch(args: argparse.Namespace) -> dict[str, Any]:
    url, cluster = _cluster_url(args)
    import psycopg

    db_url = _fresh_db(url, cluster, "dispatch")
    with psycopg.connect(db_url, autocommit=True) as db:
        db.execute(
            "CREATE TABLE page (id int PRIMARY KEY, body text);"
            "CREATE TABLE appended (id bigserial PRIMARY KEY, body text)"
        )
        db.execute(
            "INSERT INTO page SELECT i, repeat('x', 200) FROM generate_series(1, 100) i"
        )
    results: dict[str, Any] = {}
    n = args.calls

    async def sync_inline() -> dict[str, float]:
        conn = psycopg.connect(db_url, autocommit=True)
        try:
            async def ping() -> None:
                conn.execute("SELECT 1").fetchall()

            async def page() -> None:
                conn.execute("SELECT id, body FROM page ORDER BY id").fetchall()

            async def append() -> None:
                conn.execute("INSERT INTO appended (body) VALUES ('x')")

            return {"ping": await _timed(ping, n), "page_100": await _timed(page, n),
                    "append": await _timed(append, n // 4)}
        finally:
            conn.close()

    async def sync_thread() -> dict[str, float]:
        conn = psycopg.connect(db_url, autocommit=True)
        limiter = trio.CapacityLimiter(1)

        def on_thread(fn: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
            return lambda: trio.to_thread.run_sync(fn, limiter=limiter)

        try:
            return {
                "ping": await _timed(on_thread(lambda: conn.execute("SELECT 1").fetchall()), n),
                "page_100": await _timed(on_thread(
                    lambda: conn.execute("SELECT id, body FROM page ORDER BY id").fetchall()), n),
                "append": await _timed(on_thread(
                    lambda: conn.execute("INSERT INTO appended (body) VALUES ('x')")), n // 4),
            }
        finally:
            conn.close()

    async def streamd_runner() -> dict[str, float]:
        # What the store uses: start_thread_soon with a cancel that reaches the server.
        from streamd.eventlog.postgres.runner import PostgresRunner

        runner = await PostgresRunner.open(db_url)
        try:
            def raw(sql: str) -> Callable[[], Awaitable[Any]]:
                return lambda: runner.run(lambda s: s.connection.execute(sql).fetchall()
                                          if sql.startswith("SELECT")
                                          else s.connection.execute(sql))

            return {
                "ping": await _timed(raw("SELECT 1"), n),
                "page_100": await _timed(raw("SELECT id, body FROM public.page ORDER BY id"), n),
                "append": await _timed(raw("INSERT INTO public.appended (body) VALUES ('x')"),
                                       n // 4),
            }
        finally:
            await runner.aclose()

    async def async_psycopg() -> dict[str, float]:
        import trio_asyncio

        async with trio_asyncio.open_loop():
            conn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(
                db_url, autocommit=True
            )

            async def q(sql: str) -> Any:
                cur = await conn.execute(sql)
                return await cur.fetchall() if sql.startswith("SELECT") else None

            def call(sql: str) -> Callable[[], Awaitable[Any]]:
                return lambda: trio_asyncio.aio_as_trio(q)(sql)

            try:
                return {
                    "ping": await _timed(call("SELECT 1"), n),
                    "page_100": await _timed(call("SELECT id, body FROM page ORDER BY id"), n),
                    "append": await _timed(call("INSERT INTO appended (body) VALUES ('x')"),
                                           n // 4),
                }
            finally:
                await trio_asyncio.aio_as_trio(conn.close)()

    async def asyncpg_() -> dict[str, float]:
        import asyncpg
        import trio_asyncio
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(db_url)
        async with trio_asyncio.open_loop():
            conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(
                host=p["host"], port=int(p.get("port", 5432)), user=p["user"],
                database=p["dbname"],
            )

            def call(fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
                return lambda: trio_asyncio.aio_as_trio(fn)()

            try:
                return {
                    "ping": await _timed(call(lambda: conn.fetch("SELECT 1")), n),
                    "page_100": await _timed(
                        call(lambda: conn.fetch("SELECT id, body FROM page ORDER BY id")), n),
                    "append": await _timed(
                        call(lambda: conn.execute("INSERT INTO appended (body) VALUES ('x')")),
                        n // 4),
                }
            finally:
                await trio_asyncio.aio_as_trio(conn.close)()

    ways = {
        "psycopg sync, inline (blocks the loop)": sync_inline,
        "psycopg sync, trio.to_thread": sync_thread,
        "psycopg sync, PostgresRunner (streamd)": streamd_runner,
        "psycopg async, trio-asyncio": async_psycopg,
        "asyncpg, trio-asyncio": asyncpg_,
    }
    for name, fn in ways.items():
        try:
            results[name] = trio.run(fn)
        except ImportError as exc:
            results[name] = f"not measured: {exc}"
        except Exception as exc:  # a driver that does not work here is a result too
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            results[name] = f"fails: {type(exc).__name__}: {exc}"
    if cluster is not None:
        cluster.destroy()
    return results


# --- through the daemons ----------------------------------------------------------


def _daemons_bench(args: argparse.Namespace) -> dict[str, Any]:
    url, cluster = _cluster_url(args)
    quick = args.quick
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def start(name: str) -> Daemons:
            return two_daemons(root, lambda n: _fresh_db(url, cluster, n), name)

        async def measure() -> None:
            out.update(await append_rows(start, quick))
            sockets, procs = start("reads")
            try:
                for s in sockets:
                    await wait_socket(s)
                out["since"] = await since_rate(sockets[0], 20_000 if quick else 100_000)
                out["watch_cross_daemon"] = await watch_latency(sockets, 50 if quick else 300)
            finally:
                stop(procs)

        trio.run(measure)
    if cluster is not None:
        cluster.destroy()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="a postgresql:// URL to measure on (default: a throwaway cluster)")
    ap.add_argument("--dispatch", action="store_true")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result = {"machine": machine()}
    if args.dispatch:
        result["dispatch_us"] = _dispatch(args)
        print(json.dumps(result, indent=2))
    else:
        got = _daemons_bench(args)
        result["results"] = got
        result["targets"] = TARGETS
        for name, value in got.items():
            if isinstance(value, dict):
                shown = ", ".join(f"{k} {v:.2f}" for k, v in value.items())
            else:
                shown = f"{value:,.0f}/s"
            print(f"{name:32} {shown:40} {TARGETS.get(name, '')}")
    out = args.out or (None if args.dispatch else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
