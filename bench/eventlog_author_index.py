"""What an index on ``author`` costs a durable append, and what it saves a read by author.

    python bench/eventlog_author_index.py --db /tmp/m1.db [--pairs 6] [--appends 300]
    python bench/eventlog_author_index.py --db 'postgresql://...' (or mysql://...)

``--db`` is a log filled by ``eventlog_scale.py --fill-only`` (a SQLite file,
or a database on a server of your own; the file is written to: bench a copy).
It is opened in process, ``synchronous=FULL`` (on MariaDB durability is the
server's ``innodb_flush_log_at_trx_commit``, 1 on the tests' servers), and
measured in ``--pairs`` pairs, each the same work on the log without and with
``events_by_author``, the order alternating from pair to pair (so a drift of
the machine's load, or of the log's size, falls on both sides alike):

* ``--appends`` single-event appends, each its own durable commit, each to a
  random session of the log, its author one of the fill's four: the rate, and
  the median and 99th percentile of one append;
* ``--reads`` reads of ``since`` from 0 filtered by an author no event has
  (the read that walks the whole log without the index): the median.

With ``--same`` neither half has the index: what the pairs' ratios look
like when nothing differs. The index is dropped before a "without" half and
built before a "with" half (the build is timed: what a migration adding it
costs), and each half runs on a store opened for it; the index is left as
the schema has it. Prints
each pair, the medians, and the load average before each half: other jobs
on the machine move these figures more than the index may, which the pairs
are there to show.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from eventlog_scale import APP, AUTHORS, MYSQL_SCHEMES, NOW_US, address, is_server

from streamd.eventlog.model import AppendParams, Event, Filter, SinceParams, checked

INDEX = "events_by_author"


def open_store(db: str) -> Any:
    """The log in process, every commit durable."""
    if db.startswith(MYSQL_SCHEMES):
        from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore

        return MysqlStore.open(db, MysqlOptions(synchronous="FULL"))
    if is_server(db):
        from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

        return PostgresStore.open(db, PostgresOptions(synchronous="FULL"))
    from streamd.eventlog.sqlite import SqliteOptions, SqliteStore

    return SqliteStore.open(db, SqliteOptions(synchronous="FULL"))


def execute(store: Any, db: str, sql: str) -> list[Any]:
    if db.startswith(MYSQL_SCHEMES):
        cur = store.connection.cursor()
        cur.execute(sql)
        return list(cur.fetchall())
    found = store.connection.execute(sql)
    if not is_server(db):
        return list(found)
    return list(found.fetchall()) if found.description else []


def index_columns(db: str) -> str:
    # SQLite and InnoDB end every secondary index with the primary key (seq);
    # PostgreSQL's must name it to hand rows over in seq order.
    return "(author, seq)" if is_server(db) and not db.startswith(MYSQL_SCHEMES) else "(author)"


def has_index(store: Any, db: str) -> bool:
    if db.startswith(MYSQL_SCHEMES):
        sql = ("SELECT count(*) FROM information_schema.statistics WHERE table_schema ="
               f" database() AND table_name = 'events' AND index_name = '{INDEX}'")
    elif is_server(db):
        sql = f"SELECT count(*) FROM pg_indexes WHERE indexname = '{INDEX}'"
    else:
        sql = f"SELECT count(*) FROM sqlite_master WHERE name = '{INDEX}'"
    return bool(execute(store, db, sql)[0][0])


def set_index(store: Any, db: str, wanted: bool) -> float | None:
    """Make the index present or absent; the seconds a build took, if one ran."""
    if has_index(store, db) == wanted:
        return None
    if not wanted:
        execute(store, db, f"DROP INDEX {INDEX}" + (" ON events" if
                                                      db.startswith(MYSQL_SCHEMES) else ""))
        return None
    started = time.perf_counter()
    execute(store, db, f"CREATE INDEX {INDEX} ON events {index_columns(db)}")
    return time.perf_counter() - started


class Appender:
    """Single-event appends in the shape of the fill's, to random sessions."""

    def __init__(self, sessions: int) -> None:
        self._rng = random.Random(11)
        self._sessions = sessions
        self._n = 0

    def params(self) -> AppendParams:
        self._n += 1
        user, session = address(self._rng.randrange(self._sessions), self._sessions)
        content = {"role": "model", "parts": [{"text": f"new {self._n} " + "lorem " * 40}]}
        return checked(AppendParams, app=APP, user=user, session=session,
                       event=Event(id=f"ai-{os.getpid()}-{time.time_ns()}-{self._n}",
                                   author=AUTHORS[self._n % 4], content=content))


def appends(store: Any, appender: Appender, n: int) -> tuple[float, float, float]:
    """Appends per second, and the median and p99 of one, in ms."""
    times = []
    started = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        [result] = store.append_batch([appender.params()], NOW_US)
        times.append((time.perf_counter() - t) * 1e3)
        assert not isinstance(result, BaseException), result
    rate = n / (time.perf_counter() - started)
    times.sort()
    return rate, statistics.median(times), times[min(n - 1, int(n * 0.99))]


def reads(store: Any, n: int) -> float:
    """The median of ``since`` from 0 by an author no event has, in ms."""
    params = SinceParams(from_seq=0, filter=Filter(author="nobody"))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        assert store.since(params).entries == []
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="a filled log: SQLite file or server URL")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--appends", type=int, default=300)
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=10_000, help="as the fill's")
    ap.add_argument("--same", action="store_true",
                    help="both halves without the index: the spread of a pair's ratio when"
                         " nothing differs, to judge the real pairs' by")
    args = ap.parse_args()
    store = open_store(args.db)
    had = has_index(store, args.db)
    events = execute(store, args.db, "SELECT count(*) FROM events")[0][0]
    print(f"{events:,} events; load {load()}", flush=True)
    appender = Appender(args.sessions)
    results: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
    builds: list[float] = []
    print(f"{'pair':>4} {'index':>5} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'read ms':>9}  load before")
    try:
        for pair in range(args.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for indexed in order:
                before = load()
                built = set_index(store, args.db, indexed and not args.same)
                if built is not None:
                    builds.append(built)
                # A connection of its own: PostgreSQL's plan of a prepared
                # read, made without the index, would outlive its build.
                half = open_store(args.db)
                try:
                    rate, p50, p99 = appends(half, appender, args.appends)
                    read = reads(half, args.reads)
                finally:
                    half.close()
                results[indexed].append((rate, p50, p99, read))
                print(f"{pair:4} {'yes' if indexed else 'no':>5} {rate:10.0f} {p50:8.3f}"
                      f" {p99:8.3f} {read:9.2f}  {before}", flush=True)
    finally:
        set_index(store, args.db, had)
        store.close()
    print("medians over the pairs")
    for indexed in (False, True):
        rows = results[indexed]
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        print(f"     {'yes' if indexed else 'no':>5} {med[0]:10.0f} {med[1]:8.3f} {med[2]:8.3f}"
              f" {med[3]:9.2f}")
    ratios = [w[0] / wo[0] for wo, w in zip(results[False], results[True], strict=True)]
    print("append rate with / without, pair by pair: "
          + ", ".join(f"{r:.3f}" for r in ratios) + f" (median {statistics.median(ratios):.3f})")
    if builds:
        print("index builds: " + ", ".join(f"{b:.2f}" for b in builds) + " s")
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
