"""What each event-log call costs on a log of a million events, and what a restart costs.

    python bench/eventlog_scale.py --db /tmp/scale.db [--events 1000000] [--sessions 10000]
    python bench/eventlog_scale.py --db 'postgresql://streamd@/scale?host=...' (or mysql://...)

``--db`` may name a PostgreSQL or MySQL database on a server of your own: the
tests' throwaway servers start alone and print their URL
(``python tests/support/pg_cluster.py``, ``python tests/support/mariadb_server.py``;
create the database ``scale`` on it first). A server log is filled the same
way, by the store's batched appends (``COPY`` on PostgreSQL), and is not
backed up here (its own tool does that).

The log at ``--db`` is filled once (kept and reused when it already holds
``--events``): one app, 100 users, ``--sessions`` sessions, events dealt to
the sessions in turn (so each session's events are spread over the whole
log), ADK-shaped content of about 300 bytes, every 25th event with a state
delta in all three scopes, four authors, branches ``root.a``/``root.b``.

Then, on ``streamd serve --socket`` of that file (``synchronous=FULL``):

* ``restart``: spawn to the first answered ``eventlog/ping``, three times
  (the page cache warm: what a daemon restart costs, not a cold disk);
* every wire call a client makes, each ``--n`` times on one kept-open
  connection with a blocking client: p50 and p99 latency (what the daemon,
  the kernel and the client together cost; nothing else runs);
* a client's pings while another lists every session of the app (a read
  slow for its answer alone);
* the daemon's peak RSS (``VmHWM``) after them;
* ``streamd log verify`` and ``log backup`` of the whole file, one run each.

Asserts nothing: a table to read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamd.eventlog.model import AppendParams, Event, StateDelta, checked
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore

APP = "scale"
NOW_US = 1_760_000_000_000_000
EPOCH = dt.datetime.fromtimestamp(NOW_US / 1e6, dt.UTC)
AUTHORS = ("user", "planner", "coder", "reviewer")
BATCH = 2000
MYSQL_SCHEMES = ("mysql://", "mariadb://")
SERVER_SCHEMES = ("postgresql://", "postgres://", *MYSQL_SCHEMES)


def address(i: int, sessions: int) -> tuple[str, str]:
    s = i % sessions
    return f"u{s % 100}", f"s{s}"


def is_server(db: str) -> bool:
    return db.startswith(SERVER_SCHEMES)


def open_store(db: str) -> Any:
    """The store of ``db`` in process, for the fill."""
    if db.startswith(MYSQL_SCHEMES):
        from streamd.eventlog.mysql.store import MysqlOptions, MysqlStore

        return MysqlStore.open(db, MysqlOptions(synchronous="NORMAL"))
    if is_server(db):
        from streamd.eventlog.postgres.store import PostgresOptions, PostgresStore

        return PostgresStore.open(db, PostgresOptions(synchronous="NORMAL"))
    return SqliteStore.open(db, SqliteOptions(synchronous="NORMAL"))


def query(store: Any, db: str, sql: str) -> Any:
    """The first value of one statement on the fill's connection."""
    if db.startswith(MYSQL_SCHEMES):
        cur = store.connection.cursor()
        cur.execute(sql)
        return cur.fetchone()[0]
    return store.connection.execute(sql).fetchone()[0]


def size_mib(db: str) -> float:
    """What the log takes: the file, or the server's tables and indexes."""
    if not is_server(db):
        return Path(db).stat().st_size / 2**20
    store = open_store(db)
    try:
        if db.startswith(MYSQL_SCHEMES):
            sql = ("SELECT sum(data_length + index_length) FROM information_schema.tables"
                   " WHERE table_schema = database()")
        else:
            sql = ("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
                   " JOIN pg_namespace n ON n.oid = c.relnamespace"
                   " WHERE n.nspname = 'streamd' AND c.relkind = 'r'")
        return int(query(store, db, sql)) / 2**20
    finally:
        store.close()


def fill(db: str, events: int, sessions: int) -> None:
    """The log, written in batches in process (its writing is not measured)."""
    store = open_store(db)
    try:
        have = query(store, db, "SELECT count(*) FROM events")
        if have >= events:
            return
        if have:
            raise SystemExit(f"{db} holds {have} events, not {events}: remove it first")
        started = time.perf_counter()
        for start in range(0, events, BATCH):
            batch = []
            for i in range(start, min(events, start + BATCH)):
                user, session = address(i, sessions)
                delta = None
                if i % 25 == 0:
                    delta = StateDelta(app={"n": i}, user={"last": i}, session={f"k{i % 7}": i})
                content = {"role": "model", "parts": [{"text": f"step {i} " + "lorem " * 40}]}
                batch.append(checked(
                    AppendParams, app=APP, user=user, session=session,
                    event=Event(id=f"e{i}", author=AUTHORS[i % 4], content=content,
                                branch=("root.a", "root.b")[i % 2],
                                timestamp=EPOCH + dt.timedelta(milliseconds=i)),
                    state_delta=delta,
                ))
            store.append_batch(batch, NOW_US + start * 1000)
        print(f"filled {events:,} events in {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        store.close()


class Conn:
    """One kept-open connection and a blocking request loop."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 0

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.sock.sendall(json.dumps(body).encode() + b"\n")
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("the daemon closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]


def start(db: str, sock: str, readers: int | None = None) -> tuple[subprocess.Popen[bytes], float]:
    argv = ["serve", "--socket", sock, "--db", db, "--synchronous", "FULL"]
    run = [sys.executable, "-m", "streamd"]
    if readers is not None:  # a server log's reads held to that many connections
        run = [sys.executable, "-c",
               "import runpy, sys; from streamd.eventlog import reader_pool;"
               f" reader_pool.READERS = {readers}; sys.argv[0] = 'streamd';"
               " runpy.run_module('streamd', run_name='__main__')"]
    started = time.perf_counter()
    proc = subprocess.Popen([*run, *argv], stdin=subprocess.DEVNULL)
    while True:  # a process's start-up: there is no event to wait on
        try:
            Conn(sock).ask("eventlog/ping", {})
            return proc, time.perf_counter() - started
        except (OSError, RuntimeError):
            if proc.poll() is not None:
                raise SystemExit("streamd serve did not start") from None
            time.sleep(0.005)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(60)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(n: int, call: Callable[[int], object]) -> tuple[float, float]:
    times = []
    for i in range(n):
        t = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def calls(conn: Conn, events: int, sessions: int) -> list[tuple[str, Callable[[int], object]]]:
    rng = random.Random(7)
    middle = events // 2
    sess = {"app": APP, "user": "u42", "session": "s42"}
    fresh = iter(range(10**9))

    def append(_: int) -> object:
        user, session = address(rng.randrange(sessions), sessions)
        event = {"id": f"new{next(fresh)}-{os.getpid()}", "author": "user",
                 "content": {"parts": [{"text": "a new turn"}]}}
        return conn.ask("eventlog/append", {"app": APP, "user": user, "session": session,
                                            "event": event})

    def ask(method: str, params: dict[str, Any]) -> Callable[[int], object]:
        return lambda _: conn.ask(method, params)

    def compact_keeping_all(_: int) -> object:
        # Every rule's step runs and finds nothing to remove: what a daemon's
        # periodic compaction costs a log that is within its policy.
        far = 10**9
        conn.ask("eventlog/retention.set",
                 {"app": APP, "max_age_s": far, "max_events": far, "idle_s": far})
        try:
            return conn.ask("eventlog/compact", {"app": APP, "vacuum": "none"})
        finally:
            conn.ask("eventlog/retention.set", {"app": APP})

    return [
        ("append (FULL), a random session", append),
        ("latest_seq", ask("eventlog/latest_seq", {})),
        ("latest_seq, one session", ask("eventlog/latest_seq", {"filter": sess})),
        ("since from 0, 1,000", ask("eventlog/since", {"from_seq": 0})),
        ("since from the middle, 1,000",
         ask("eventlog/since", {"from_seq": middle})),
        ("since, one session, from 0", ask("eventlog/since", {"from_seq": 0, "filter": sess})),
        ("since, one user, from 0",
         ask("eventlog/since", {"from_seq": 0, "filter": {"app": APP, "user": "u42"}})),
        ("since, one author, from 0",
         ask("eventlog/since", {"from_seq": 0, "filter": {"author": "coder"}})),
        ("since, an author no event has, from 0",
         ask("eventlog/since", {"from_seq": 0, "filter": {"author": "nobody"}})),
        ("since, branch prefix, from 0",
         ask("eventlog/since", {"from_seq": 0, "filter": {"branch_prefixes": ["root.b"]}})),
        ("since, a session no event has, from 0",
         ask("eventlog/since", {"from_seq": 0,
                                "filter": {"app": APP, "user": "u1", "session": "none"}})),
        ("branches", ask("eventlog/branches", {"filter": {"app": APP}})),
        ("sessions.list, one user", ask("eventlog/sessions.list", {"app": APP, "user": "u42"})),
        ("sessions.get, newest 20", ask("eventlog/sessions.get", {**sess, "recent": 20})),
        ("sessions.get, whole", ask("eventlog/sessions.get", sess)),
        ("state.get", ask("eventlog/state.get", sess)),
        ("state.get as of the middle",
         ask("eventlog/state.get", {**sess, "as_of_seq": middle})),
        ("compact (no policy)", ask("eventlog/compact", {"app": APP, "vacuum": "none"})),
        ("compact, a policy that removes nothing", compact_keeping_all),
    ]


def beside(sock: str, n: int) -> None:
    """A client's pings while another client lists every session of the app
    (one read, slow for its answer alone, on the reader's connection)."""
    busy, quick = Conn(sock), Conn(sock)
    done = threading.Event()
    lists: list[float] = []

    def lister() -> None:
        while not done.is_set():
            t = time.perf_counter()
            busy.ask("eventlog/sessions.list", {"app": APP})
            lists.append((time.perf_counter() - t) * 1e3)

    thread = threading.Thread(target=lister)
    thread.start()
    try:
        while not lists:  # one list done: the lister runs
            time.sleep(0.01)
        p50, p99 = timed(n, lambda _: quick.ask("eventlog/ping", {}))
    finally:
        done.set()
        thread.join()
    print(f"{'ping beside sessions.list of the app':45} {p50:9.3f} {p99:9.3f}"
          f"   (the list: p50 {statistics.median(lists):.0f} ms)", flush=True)


def store_calls(db: str) -> None:
    """Reads no wire method makes (``log tail -n`` asks them), in process."""
    from streamd.eventlog.model import Filter

    store = open_store(db)
    try:
        for name, flt in (("one session", Filter(app=APP, user="u42", session="s42")),
                          ("one user", Filter(app=APP, user="u42"))):
            p50, p99 = timed(20, lambda _, f=flt: store.nth_newest_seq(f, 10))  # type: ignore[misc]
            print(f"{'nth_newest_seq(10), ' + name:45} {p50:9.3f} {p99:9.3f}", flush=True)
    finally:
        store.close()


def cli_seconds(db: str, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "streamd", "log", "--db", db, *args],
                   check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True,
                    help="a SQLite file, or a postgresql:// or mysql:// URL")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--fill-only", action="store_true", help="fill the log and stop")
    ap.add_argument("--beside-only", action="store_true",
                    help="time only the pings beside a slow read")
    ap.add_argument("--readers", type=int,
                    help="hold a server log's reads to this many connections (1: as before)")
    args = ap.parse_args()
    fill(args.db, args.events, args.sessions)
    print(f"{args.events:,} events, {args.sessions:,} sessions,"
          f" {size_mib(args.db):.0f} MiB; load {os.getloadavg()[0]:.1f}")
    if args.fill_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        sock = f"{tmp}/d.sock"
        if args.beside_only:
            proc, _ = start(args.db, sock, args.readers)
            try:
                beside(sock, args.n)
            finally:
                stop(proc)
            return
        restarts = []
        for _ in range(3):
            proc, seconds = start(args.db, sock)
            restarts.append(seconds * 1e3)
            stop(proc)
        print(f"restart, spawn to first ping: {', '.join(f'{s:.0f}' for s in restarts)} ms")
        proc, _ = start(args.db, sock, args.readers)
        try:
            conn = Conn(sock)
            print(f"{'call':45} {'p50 ms':>9} {'p99 ms':>9}")
            for name, call in calls(conn, args.events, args.sessions):
                n = args.n if "compact" not in name else max(5, args.n // 20)
                p50, p99 = timed(n, call)
                print(f"{name:45} {p50:9.3f} {p99:9.3f}", flush=True)
            beside(sock, args.n)
            print(f"daemon peak RSS {peak_rss_mb(proc.pid):.0f} MB")
        finally:
            stop(proc)
        store_calls(args.db)
        print(f"log verify: {cli_seconds(args.db, 'verify'):.2f} s")
        if not is_server(args.db):  # a server's log is backed up by its own tool
            print(f"log backup: {cli_seconds(args.db, 'backup', f'{tmp}/copy.db'):.2f} s")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
