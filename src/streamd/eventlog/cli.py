"""``streamd log``: the event log for people (and, with ``--json``, for programs).

The commands open the database file directly (``--db``, else ``$STREAMD_DB``,
else ``$XDG_STATE_HOME/streamd/events.db``); no daemon needs to run, and a running
daemon sees what they write. Readable output is one line per entry or item;
``--json`` prints the same objects the JSON-RPC methods return, and one entry
object per line for ``since`` and ``tail`` so output can be streamed.

One shape: a session is always addressed by ``--app``, ``--user`` and
``--session``, the same flags the read commands filter by, whether a command
needs all three (``append``, ``sessions get``, ``sessions delete``), some
(``sessions create`` makes up a session id, ``sessions list`` wants an app) or
none (``since``, ``tail``, ``branches``, ``locks``: they narrow what is shown).
No command takes a positional argument, so flags go in any order, and one
flag means the same thing in every command.

Commands that only read refuse to create a log that does not exist: asking an
empty path for history is far more often a wrong ``--db`` than a wish for an
empty file. ``tail`` follows like ``tail -f`` (it prints the last ``-n`` entries,
then new ones as they are committed, by this or any process) until Ctrl-C, which
ends it with status 130 as it ends every command, or SIGTERM, a normal stop (0).

``--json`` prints JSON Lines: one compact object per line, an entry per line for
``since`` and ``tail``, one object with what the readable line says for the
others (docs/cli.md has every shape).

Errors follow :mod:`streamd.cli.args`: one line ``streamd: ...``; exit 1 when the
session asked for does not exist, 2 for any other error, whether of the command
line (values are checked as they are parsed, so the message names the flag, not
the request field it becomes) or answered by the log (a conflict, a database
that cannot be opened or created).
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

from streamd.cli import args as cliargs
from streamd.cli.args import command, count, instant_utc, nonempty, positive, text
from streamd.errors import INVALID_PARAMS, SOURCE_UNAVAILABLE, RpcError, is_session_not_found
from streamd.eventlog import dbtarget, maintenance
from streamd.eventlog.log import EventLog
from streamd.eventlog.model import (
    Entry,
    Event,
    Filter,
    SessionTree,
)
from streamd.eventlog.printing import (
    CONTENT_WIDTH,
    boot_line,
    entry_line,
    json_line,
    lease_line,
    out,
    print_session,
    session_line,
)

__all__ = ["build_parser", "main"]

_SHAPE = "a session is given as --app A --user U --session S"


# --- argument parsing -----------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    # SUPPRESS: given after the subcommand, these override the same options given
    # before it; absent, they leave the earlier value alone.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, metavar="DB",
                        help="event log database: a file path, a postgresql:// or mysql://"
                        " URL, or a libpq string (default $STREAMD_DB, else "
                        "$XDG_STATE_HOME/streamd/events.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON objects (one per line) instead of lines for people")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log what happens to stderr")
    return common


def _address(p: argparse.ArgumentParser, *, app: bool, user: bool, session: bool,
             session_help: str = "the session id") -> None:
    """The session's address: the same three flags everywhere, required where
    the command needs them."""
    g = p.add_argument_group("the session")
    g.add_argument("--app", type=nonempty, required=app, help="the application name")
    g.add_argument("--user", type=nonempty, required=user, help="the user id")
    g.add_argument("--session", type=nonempty, required=session, help=session_help)


def _filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters (all AND together)")
    g.add_argument("--app", type=nonempty, help="only this application's entries")
    g.add_argument("--user", type=nonempty, help="only this user's entries")
    g.add_argument("--session", type=nonempty, help="only this session's entries")
    g.add_argument(
        "--tree", type=nonempty, metavar="PARENT",
        help="PARENT and its PARENT:sub:* sessions (needs --app and --user)",
    )
    g.add_argument(
        "--branch",
        action="append",
        type=text,
        metavar="PREFIX",
        help="branch PREFIX, PREFIX.* or PREFIX/* (repeat for any of several)",
    )
    g.add_argument("--author", type=text, help="only entries by exactly this author")
    g.add_argument("--author-suffix", type=text, default="", metavar="SUFFIX",
                   help="only entries whose author ends with SUFFIX")


def build_parser(prog: str = "streamd log") -> argparse.ArgumentParser:
    parser = cliargs.Parser(
        prog=prog, description="The durable event log, read and written in place.",
        epilog=f"One shape: {_SHAPE}, in every command that names one; the read "
        "commands take the same flags as filters. Exit 0 success, 1 the session asked for "
        "does not exist, or verify found problems, 2 an error, 130 interrupted (tail: "
        "Ctrl-C; SIGTERM ends it with 0). --json prints JSON Lines, one compact object a line.",
    )
    parser.add_argument("--db", default=None, metavar="DB",
                        help="event log database: a file path, a postgresql:// or mysql://"
                        " URL, or a libpq string (default $STREAMD_DB, else "
                        "$XDG_STATE_HOME/streamd/events.db)")
    parser.add_argument("--json", action="store_true", default=False,
                        help="print JSON objects (one per line) instead of lines for people")
    parser.add_argument("-v", "--verbose", action="store_true", default=False,
                        help="log what happens to stderr")
    # Accepted here for `streamd --watch-interval-ms 50 log tail`; tail's own wins.
    parser.add_argument("--watch-interval-ms", type=positive, default=argparse.SUPPRESS,
                        metavar="MS", help="how often tail polls for other processes' "
                        "appends without inotify (tail only; default 200)")
    common = _common()
    sub = parser.add_subparsers(dest="log_command", metavar="COMMAND", required=True)

    p = command(sub, "append", "append one event", parents=[common], hint=_SHAPE)
    _address(p, app=True, user=True, session=True)
    g = p.add_argument_group("the event")
    g.add_argument("--author", type=text, required=True, help="who wrote it (user, agent, a tool)")
    content = g.add_mutually_exclusive_group()
    content.add_argument("--text", type=text, help="content as a plain string (this or --content)")
    content.add_argument("--content", type=text, metavar="JSON", help="content as JSON, such as "
                         "'{\"text\": \"hi\"}' (this or --text)")
    g.add_argument("--id", type=nonempty, help="event id, which makes a retry safe "
                   "(default: a new random id)")
    g.add_argument("--branch", type=text, default="", help="branch label (default: none)")
    g.add_argument("--invocation-id", type=text, default="", metavar="ID",
                   help="the invocation that produced it (default: none)")
    g.add_argument("--timestamp", type=instant_utc, metavar="TIME",
                   help="when it happened: RFC 3339, a date, 2h, yesterday (default: now)")
    g.add_argument("--meta", action="append", type=text, default=[], metavar="KEY=VALUE",
                   help="a metadata pair (repeat for several)")

    p = command(sub, "since", "print entries after a seq", parents=[common])
    p.add_argument("--from", dest="from_seq", type=count, default=0, metavar="SEQ",
                   help="print entries after SEQ (default 0: from the start)")
    p.add_argument("--limit", type=positive, metavar="N", help="stop after N entries")
    _no_truncate(p)
    _filters(p)

    p = command(sub, "tail", "print the newest entries, then follow (Ctrl-C ends it)",
                parents=[common])
    p.add_argument("-n", "--lines", type=count, default=10, metavar="N",
                   help="entries to show first (default 10)")
    p.add_argument("--from", dest="from_seq", type=count, metavar="SEQ",
                   help="start after SEQ instead (then -n is ignored)")
    p.add_argument("--watch-interval-ms", type=positive, default=argparse.SUPPRESS,
                   metavar="MS", help="how often to poll for other processes' appends "
                   "without inotify (default 200)")
    _no_truncate(p)
    _filters(p)

    p = command(sub, "branches", "list distinct branch labels", parents=[common])
    p.add_argument("--limit", type=positive, metavar="N", help="list at most N")
    _filters(p)

    p = command(sub, "sessions", "list, get, create or delete sessions", parents=[common])
    ss = p.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    q = command(ss, "list", "list an application's sessions", parents=[common],
                hint="sessions are listed by --app A, and --user U for one user's")
    _address_list(q)
    q = command(ss, "get", "print a session, its state and its events", parents=[common],
                hint=_SHAPE)
    _address(q, app=True, user=True, session=True)
    q.add_argument("--after-seq", type=count, default=0, metavar="SEQ",
                   help="only events after SEQ (default 0)")
    q.add_argument("--recent", type=positive, metavar="N", help="only the newest N events")
    _no_truncate(q)
    q = command(ss, "create", "create a session (an id is made up unless --session)",
                parents=[common], hint=_SHAPE)
    _address(q, app=True, user=True, session=False,
             session_help="the session id (default: a new random id)")
    q.add_argument("--state", type=text, metavar="JSON", help="initial state, a JSON object")
    q = command(ss, "delete", "delete a session and its events", parents=[common],
                hint=_SHAPE)
    _address(q, app=True, user=True, session=True)

    p = command(sub, "locks", "list session leases", parents=[common])
    p.add_argument("--app", type=nonempty, help="only this application's leases")
    p.add_argument("--user", type=nonempty, help="only this user's leases")

    p = command(sub, "boots", "list recorded boots", parents=[common])
    p.add_argument("--since", type=instant_utc, metavar="TIME",
                   help="boots at or after TIME: RFC 3339, a date, 2h, yesterday "
                   "(default: 24 hours ago)")

    command(sub, "ping", "check that the log can be read", parents=[common])
    maintenance.add_parsers(sub, common)
    return parser


def _no_truncate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-truncate", action="store_true",
                   help=f"print long content whole (default: cut at {CONTENT_WIDTH} "
                   "characters); --json never cuts")
    cliargs.renamed(p, "--full", "--no-truncate")


def _address_list(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the sessions")
    g.add_argument("--app", type=nonempty, required=True, help="the application name")
    g.add_argument("--user", type=nonempty, help="only this user's sessions")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, or the one line of a usage error
        return exc.code if isinstance(exc.code, int) else 2
    if "watch_interval_ms" in vars(args) and args.log_command != "tail":
        return cliargs.fail("--watch-interval-ms applies to log tail only", 2)
    if args.log_command == "append" and args.text is None and args.content is None:
        # An event without content is legal on the wire, but from a person it
        # is a forgotten flag far more often than a wish.
        return cliargs.fail("log append needs the event's content: --text TEXT or "
                            "--content JSON (see 'streamd log append --help')", 2)
    # Before anything opens: a password on the command line is in ps now, and
    # a database string that names nothing served must not become a file.
    if (refused := dbtarget.usage_error(args.db)) is not None:
        return cliargs.fail(refused, 2)
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="streamd %(asctime)s %(levelname)s %(message)s")
    if args.log_command in maintenance.COMMANDS:
        return maintenance.run(args)
    return run(args)


# --- running ------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        return trio.run(_dispatch, args)
    except BaseException as exc:  # every way out is one line, or a status
        return _ended(_unwrap(exc), args)


def _unwrap(exc: BaseException) -> BaseException:
    """The one error inside Trio's nursery groups (tail runs in a nursery)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _ended(exc: BaseException, args: argparse.Namespace) -> int:
    if isinstance(exc, cliargs.UsageError):
        return cliargs.fail(str(exc), 2)
    if isinstance(exc, RpcError):
        message, code = _human(exc, args.db)
        return cliargs.fail(message, code)
    if cliargs.interrupted(exc):
        return cliargs.INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        # The reader went away (`| head`): not an error. Point stdout at /dev/null
        # so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if isinstance(exc, OSError):
        # Creating the file (or its directory) failed before the log could say so.
        path = dbtarget.describe(args.db)
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != path else ""
        return cliargs.fail(f"cannot create the event log {path}: {exc.strerror or exc}"
                            f"{where}; give --db a path you can write", 2)
    raise exc


# The request fields a flag becomes, for the rare value only the log checks.
_FLAG_OF = {
    "app": "--app", "user": "--user", "session": "--session", "id": "--id",
    "author": "--author", "timestamp": "--timestamp", "from_seq": "--from",
    "limit": "--limit", "after_seq": "--after-seq", "recent": "--recent",
    "parent": "--tree", "branch": "--branch", "state": "--state",
}
def _human(exc: RpcError, db: str | None = None) -> tuple[str, int]:
    """An error of the log said the way a person would, and its exit status.

    The wire's vocabulary stays out: no code names, no ``$.path``; a value
    the log refused is named by its flag (and is a usage error); a fault of
    the database names it (``db``: the flag as given)."""
    if (named := dbtarget.named_in(exc.message, db)) != exc.message:
        return named, 2
    if is_session_not_found(exc) and isinstance(exc.data, dict):
        d = exc.data
        return (f"session {d.get('app')}/{d.get('user')}/{d.get('session')} not found",
                cliargs.NOT_FOUND)
    if exc.code == INVALID_PARAMS and isinstance(exc.data, dict) and "session" in exc.data:
        d = exc.data  # sessions create of one that exists
        return f"session {d.get('app')}/{d.get('user')}/{d.get('session')} already exists", 2
    if exc.code == INVALID_PARAMS and cliargs.names_a_field(exc.message):
        return cliargs.said_of_flag(exc.message, _FLAG_OF), 2
    return exc.message, 2


_READS = {"since", "tail", "branches", "locks", "boots", "ping"}


async def _dispatch(args: argparse.Namespace) -> int:
    target = dbtarget.resolve(args.db)
    reading = args.log_command in _READS or (
        args.log_command == "sessions" and args.sessions_command != "create"
    )
    if reading and (why := target.holds_no_log()) is not None:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"no event log at {target.description}{why} (use --db PATH or set STREAMD_DB)",
        )
    interval = getattr(args, "watch_interval_ms", 200) / 1000
    # The flag as given, not ``target``: a database from $STREAMD_DB (which may
    # hold a password; only a command line shows in ps) must reach the log as unset.
    async with EventLog(args.db, watch_interval=interval) as log:
        handler = _COMMANDS[args.log_command]
        return await handler(log, args)






# --- commands ---------------------------------------------------------------------------


async def _append(log: EventLog, args: argparse.Namespace) -> int:
    if args.content is not None:
        content: Any = _parse_json(args.content, "--content")
    else:
        content = args.text
    metadata = dict(_key_value(kv) for kv in args.meta) or None
    event = Event(
        id=args.id or uuid.uuid4().hex,
        author=args.author,
        content=content,
        branch=args.branch,
        invocation_id=args.invocation_id,
        timestamp=args.timestamp,
    )
    result = await log.append(args.app, args.user, args.session, event, metadata)
    if args.json:
        json_line(result)
    else:
        out(f"seq {result.seq}" + (" (duplicate: already appended)" if result.duplicate else ""))
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
    got: list[int] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope, got)
            async with log.watch(start, flt) as watch:
                async for entry in watch:
                    _print_entry(entry, args)
                    sys.stdout.flush()
    # Ctrl-C is how a person ends it (130, as for every command); SIGTERM is
    # how a supervisor stops it, a normal end.
    return cliargs.INTERRUPTED if got == [signal.SIGINT] else 0


async def _cancel_on_signal(signals: Any, scope: trio.CancelScope, got: list[int]) -> None:
    # Received here, closing the log on the way out, rather than as a
    # KeyboardInterrupt that could land anywhere.
    async for signum in signals:
        got.append(signum)
        scope.cancel()
        return


async def _branches(log: EventLog, args: argparse.Namespace) -> int:
    branches = await log.branches(_filter_from(args), args.limit)
    if args.json:
        json_line({"branches": branches})
    else:
        for branch in branches:
            out(branch)
    return 0


async def _sessions(log: EventLog, args: argparse.Namespace) -> int:
    action = args.sessions_command
    if action == "list":
        sessions = await log.list_sessions(args.app, args.user)
        if args.json:
            json_line({"sessions": sessions})
        else:
            for s in sessions:
                out(session_line(s))
    elif action == "get":
        await print_session(log, args.app, args.user, args.session, args.after_seq,
                            args.recent, as_json=args.json, full=args.no_truncate)
    elif action == "create":
        state = _parse_json(args.state, "--state") if args.state is not None else None
        if state is not None and not isinstance(state, dict):
            raise cliargs.UsageError("--state must be a JSON object")
        created = await log.create_session(args.app, args.user, args.session, state)
        if args.json:
            json_line(created)
        else:
            out(session_line(created))
    else:
        # The log's delete is idempotent (a retry must not fail); a person who
        # names a session that never existed has made a typo, and is told so.
        await log.get_session(args.app, args.user, args.session, recent=1)
        await log.delete_session(args.app, args.user, args.session)
        if args.json:
            json_line({"deleted": True, "app": args.app, "user": args.user,
                   "session": args.session})
        else:
            out(f"deleted {args.app}/{args.user}/{args.session}")
    return 0


async def _list_leases(log: EventLog, args: argparse.Namespace) -> int:
    leases = await log.list_locks(args.app, args.user)
    if args.json:
        json_line({"locks": leases})
        return 0
    now = dt.datetime.now(dt.UTC)
    for lease in leases:
        out(lease_line(lease, now))
    return 0


async def _boots(log: EventLog, args: argparse.Namespace) -> int:
    since = args.since or dt.datetime.now(dt.UTC) - dt.timedelta(hours=24)
    boots = await log.recent_boots(since)
    if args.json:
        json_line({"boots": boots})
    else:
        for boot in boots:
            out(boot_line(boot))
    return 0


async def _ping(log: EventLog, args: argparse.Namespace) -> int:
    await log.ping()
    latest = await log.latest_seq()
    if args.json:
        json_line({"ok": True, "db": log.where, "latest_seq": latest})
    else:
        out(f"ok: {log.where} (latest seq {latest})")
    return 0


_COMMANDS: dict[str, Callable[[EventLog, argparse.Namespace], Awaitable[int]]] = {
    "append": _append, "since": _since, "tail": _tail, "branches": _branches,
    "sessions": _sessions, "locks": _list_leases, "boots": _boots, "ping": _ping,
}


# --- parsing and formatting helpers ------------------------------------------------------


def _parse_json(text: str, flag: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise cliargs.UsageError(f"{flag} is not JSON: {exc}") from None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise cliargs.UsageError(f"--meta {text!r} is not KEY=VALUE")
    return key, value


def _filter_from(args: argparse.Namespace) -> Filter | None:
    tree = None
    if args.tree is not None:
        if args.app is None or args.user is None:
            raise cliargs.UsageError("--tree needs --app and --user")
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














def _print_entry(entry: Entry, args: argparse.Namespace) -> None:
    if args.json:
        json_line(entry)
    else:
        out(entry_line(entry, getattr(args, "no_truncate", False)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
