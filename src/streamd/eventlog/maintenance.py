"""``streamd log backup DEST`` and ``streamd log verify``: the safe way to copy
a live log, and a check of one (live, or a copy before it is restored).

Both open the database directly, as the other ``streamd log`` commands do,
beside a running daemon if there is one, and refuse a path that holds no log
(they never create one). Restoring is not a command: it is stop the daemon,
put the file in place, start it (docs/operations.md says why and how).

Exit status. backup: 0 the copy is complete and checked, 2 it could not be
made (nothing is left at DEST). verify: 0 no problem found, 1 problems found
(one per line on stdout), 2 the check could not run (no log there, an
unreadable file, a server that cannot be reached).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import outcome

from streamd.cli import args as cliargs
from streamd.cli.args import command
from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.dbtarget import classify, resolve_db_path
from streamd.eventlog.dbtarget import describe as db_description
from streamd.eventlog.mysql import url as mysql_url
from streamd.eventlog.sqlite.schema import SCHEMA_VERSION
from streamd.eventlog.store.verify import Report

__all__ = ["COMMANDS", "add_parsers", "run"]

COMMANDS = ("backup", "verify")

_T = TypeVar("_T")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = command(sub, "backup", "copy the live log, consistently, to a new file",
                parents=[common])
    # SQLite names files in UTF-8: other bytes are refused as the line is read,
    # as is an empty name (a path of "" is the current directory).
    p.add_argument("dest", metavar="DEST", type=cliargs.nonempty,
                   help="the new file (must not exist)")
    # For the bench that chose the default; not for people.
    p.add_argument("--method", choices=("backup", "vacuum"), default="backup",
                   help=argparse.SUPPRESS)
    command(sub, "verify", "check that the log's seqs, event ids and state agree "
            "(exit 0 ok, 1 problems, 2 error)", parents=[common])


def run(args: argparse.Namespace) -> int:
    path = resolve_db_path(args.db)
    try:
        if args.log_command == "backup":
            return _backup(path, args)
        return _verify(path, args)
    except RpcError as exc:
        from streamd.eventlog import dbtarget

        return cliargs.fail(dbtarget.named_in(exc.message, args.db), cliargs.ERROR)


def _where_ctrl_c_reaches(check: Callable[[], _T]) -> _T:
    """``check()`` on a thread of its own, waited for in the main thread,
    where Ctrl-C raises. The MySQL client waiting on a server that accepts
    and never answers retries its read when the signal interrupts it, never
    returning to Python to raise it: with ``connect_timeout=0`` Ctrl-C never
    ended the command. The thread is left to end with the process."""
    done = threading.Event()
    box: list[outcome.Outcome[_T]] = []

    def run() -> None:
        box.append(outcome.capture(check))
        done.set()

    threading.Thread(target=run, name="streamd-verify", daemon=True).start()
    done.wait()
    return box[0].unwrap()


def _backup(path: Path | str, args: argparse.Namespace) -> int:
    if isinstance(path, str) and path.startswith(mysql_url.SCHEMES):
        return cliargs.fail(
            f"the event log is in MySQL ({db_description(path)}): back it up with the"
            " server's own tool, for example\n"
            "  mariadb-dump --single-transaction DATABASE > events.sql"
            " (mysqldump on MySQL)\nand restore it with the mariadb client", cliargs.ERROR)
    if isinstance(path, str):
        return cliargs.fail(
            f"the event log is in PostgreSQL ({db_description(path)}): back it up with"
            " PostgreSQL's own tool, for example\n"
            "  pg_dump --format=custom --schema=streamd --file=events.dump 'DBNAME-OR-URL'\n"
            "and restore it with pg_restore (see docs/operations.md)", cliargs.ERROR)
    from streamd.eventlog.sqlite import backup

    done: backup.BackupResult | None = None
    try:
        with _sqlite_log(path) as (store, unchanged):
            done = backup.snapshot(store.connection, args.dest, args.method,
                                   before_publish=unchanged)
    except RpcError:
        if done is not None:
            # Only a log read lock-free off a read-only view fails after its
            # copy was put at DEST (it changed in the moment between): the copy
            # may hold pages read mid-write, and the exit status promises
            # nothing at DEST.
            Path(done.dest).unlink(missing_ok=True)
        raise
    if args.json:
        _out(msgspec.json.encode({
            "dest": done.dest, "events": done.events, "newest_seq": done.newest_seq,
            "bytes": done.bytes, "seconds": round(done.seconds, 3),
        }).decode())
    else:
        _out(f"backed up {_count(done.events, 'event')} (newest seq {done.newest_seq}) to"
             f" {done.dest}:"
             f" {done.bytes / 2**20:.1f} MiB in {done.seconds:.2f} s")
    return 0


def _verify(path: Path | str, args: argparse.Namespace) -> int:
    if isinstance(path, str) and path.startswith(mysql_url.SCHEMES):
        from streamd.eventlog.mysql import checks as mysql_checks

        report = _where_ctrl_c_reaches(lambda: mysql_checks.verify(path))
    elif isinstance(path, str):
        from streamd.eventlog.postgres import checks as pg_checks

        report = _where_ctrl_c_reaches(lambda: pg_checks.verify(path))
    else:
        from streamd.eventlog.sqlite import checks as sqlite_checks

        try:
            with _sqlite_log(path) as (store, _):
                report = sqlite_checks.verify(store)
        except RpcError as exc:
            # A file too damaged to open or to read through (a copy cut short
            # by a full disk) is what verify is for: a finding, not a check
            # that could not run. A failing disk (an errno) still is one.
            if not _damaged(exc):
                raise
            report = Report(problems=[f"file: {exc.message}"])
    where = db_description(path)
    if args.json:
        _out(msgspec.json.encode({
            "ok": report.ok, "problems": report.problems, "events": report.events,
            "sessions": report.sessions, "newest_seq": report.newest_seq,
        }).decode())
    else:
        for line in report.problems:
            _out(line)
    if report.ok:
        if not args.json:
            _out(f"ok: {where}: {_count(report.events, 'event')}, newest seq"
                 f" {report.newest_seq}, {_count(report.sessions, 'session')}")
        return 0
    print(f"streamd: {_count(len(report.problems), 'problem')} found in {where}", file=sys.stderr)
    return 1


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _damaged(exc: RpcError) -> bool:
    """Whether SQLite found a database's content damaged (with no failing read
    of the file system behind it). A file that is no database at all (another
    file named by mistake) is not a damaged log: that check could not run."""
    data = exc.data if isinstance(exc.data, dict) else {}
    return data.get("sqlite_error") == "CorruptError" and "errno" not in data


@contextmanager
def _sqlite_log(path: Path) -> Iterator[tuple[Any, Callable[[], None]]]:
    """The log at ``path`` opened to be read, and what raises if what was read
    from it cannot be trusted. On a read-only file system it is read as the
    snapshot it is (:mod:`streamd.eventlog.sqlite.frozen`: a backup or a check
    of a log kept on a read-only mount is what these commands are for), and
    that is whether the file changed meanwhile; otherwise nothing."""
    from streamd.eventlog.sqlite import SqliteStore, frozen

    if (why := classify(path).holds_no_log()) is not None:
        raise RpcError(SOURCE_UNAVAILABLE, f"no event log at {path}{why} (use --db PATH or set"
                       " STREAMD_DB)")
    try:
        store = SqliteStore.open(str(path), migrate=False)
    except RpcError as exc:
        if not frozen.on_read_only_file_system(exc):
            raise
        with frozen.read_frozen(str(path)) as read:
            _check_version(path, read.store)
            yield read.store, read.check
        return
    with closing(store):
        _check_version(path, store)
        yield store, lambda: None


def _check_version(path: Path, store: Any) -> None:
    # These commands read the file as it is (never migrate it: a backup or a
    # check must not write the log), so a file of another version is named
    # with what to run, not only refused.
    version = store.connection.pragma("user_version")
    if version < SCHEMA_VERSION:
        raise RpcError(SOURCE_UNAVAILABLE, f"{path} has schema version {version}, older than"
                       f" this streamd's {SCHEMA_VERSION}: `streamd log --db {path} ping`"
                       " upgrades it (it is then refused by older streamd versions)")
    if version > SCHEMA_VERSION:
        raise RpcError(SOURCE_UNAVAILABLE, f"{path} has schema version {version}, newer than"
                       f" this streamd understands ({SCHEMA_VERSION}): use the streamd that"
                       " wrote it, or a newer one")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
