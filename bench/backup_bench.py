"""``streamd log backup`` under a steady writer: how long it takes, and what it
costs the appends that go on meanwhile.

A log of ``--events`` events (bench/workload.py's append, 8 sessions) is built
once; then, per round and per method (one-step online backup, ``VACUUM
INTO``), a writer process appends at full rate through an EventLog
(``--appenders`` concurrent appenders, group commit, synchronous=FULL, as the
daemon does), and after ``--settle`` seconds the backup runs as a user runs it
(``python -m streamd log backup DEST --json``, a process of its own). The
writer records the time of every acknowledged append; the bench reports the
append rate in the ``--settle`` seconds before the backup and during it, and
the backup's own time (what its ``--json`` says) and the command's wall time.
Each copy is then checked with ``streamd log verify``.

    python bench/backup_bench.py --events 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path[:0] = [str(SRC), str(HERE)]


def build(db: Path, events: int) -> None:
    import msgspec
    from workload import append_params

    from streamd.eventlog.model import AppendParams
    from streamd.eventlog.sqlite import SqliteOptions, SqliteStore

    store = SqliteStore.open(str(db), SqliteOptions(synchronous="NORMAL"))
    now_us = int(time.time() * 1e6)
    for start in range(0, events, 1000):
        batch = [msgspec.convert(append_params("base", i), AppendParams)
                 for i in range(start, min(start + 1000, events))]
        store.append_batch(batch, now_us)
    store.close()


def writer(db: str, appenders: int) -> None:
    """Append until stdin closes; then print the monotonic time of each ack."""
    import msgspec
    import trio
    from workload import append_params

    from streamd.eventlog import EventLog
    from streamd.eventlog.model import AppendParams

    acks: list[float] = []

    async def main() -> None:
        async with EventLog(db, synchronous="FULL") as log, trio.open_nursery() as n:
            await log.ping()

            async def appender(k: int) -> None:
                i = 0
                while True:
                    p = msgspec.convert(append_params(f"live{k}", i), AppendParams)
                    await log.requests.append(p)
                    acks.append(time.monotonic())
                    i += 1

            for k in range(appenders):
                n.start_soon(appender, k)
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            n.cancel_scope.cancel()

    trio.run(main)
    print(json.dumps(acks))


def streamd_log(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "streamd", "log", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def one(base: Path, work: Path, method: str, appenders: int, settle: float) -> dict[str, Any]:
    db = work / "ev.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(base, db)
    dest = work / f"copy-{method}.db"
    dest.unlink(missing_ok=True)
    w = subprocess.Popen([sys.executable, __file__, "--writer", str(db),
                          "--appenders", str(appenders)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdout is not None and w.stdin is not None
    assert w.stdout.readline().strip() == "ready"
    time.sleep(settle)  # the baseline window: the writer runs alone
    started = time.monotonic()
    done = streamd_log("--db", str(db), "backup", str(dest), "--json", "--method", method)
    ended = time.monotonic()
    time.sleep(settle / 2)
    w.stdin.close()
    acks = json.loads(w.stdout.read().strip().splitlines()[-1])
    w.wait(60)
    if done.returncode != 0:
        raise SystemExit(f"backup failed: {done.stderr}")
    report = json.loads(done.stdout)
    before = sum(1 for t in acks if started - settle <= t < started) / settle
    during = sum(1 for t in acks if started <= t < ended) / (ended - started)
    verified = streamd_log("--db", str(dest), "verify")
    return {
        "method": method,
        "backup_s": report["seconds"],
        "command_s": round(ended - started, 3),
        "copy_mib": round(report["bytes"] / 2**20, 1),
        "copied_events": report["events"],
        "appends_per_s_before": round(before),
        "appends_per_s_during": round(during),
        "verify_exit": verified.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writer", metavar="DB", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--appenders", type=int, default=32)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.writer:
        writer(args.writer, args.appenders)
        return 0
    with tempfile.TemporaryDirectory(dir=HERE / "data" if (HERE / "data").is_dir() else None) \
            as tmp:
        work = Path(tmp)
        base = work / "base.db"
        t = time.monotonic()
        build(base, args.events)
        print(f"built {args.events} events ({base.stat().st_size / 2**20:.1f} MiB)"
              f" in {time.monotonic() - t:.1f} s", file=sys.stderr)
        rows = []
        for r in range(args.rounds):
            for method in ("backup", "vacuum"):
                row = one(base, work, method, args.appenders, args.settle)
                row["round"] = r
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    print(f"{'method':8} {'backup s':>9} {'command s':>10} {'MiB':>6} "
          f"{'appends/s before':>17} {'during':>8}")
    for method in ("backup", "vacuum"):
        mine = [r for r in rows if r["method"] == method]

        def med(key: str, mine: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in mine)

        print(f"{method:8} {med('backup_s'):9.2f} {med('command_s'):10.2f} "
              f"{med('copy_mib'):6.1f} {med('appends_per_s_before'):17.0f} "
              f"{med('appends_per_s_during'):8.0f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["verify_exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
