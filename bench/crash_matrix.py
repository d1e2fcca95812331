"""The kill -9 durability trial, repeated: no acknowledged append is ever lost.

Each trial starts ``streamd serve --socket`` on a fresh database, pipelines
appends from one client (``--inflight`` unanswered at a time, so commits are
grouped and a batch is nearly always being fsynced), and SIGKILLs the daemon the
moment a randomly chosen number of acknowledgements has arrived (plus up to
2 ms). A second daemon then opens the same file and reads it back with
``eventlog/since``. The trial passes when:

* every acknowledged append is stored exactly once, with the seq its
  acknowledgement named and the content that was sent ("acknowledged" means the
  client received the answer: an answer the daemon wrote just before it died
  counts);
* nothing is stored that was not sent, and what was sent but not acknowledged is
  either stored whole or absent;
* the stored seqs are 1, 2, ... n: increasing and without gaps (one writer, no
  deletes and no conflicts here, so a gap could only be a lost commit).

Usage::

    .venv/bin/python bench/crash_matrix.py [--trials 50] [--appends 2000]
        [--inflight 200] [--synchronous FULL|NORMAL] [--seed N] [--workdir DIR]

One line per trial, then totals and a final PASS/FAIL line; exit status 1 on any
loss, duplicate or mismatch. The daemon and client helpers are the event-log
bench's (``bench/eventlog_bench.py``).
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio
from eventlog_wire import Conn, Daemon, Frame, kill_leftovers


class StoredEvent(msgspec.Struct):
    id: str
    content: Any


class StoredEntry(msgspec.Struct):
    seq: int
    event: StoredEvent


class StoredPage(msgspec.Struct):
    entries: list[StoredEntry]
    next_seq: int
    caught_up: bool


class Ack(msgspec.Struct):
    seq: int
    duplicate: bool


_decode_ack = msgspec.json.Decoder(Ack).decode


@dataclass
class Trial:
    number: int
    sent: dict[str, Any] = field(default_factory=dict)  # event id -> content, in send order
    acked: dict[str, int] = field(default_factory=dict)  # event id -> seq it was given
    errors: int = 0
    kill_after: int = 0
    exit_code: int | None = None
    stored: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    gapless: bool = True

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.mismatched or self.unexpected or self.errors
        ) and self.gapless

    def line(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (
            f"trial {self.number:>3}: killed after {len(self.acked):>5} acks"
            f" ({len(self.sent):>5} sent, exit {self.exit_code}), stored {self.stored:>5},"
            f" lost {len(self.lost)}, duplicated {len(self.duplicated)},"
            f" mismatched {len(self.mismatched)}, unexpected {len(self.unexpected)},"
            f" errors {self.errors}, seqs {'gapless' if self.gapless else 'WITH GAPS'}: {verdict}"
        )


def _appends(trial: Trial) -> Iterator[dict[str, Any]]:
    i = 0
    while True:
        event_id = f"t{trial.number}-{i}"
        content = {"trial": trial.number, "i": i, "text": f"event {i} of trial {trial.number}"}
        trial.sent[event_id] = content
        yield {
            "app": "crash",
            "user": "u",
            "session": f"s{i % 4}",
            "event": {"id": event_id, "author": "agent", "content": content},
        }
        i += 1


async def _connect(daemon: Daemon, nursery: trio.Nursery) -> Conn:
    """A client of ``daemon`` whose reader ends quietly when the daemon is killed
    (its socket is then reset rather than closed)."""
    assert daemon.socket is not None
    with trio.fail_after(30):
        while True:
            try:
                # The socket file appears at bind, a moment before the daemon listens.
                stream = await trio.open_unix_socket(str(daemon.socket))
                break
            except OSError:
                await trio.sleep(0.01)
    conn = Conn(stream, stream)

    async def read() -> None:
        try:
            await conn.run()
        except trio.BrokenResourceError:
            pass  # reset by a killed daemon: conn.closed is set all the same

    nursery.start_soon(read)
    return conn


async def _append_until_killed(trial: Trial, args: argparse.Namespace, work: Path) -> None:
    rng = random.Random(args.seed * 1_000_003 + trial.number)
    trial.kill_after = rng.randrange(1, args.appends)
    reached = trio.Event()

    def on_answer(params: Any, frame: Frame) -> None:
        if frame.error is not None or not len(frame.result):
            trial.errors += 1
            return
        trial.acked[params["event"]["id"]] = _decode_ack(frame.result).seq
        if len(trial.acked) >= trial.kill_after:
            reached.set()

    daemon = Daemon(
        work / f"t{trial.number}.db",
        synchronous=args.synchronous,
        socket=work / f"t{trial.number}-a.sock",
        log=work / "daemon.log",
    )
    async with trio.open_nursery() as nursery:
        await daemon.start(nursery)
        assert daemon.proc is not None
        conn = await _connect(daemon, nursery)

        async def kill() -> None:
            await reached.wait()
            await trio.sleep(rng.uniform(0, 0.002))
            assert daemon.proc is not None
            daemon.proc.kill()  # SIGKILL

        nursery.start_soon(kill)
        with trio.CancelScope() as appending:

            async def stop_when_gone() -> None:
                await conn.closed.wait()
                appending.cancel()

            nursery.start_soon(stop_when_gone)
            try:
                await conn.pipeline(
                    "eventlog/append", _appends(trial), args.appends, args.inflight, on_answer
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # the daemon died under the client: expected
        reached.set()  # every append answered before the threshold: kill now
        with trio.fail_after(30):
            trial.exit_code = await daemon.proc.wait()
        nursery.cancel_scope.cancel()


async def _verify(trial: Trial, args: argparse.Namespace, work: Path) -> None:
    daemon = Daemon(
        work / f"t{trial.number}.db",
        synchronous=args.synchronous,
        socket=work / f"t{trial.number}-b.sock",
        log=work / "daemon.log",
    )
    stored: list[StoredEntry] = []
    async with trio.open_nursery() as nursery:
        await daemon.start(nursery)
        conn = await _connect(daemon, nursery)
        cursor = 0
        while True:
            page, _, _ = await conn.call(
                "eventlog/since", {"from_seq": cursor, "limit": 10_000}, StoredPage
            )
            stored.extend(page.entries)
            cursor = page.next_seq
            if page.caught_up:
                break
        await daemon.stop()
        nursery.cancel_scope.cancel()

    trial.stored = len(stored)
    counts = collections.Counter(e.event.id for e in stored)
    by_id = {e.event.id: e for e in stored}
    trial.duplicated = sorted(i for i, n in counts.items() if n > 1)
    trial.unexpected = sorted(i for i in counts if i not in trial.sent)
    for event_id, seq in trial.acked.items():
        entry = by_id.get(event_id)
        if entry is None:
            trial.lost.append(event_id)
        elif entry.seq != seq or entry.event.content != trial.sent[event_id]:
            trial.mismatched.append(event_id)
    for event_id, entry in by_id.items():  # stored without an ack: must be whole
        unacked = event_id in trial.sent and event_id not in trial.acked
        if unacked and entry.event.content != trial.sent[event_id]:
            trial.mismatched.append(event_id)
    trial.gapless = [e.seq for e in stored] == list(range(1, len(stored) + 1))


async def run(args: argparse.Namespace, work: Path) -> list[Trial]:
    trials = []
    for number in range(1, args.trials + 1):
        trial = Trial(number)
        await _append_until_killed(trial, args, work)
        await _verify(trial, args, work)
        print(trial.line(), flush=True)
        trials.append(trial)
        for leftover in work.glob(f"t{number}*"):  # its database, WAL and sockets
            leftover.unlink(missing_ok=True)
    return trials


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="default 50: about a minute")
    parser.add_argument("--appends", type=int, default=2000, help="sent per trial (default 2000)")
    parser.add_argument("--inflight", type=int, default=200, help="unanswered at a time")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--seed", type=int, default=1, help="picks each trial's kill moment")
    parser.add_argument("--workdir", type=Path, help="where the databases go (default: a temp dir)")
    args = parser.parse_args()
    if args.trials < 1 or args.appends < 2 or args.inflight < 1:
        parser.error("--trials and --inflight must be at least 1, --appends at least 2")
    work = Path(tempfile.mkdtemp(prefix="streamd-crash-matrix-", dir=args.workdir))
    print(
        f"crash matrix: {args.trials} trials, {args.appends} appends each,"
        f" {args.inflight} in flight, synchronous={args.synchronous}, seed {args.seed}",
        flush=True,
    )
    try:
        trials = trio.run(run, args, work)
    finally:
        kill_leftovers()
        shutil.rmtree(work, ignore_errors=True)
    acked = sum(len(t.acked) for t in trials)
    lost = sum(len(t.lost) for t in trials)
    duplicated = sum(len(t.duplicated) for t in trials)
    mismatched = sum(len(t.mismatched) + len(t.unexpected) for t in trials)
    gaps = sum(not t.gapless for t in trials)
    errors = sum(t.errors for t in trials)
    failed = sum(not t.ok for t in trials)
    print(
        f"trials {len(trials)}, acknowledged appends {acked}, losses {lost},"
        f" duplicates {duplicated}, mismatches {mismatched}, trials with seq gaps {gaps},"
        f" error answers {errors}"
    )
    print(f"{'PASS' if not failed else 'FAIL'}: {failed} of {len(trials)} trials failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
