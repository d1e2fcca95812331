"""``streamd log``: the event log for people (and, with ``--json``, for programs).

The commands open the database file directly (``--db``, else ``$STREAMD_DB``,
else ``$XDG_STATE_HOME/streamd/events.db``); no daemon needs to run, and a running
daemon sees what they write. Readable output is one line per entry or item;
``--json`` prints the same objects the JSON-RPC methods return, and one entry
object per line for ``since`` and ``tail`` so output can be streamed.

Commands that only read refuse to create a log that does not exist: asking an
empty path for history is far more often a wrong ``--db`` than a wish for an
empty file. ``tail`` follows like ``tail -f`` (it prints the last ``-n`` entries,
then new ones as they are committed, by this or any process) until Ctrl-C, which
ends it with status 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import trio

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.log import EventLog, resolve_db_path
from streamd.eventlog.model import (
    Boot,
    Entry,
    Event,
    Filter,
    LeaseInfo,
    Session,
    SessionTree,
)
from streamd.timeinput import TimeInputError, parse_datetime

__all__ = ["build_parser", "main"]

_encode = msgspec.json.Encoder().encode
_CONTENT_WIDTH = 160


# --- argument parsing -----------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    # SUPPRESS: given after the subcommand, these override the same options given
    # before it; absent, they leave the earlier value alone.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, help="event log database file")
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    return common


def _filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters (all AND together)")
    g.add_argument("--app")
    g.add_argument("--user")
    g.add_argument("--session")
    g.add_argument(
        "--tree", metavar="PARENT", help="PARENT and its PARENT:sub:* sessions (needs --app/--user)"
    )
    g.add_argument(
        "--branch",
        action="append",
        metavar="PREFIX",
        help="branch PREFIX, PREFIX.* or PREFIX/* (repeat for any of several)",
    )
    g.add_argument("--author")
    g.add_argument("--author-suffix", default="")


def build_parser(prog: str = "streamd log") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="The durable event log.")
    parser.add_argument("--db", default=None, help="event log database file")
    parser.add_argument("--json", action="store_true", default=False)
    common = _common()
    sub = parser.add_subparsers(dest="log_command", metavar="COMMAND", required=True)

    p = sub.add_parser("append", parents=[common], help="append one event")
    p.add_argument("app")
    p.add_argument("user")
    p.add_argument("session")
    p.add_argument("--id", help="event id (default: a new random id)")
    p.add_argument("--author", required=True)
    p.add_argument("--branch", default="")
    p.add_argument("--invocation-id", default="")
    p.add_argument("--timestamp", help="RFC 3339 time (default: now)")
    content = p.add_mutually_exclusive_group()
    content.add_argument("--content", help="content as JSON")
    content.add_argument("--text", help="content as a plain string")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("since", parents=[common], help="print entries after a seq")
    p.add_argument("--from", dest="from_seq", type=int, default=0, metavar="SEQ")
    p.add_argument("--limit", type=int, help="stop after this many entries")
    p.add_argument("--full", action="store_true", help="do not shorten long content")
    _filters(p)

    p = sub.add_parser("tail", parents=[common], help="print the newest entries, then follow")
    p.add_argument("-n", "--lines", type=int, default=10, help="entries to show first (10)")
    p.add_argument("--from", dest="from_seq", type=int, metavar="SEQ", help="start after SEQ")
    p.add_argument("--watch-interval-ms", type=int, default=200)
    p.add_argument("--full", action="store_true")
    _filters(p)

    p = sub.add_parser("branches", parents=[common], help="list distinct branch labels")
    p.add_argument("--limit", type=int)
    _filters(p)

    p = sub.add_parser("sessions", parents=[common], help="list, show, create or delete")
    ss = p.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    q = ss.add_parser("list", parents=[common])
    q.add_argument("app")
    q.add_argument("--user")
    q = ss.add_parser("get", parents=[common])
    q.add_argument("app")
    q.add_argument("user")
    q.add_argument("session")
    q.add_argument("--after-seq", type=int, default=0)
    q.add_argument("--recent", type=int)
    q.add_argument("--full", action="store_true")
    q = ss.add_parser("create", parents=[common])
    q.add_argument("app")
    q.add_argument("user")
    q.add_argument("--session")
    q.add_argument("--state", help="initial state as a JSON object")
    q = ss.add_parser("delete", parents=[common])
    q.add_argument("app")
    q.add_argument("user")
    q.add_argument("session")

    p = sub.add_parser("locks", parents=[common], help="list session leases")
    p.add_argument("--app")
    p.add_argument("--user")

    p = sub.add_parser("boots", parents=[common], help="list recorded boots")
    p.add_argument("--since", help="RFC 3339 time (default: 24 hours ago)")

    sub.add_parser("ping", parents=[common], help="check that the log can be read")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run(args)


# --- running ------------------------------------------------------------------------


class _Usage(Exception):
    """A bad argument found after parsing (a JSON value, a time)."""


def run(args: argparse.Namespace) -> int:
    command = args.log_command
    follow = command == "tail"
    try:
        return trio.run(_dispatch, args)
    except _Usage as exc:
        print(f"streamd log: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:
        print(f"streamd log: {exc.name}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # tail is meant to be stopped this way; a one-shot command was interrupted.
        return 0 if follow else 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Point stdout at /dev/null
        # so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


_READS = {"since", "tail", "branches", "locks", "boots", "ping"}


async def _dispatch(args: argparse.Namespace) -> int:
    path = resolve_db_path(args.db)
    reading = args.log_command in _READS or (
        args.log_command == "sessions" and args.sessions_command != "create"
    )
    if reading and not path.exists():
        raise RpcError(
            SOURCE_UNAVAILABLE, f"no event log at {path} (use --db PATH or set STREAMD_DB)"
        )
    interval = getattr(args, "watch_interval_ms", 200) / 1000
    async with EventLog(path, watch_interval=interval) as log:
        handler = _COMMANDS[args.log_command]
        return await handler(log, args)


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _json(value: Any) -> None:
    _out(_encode(value).decode())


# --- commands ---------------------------------------------------------------------------


async def _append(log: EventLog, args: argparse.Namespace) -> int:
    content: Any = None
    if args.content is not None:
        content = _parse_json(args.content, "--content")
    elif args.text is not None:
        content = args.text
    metadata = dict(_key_value(kv) for kv in args.meta) or None
    event = Event(
        id=args.id or uuid.uuid4().hex,
        author=args.author,
        content=content,
        branch=args.branch,
        invocation_id=args.invocation_id,
        timestamp=_parse_time(args.timestamp, "--timestamp") if args.timestamp else None,
    )
    result = await log.append(args.app, args.user, args.session, event, metadata)
    if args.json:
        _json(result)
    else:
        _out(f"seq {result.seq}" + (" (duplicate: already appended)" if result.duplicate else ""))
    return 0


async def _since(log: EventLog, args: argparse.Namespace) -> int:
    flt = _filter_from(args)
    cursor, left = args.from_seq, args.limit
    while left is None or left > 0:
        page = await log.since(cursor, flt, 1000 if left is None else min(1000, left))
        for entry in page.entries:
            _print_entry(entry, args)
        if left is not None:
            left -= len(page.entries)
        cursor = page.next_seq
        if page.caught_up:
            break
    return 0


async def _tail(log: EventLog, args: argparse.Namespace) -> int:
    flt = _filter_from(args)
    if args.from_seq is not None:
        start = args.from_seq
    elif args.lines <= 0:
        start = await log.latest_seq(flt)
    else:
        oldest_shown = await log.nth_newest_seq(args.lines - 1, flt)
        start = oldest_shown - 1 if oldest_shown else 0
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope)
            async with log.watch(start, flt) as watch:
                async for entry in watch:
                    _print_entry(entry, args)
                    sys.stdout.flush()
    return 0


async def _cancel_on_signal(signals: Any, scope: trio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


async def _branches(log: EventLog, args: argparse.Namespace) -> int:
    branches = await log.branches(_filter_from(args), args.limit)
    if args.json:
        _json({"branches": branches})
    else:
        for branch in branches:
            _out(branch)
    return 0


async def _sessions(log: EventLog, args: argparse.Namespace) -> int:
    action = args.sessions_command
    if action == "list":
        sessions = await log.list_sessions(args.app, args.user)
        if args.json:
            _json({"sessions": sessions})
        else:
            for s in sessions:
                _out(_session_line(s))
    elif action == "get":
        got = await log.get_session(args.app, args.user, args.session, args.after_seq, args.recent)
        if args.json:
            _json(got)
        else:
            _out(_session_line(got) + f"  state {_encode(got.state).decode()}")
            for entry in got.events:
                _print_entry(entry, args)
    elif action == "create":
        state = _parse_json(args.state, "--state") if args.state is not None else None
        if state is not None and not isinstance(state, dict):
            raise _Usage("--state must be a JSON object")
        created = await log.create_session(args.app, args.user, args.session, state)
        if args.json:
            _json(created)
        else:
            _out(_session_line(created))
    else:
        await log.delete_session(args.app, args.user, args.session)
        if args.json:
            _json({})
        else:
            _out(f"deleted {args.app}/{args.user}/{args.session}")
    return 0


async def _locks(log: EventLog, args: argparse.Namespace) -> int:
    leases = await log.list_locks(args.app, args.user)
    if args.json:
        _json({"locks": leases})
        return 0
    now = dt.datetime.now(dt.UTC)
    for lease in leases:
        _out(_lease_line(lease, now))
    return 0


async def _boots(log: EventLog, args: argparse.Namespace) -> int:
    since = (
        _parse_time(args.since, "--since")
        if args.since
        else dt.datetime.now(dt.UTC) - dt.timedelta(hours=24)
    )
    boots = await log.recent_boots(since)
    if args.json:
        _json({"boots": boots})
    else:
        for boot in boots:
            _out(_boot_line(boot))
    return 0


async def _ping(log: EventLog, args: argparse.Namespace) -> int:
    await log.ping()
    if args.json:
        _json({})
    else:
        _out(f"ok: {log.path} (latest seq {await log.latest_seq()})")
    return 0


_COMMANDS: dict[str, Callable[[EventLog, argparse.Namespace], Awaitable[int]]] = {
    "append": _append,
    "since": _since,
    "tail": _tail,
    "branches": _branches,
    "sessions": _sessions,
    "locks": _locks,
    "boots": _boots,
    "ping": _ping,
}


# --- parsing and formatting helpers ------------------------------------------------------


def _parse_json(text: str, flag: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise _Usage(f"{flag} is not JSON: {exc}") from None


def _parse_time(text: str, flag: str) -> dt.datetime:
    try:
        return parse_datetime(text, flag)
    except TimeInputError as exc:
        raise _Usage(str(exc)) from None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise _Usage(f"--meta {text!r} is not KEY=VALUE")
    return key, value


def _filter_from(args: argparse.Namespace) -> Filter | None:
    tree = None
    if args.tree is not None:
        if args.app is None or args.user is None:
            raise _Usage("--tree needs --app and --user")
        tree = SessionTree(app=args.app, user=args.user, parent=args.tree)
    flt = Filter(
        app=None if tree else args.app,
        user=None if tree else args.user,
        session=args.session,
        session_tree=tree,
        branch_prefixes=args.branch,
        author=args.author,
        author_suffix=args.author_suffix,
    )
    return None if flt == Filter() else flt


def _when(t: dt.datetime | None) -> str:
    if t is None:
        return "(unreadable time)"  # a damaged row: see streamd.eventlog.model
    t = t.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _content(content: Any, full: bool) -> str:
    text = content if isinstance(content, str) else _encode(content).decode()
    text = text.replace("\n", "\\n")
    if not full and len(text) > _CONTENT_WIDTH:
        text = text[: _CONTENT_WIDTH - 1] + "…"
    return text


def _print_entry(entry: Entry, args: argparse.Namespace) -> None:
    if args.json:
        _json(entry)
        return
    ev = entry.event
    branch = f" [{ev.branch}]" if ev.branch else ""
    meta = ""
    if entry.metadata:
        meta = "  {" + ", ".join(f"{k}={v}" for k, v in sorted(entry.metadata.items())) + "}"
    _out(
        f"{entry.seq:>7}  {_when(ev.timestamp)}  "
        f"{entry.app}/{entry.user}/{entry.session}{branch}  "
        f"{ev.author}: {_content(ev.content, getattr(args, 'full', False))}{meta}"
    )


def _session_line(s: Session) -> str:
    return (
        f"{s.app}/{s.user}/{s.session}  created {_when(s.created_at)}  "
        f"updated {_when(s.updated_at)}"
    )


def _lease_line(lease: LeaseInfo, now: dt.datetime) -> str:
    beat = lease.heartbeat_at
    age = f"{(now - beat).total_seconds():.1f}s ago" if beat is not None else _when(beat)
    return (
        f"{lease.app}/{lease.user}/{lease.session}  held by {lease.holder}  "
        f"since {_when(lease.acquired_at)}  heartbeat {age}"
    )


def _boot_line(boot: Boot) -> str:
    attempted = "(unreadable)" if boot.attempted is None else ", ".join(boot.attempted) or "-"
    return f"{boot.id:>5}  {_when(boot.boot_at)}  attempted: {attempted}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
