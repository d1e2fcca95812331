"""The event log on MySQL/MariaDB, measured the way a client sees it, beside
the same rows on SQLite's and PostgreSQL's benches.

Every number comes from real ``python -m streamd serve --socket`` daemons on one
database of a throwaway MariaDB server (``tests/support/mariadb_server.py``:
Debian's package, Unix socket only, ``innodb_flush_log_at_trx_commit=1``, so
every acknowledged append is on disk), or on a database you name with ``--db``
(credentials the MySQL way: ``MYSQL_PWD`` or an option file). It asserts
nothing: it prints a table with the targets beside the numbers and writes JSON.

    .venv/bin/python bench/eventlog_mysql_bench.py [--out bench/results/eventlog_mysql.json]
                                                   [--quick] [--drivers]

Rows:

* append, 1 / 4 / 16 clients over 2 daemons (round robin) on one database, each
  client a socket connection with 200 appends in flight, each answered after
  its commit: appends/s over all clients.
* since: pages of 10,000 over a 100,000-entry log through one daemon, entries/s.
* watch latency across daemons: a client of daemon A watches, a client of
  daemon B appends one event at random moments 1.0-1.5 s apart (so A's poll has
  backed off to its ceiling); send to notification, p50/p95/max.
* idle cost: the server process's CPU time while a daemon with one watcher
  follows an idle log for ``--idle-s`` seconds (default 60), as a share of one core.

``--drivers`` measures the synchronous drivers on the same server with raw SQL
(the medians of a ``SELECT 1``, a 1,000-row page and an insert committed
alone), for those installed: mysqlclient, PyMySQL, mysql-connector-python.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from server_daemons import (
    Conn,
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
DEFAULT_OUT = ROOT / "bench" / "results" / "eventlog_mysql.json"
TARGETS = {
    "append_4_clients_2_daemons": ">= 5,000/s",
    "since": ">= 100,000 entries/s",
    "watch_cross_daemon": "p50 <= 30 ms",
    "idle_server_cpu_percent": "< 1 % of one core",
}


def _server(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.db:
        return args.db, None
    from support import mariadb_server

    server = mariadb_server.start()
    return None, server


def _fresh(url: str | None, server: Any, name: str) -> str:
    if server is None:
        assert url is not None
        return url
    server.sql(f"DROP DATABASE IF EXISTS `{name}`")
    server.sql(f"CREATE DATABASE `{name}`")
    return str(server.url(name))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _idle_cost(socket: Path, server_pid: int, seconds: float) -> dict[str, float]:
    watcher = await Conn.open(str(socket))
    start = (await watcher.call("eventlog/latest_seq", {}))["seq"]
    await watcher.send("eventlog/watch", {"from_seq": start})
    await trio.sleep(1)  # the poll backs off to its ceiling
    before, t = _cpu_seconds(server_pid), time.monotonic()
    await trio.sleep(seconds)
    used, elapsed = _cpu_seconds(server_pid) - before, time.monotonic() - t
    await watcher.stream.aclose()
    return {"server_cpu_s": round(used, 3), "seconds": round(elapsed, 1),
            "percent_of_a_core": round(100 * used / elapsed, 3)}


def _daemons_bench(args: argparse.Namespace) -> dict[str, Any]:
    url, server = _server(args)
    quick = args.quick
    out: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)

            def start(name: str) -> Daemons:
                return two_daemons(root, lambda n: _fresh(url, server, n), name)

            async def measure() -> None:
                out.update(await append_rows(start, quick))
                sockets, procs = start("reads")
                rng = random.Random(7)
                try:
                    for s in sockets:
                        await wait_socket(s)
                    out["since"] = await since_rate(sockets[0], 20_000 if quick else 100_000)
                    out["watch_cross_daemon"] = await watch_latency(
                        sockets, 15 if quick else 60, gap=lambda i: 1.0 + rng.random() * 0.5)
                    if server is not None and server.proc is not None:
                        idle = await _idle_cost(sockets[0], server.proc.pid,
                                                10 if quick else args.idle_s)
                        out["idle_server_cpu_percent"] = idle
                finally:
                    stop(procs)

            trio.run(measure)
    finally:
        if server is not None:
            server.destroy()
    return out


def _drivers(args: argparse.Namespace) -> dict[str, Any]:
    """Raw SQL per driver on one server: the reason for the driver choice."""
    from support import mariadb_server

    server = mariadb_server.start()
    results: dict[str, Any] = {}
    try:
        server.sql("CREATE DATABASE drivers")
        server.sql("CREATE TABLE t (seq BIGINT AUTO_INCREMENT PRIMARY KEY, a VARCHAR(255),"
                   " content LONGTEXT) ENGINE=InnoDB", "drivers")
        sock = str(server.socket)
        row = ("app", '{"text": "' + "x" * 200 + '"}')
        values = ", ".join(["('app', '" + row[1] + "')"] * 1000)
        server.sql(f"INSERT INTO t (a, content) VALUES {values}", "drivers")
        opened: dict[str, Any] = {}
        try:
            import MySQLdb

            opened["mysqlclient"] = MySQLdb.connect(unix_socket=sock, user="root",
                                                    database="drivers", autocommit=True)
        except ImportError:
            results["mysqlclient"] = "not installed"
        try:
            import pymysql

            opened["PyMySQL"] = pymysql.connect(unix_socket=sock, user="root",
                                                database="drivers", autocommit=True)
        except ImportError:
            results["PyMySQL"] = "not installed"
        try:
            import mysql.connector

            opened["mysql-connector-python"] = mysql.connector.connect(
                unix_socket=sock, user="root", database="drivers", autocommit=True)
        except ImportError:
            results["mysql-connector-python"] = "not installed"

        def median_us(fn: Any, n: int) -> float:
            xs = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                xs.append((time.perf_counter() - t) * 1e6)
            return round(statistics.median(xs), 1)

        for name, conn in opened.items():
            cur = conn.cursor()

            def ping(cur: Any = cur) -> None:
                cur.execute("SELECT 1")
                cur.fetchall()

            def page(cur: Any = cur) -> None:
                cur.execute("SELECT seq, a, content FROM t ORDER BY seq LIMIT 1000")
                cur.fetchall()

            def insert(cur: Any = cur) -> None:
                cur.execute("BEGIN")
                cur.execute("INSERT INTO t (a, content) VALUES (%s, %s)", row)
                cur.execute("COMMIT")

            results[name] = {"ping_us": median_us(ping, args.calls),
                             "page_1000_us": median_us(page, max(20, args.calls // 20)),
                             "committed_insert_us": median_us(insert, max(50, args.calls // 5))}
            conn.close()
    finally:
        server.destroy()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="a mysql:// URL to measure on (default: a throwaway server)")
    ap.add_argument("--drivers", action="store_true")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"machine": machine()}
    if args.drivers:
        result["drivers"] = _drivers(args)
        print(json.dumps(result, indent=2))
    else:
        got = _daemons_bench(args)
        result["results"], result["targets"] = got, TARGETS
        for name, value in got.items():
            if isinstance(value, dict):
                shown = ", ".join(f"{k} {v:.2f}" for k, v in value.items())
            else:
                shown = f"{value:,.0f}/s"
            print(f"{name:32} {shown:52} {TARGETS.get(name, '')}")
    out = args.out or (None if args.drivers else DEFAULT_OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
