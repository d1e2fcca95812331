"""How long a migration that adds an index holds up another host's appends.

    python bench/migration_beside_writers.py --db 'postgresql://...' [--rounds 3]
    python bench/migration_beside_writers.py --db 'mysql://...'

``--db`` is a log filled by ``eventlog_scale.py --fill-only`` on a server of
your own. Each round rolls the log back to the schema version before
``events_by_app_time`` (PostgreSQL's 4, MySQL's 3: that index, and any added
after it, dropped, the version row moved back), then opens it as a writer,
which migrates it, while a thread appends one event at a time (durable) on a
store opened before, as another host's daemon would. Printed per round: how
long the open took, how many appends were made meanwhile, and the longest
one (what the build held the writers for). The streamd measured is the one
on ``PYTHONPATH``: run it on two trees to compare.
"""

from __future__ import annotations

import argparse
import itertools
import os
import threading
import time
from typing import Any

from eventlog_scale import APP, MYSQL_SCHEMES, NOW_US

from streamd.eventlog.model import AppendParams, Event, checked


def open_store(db: str) -> Any:
    if db.startswith(MYSQL_SCHEMES):
        from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore

        return MysqlStore.open(db, MysqlOptions(synchronous="FULL"))
    from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

    return PostgresStore.open(db, PostgresOptions(synchronous="FULL"))


def execute(store: Any, db: str, sql: str) -> list[Any]:
    if db.startswith(MYSQL_SCHEMES):
        cur = store.connection.cursor()
        cur.execute(sql)
        return list(cur.fetchall() or ())
    found = store.connection.execute(sql)
    return list(found.fetchall()) if found.description else []


def roll_back(store: Any, db: str) -> None:
    if db.startswith(MYSQL_SCHEMES):
        for (name,) in execute(store, db, "SELECT DISTINCT index_name FROM"
                               " information_schema.statistics WHERE table_schema = database()"
                               " AND index_name IN ('events_by_app_time', 'events_by_author')"):
            execute(store, db, f"DROP INDEX {name} ON events")
        execute(store, db, "UPDATE streamd_meta SET version = 3")
        return
    execute(store, db, "DROP INDEX IF EXISTS events_by_app_time")
    execute(store, db, "DROP INDEX IF EXISTS events_by_author")
    execute(store, db, "UPDATE streamd_meta SET version = 4")


def appending(writer: Any, done: threading.Event, times: list[float]) -> None:
    """One durable append after another until ``done``, each one's ms in ``times``."""
    for n in itertools.count():
        if done.is_set():
            return
        params = checked(AppendParams, app=APP, user="u0", session="s0", event=Event(
            id=f"mb-{os.getpid()}-{time.time_ns()}-{n}", author="user",
            content={"parts": [{"text": "a turn"}]}))
        started = time.perf_counter()
        writer.append(params, NOW_US)
        times.append((time.perf_counter() - started) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="a postgresql:// or mysql:// URL of a filled log")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    writer = open_store(args.db)
    events = execute(writer, args.db, "SELECT count(*) FROM events")[0][0]
    print(f"{events:,} events; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'round':>5} {'open s':>7} {'appends':>8} {'longest ms':>11} {'median ms':>10}")
    for round_ in range(args.rounds):
        roll_back(writer, args.db)
        done = threading.Event()
        times: list[float] = []

        thread = threading.Thread(target=appending, args=(writer, done, times))
        thread.start()
        while len(times) < 20:  # the appends run before the migration starts
            time.sleep(0.01)
        first = len(times)
        started = time.perf_counter()
        open_store(args.db).close()
        took = time.perf_counter() - started
        done.set()
        thread.join()
        # An append the build held finishes with it: the one in flight counts.
        meanwhile = sorted(times[first:])
        longest = meanwhile[-1] if meanwhile else float("nan")
        median = meanwhile[len(meanwhile) // 2] if meanwhile else float("nan")
        print(f"{round_:5} {took:7.2f} {len(meanwhile):8} {longest:11.1f} {median:10.2f}",
              flush=True)
    writer.close()
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
