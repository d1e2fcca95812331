"""Command line: the daemon by default, plus tools for people.

``streamd`` with no subcommand serves JSON-RPC on stdin/stdout, which is how
a Recall core spawns it; ``streamd attach`` relays the same protocol to the
resident daemon (``streamd daemon``) instead.

Imports at the top are the standard library's lightest only: ``attach``,
``status`` and ``stop`` are dispatched before the parser is even built, and
every command imports what it needs (Trio, msgspec, the daemon) inside the
function that runs it, so ``streamd attach`` and ``streamd --help`` never load
them (``tests/test_resident_imports.py``).

Options and errors follow :mod:`streamd.cliargs`: a mistake is one line
``streamd: ...`` naming the flag or path; exit 2 for a command line that cannot
be read, 1 for what a command finds when it runs. The global options
(``--db``, ``-v``, and the daemon's tuning options) may come before the
command or after it; given before a command they do not apply to, they are
refused rather than ignored.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# Not `from typing import TYPE_CHECKING`: importing typing costs milliseconds
# on every spawn.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from streamd.daemon import Config

DESCRIPTION = (
    "streamd: a Recall stream adapter and a durable event log over newline-delimited "
    "JSON-RPC 2.0. With no subcommand it serves JSON-RPC on stdin/stdout."
)
EPILOG = (
    "Exit status: 0 success, 1 a runtime error (or, for search, no hit), 2 a usage error. "
    "Global options may come before or after the command."
)


LOG_FORMAT = "streamd %(asctime)s %(levelname)s %(message)s"
# The resident daemon's lines carry its pid: an old daemon finishing its
# clients and its successor write the same file for a while.
DAEMON_LOG_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"

# The options that may come before the command, and which commands they mean
# something to. `streamd --db X log ping` is `streamd log --db X ping`.
_VALUE_GLOBALS = ("--db", "--watch-interval-ms", "--watch-buffer-bytes", "--synchronous")
_FLAG_GLOBALS = ("-v", "--verbose")
_DAEMON_GLOBALS = frozenset(_VALUE_GLOBALS + _FLAG_GLOBALS)
_APPLIES = {
    None: _DAEMON_GLOBALS,
    "serve": _DAEMON_GLOBALS,
    "daemon": _DAEMON_GLOBALS,
    "log": frozenset({"--db", "--watch-interval-ms", *_FLAG_GLOBALS}),
    "search": frozenset(_FLAG_GLOBALS),
    "expand": frozenset(_FLAG_GLOBALS),
    "index": frozenset(_FLAG_GLOBALS),
    "demo": frozenset(_FLAG_GLOBALS),
}
# Dispatched before any parser is built (stdlib-only clients, or parsers of their own).
_OWN_PARSERS = ("attach", "status", "stop", "conformance", "log")
# A far deadline: one-shot commands wait for their build, however long it takes.
NO_DEADLINE = "2999-01-01T00:00:00Z"


def _log_level(verbose: bool) -> int:
    import logging

    level = logging.INFO if verbose else logging.WARNING
    if os.environ.get("STREAMD_LOG"):
        level = getattr(logging, os.environ["STREAMD_LOG"].upper(), level)
    return level


def _setup_logging(verbose: bool) -> None:
    from streamd import logsink

    # Through a bounded queue and a writer thread: a stderr nobody reads costs
    # log lines (counted), never a blocked event loop.
    logsink.install(_log_level(verbose), sys.stderr, LOG_FORMAT)


def _verbose(p: argparse.ArgumentParser) -> None:
    import argparse

    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log what happens to stderr (STREAMD_LOG=debug for more)")


def _daemon_options(p: argparse.ArgumentParser) -> None:
    # Every default is SUPPRESS, so `streamd --db X serve` keeps X (a
    # subparser's own default would overwrite what was parsed before it), and
    # an option given before a command it does not apply to can be told from
    # one left out. `_config` supplies the defaults.
    import argparse

    from streamd import cliargs

    p.add_argument("--db", default=argparse.SUPPRESS, metavar="DB",
                   help="event log database: a file path, a postgresql:// URL or a libpq"
                   " string such as 'host=/run/pg dbname=events' (default $STREAMD_DB, else "
                   "$XDG_STATE_HOME/streamd/events.db; a password goes in PGPASSWORD or"
                   " ~/.pgpass, never here)")
    p.add_argument("--watch-interval-ms", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="MS",
                   help="how often watchers poll for other processes' appends where inotify"
                   " is unavailable or STREAMD_NO_INOTIFY=1 (default 200)")
    p.add_argument("--watch-buffer-bytes", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="BYTES",
                   help="what one watch may hold for a client that stops reading (default "
                   "4 MiB); past it for the stall timeout the watch ends with an error "
                   "naming the seq to resume from")
    p.add_argument("--synchronous", choices=["FULL", "NORMAL"], default=argparse.SUPPRESS,
                   help="SQLite synchronous mode for the event log (default FULL: every "
                   "acknowledged append survives power loss)")
    _verbose(p)


def _config(args: argparse.Namespace) -> Config:
    from streamd.daemon import Config

    return Config(db=getattr(args, "db", None),
                  watch_interval=getattr(args, "watch_interval_ms", 200) / 1000,
                  synchronous=getattr(args, "synchronous", "FULL"),
                  watch_buffer_bytes=getattr(args, "watch_buffer_bytes", 4 << 20))


def _recall_options(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument("--workdir", metavar="DIR",
                   help="keep the durable index here and reuse it: later runs read only "
                   "what was appended (created if missing)")
    p.add_argument("--full", action="store_true",
                   help=f"rebuild the index from scratch before {what} (needed to replace "
                   "a --workdir index of other files)")
    p.add_argument("--json", action="store_true",
                   help="print the wire result as JSON instead of lines for people")
    _verbose(p)


def build_parser() -> argparse.ArgumentParser:
    from streamd import __version__, cliargs
    from streamd.cliargs import command

    parser = cliargs.Parser(prog="streamd", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"streamd {__version__}",
                        help="print the version and exit")
    _daemon_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = command(sub, "serve", "serve JSON-RPC on stdio, or on a Unix socket")
    _daemon_options(serve)
    serve.add_argument("--socket", metavar="PATH",
                       help="serve many clients on this Unix socket path (mode 0600)")

    daemon = command(sub, "daemon", "run the resident per-user daemon in the foreground "
                     "(what `streamd attach` starts; for service managers)")
    _daemon_options(daemon)
    daemon.add_argument("--runtime-dir", metavar="DIR",
                        help="the socket directory (default $STREAMD_RUNTIME_DIR, else "
                        "$XDG_RUNTIME_DIR/streamd, else $XDG_STATE_HOME/streamd/run)")
    daemon.add_argument("--idle-exit", type=cliargs.seconds, default=900.0, metavar="SECONDS",
                        help="exit after this long without a client (default 900; 0: never)")
    daemon.add_argument("--source-idle", type=cliargs.seconds, default=600.0,
                        metavar="SECONDS",
                        help="close a Recall source no client has used for this long "
                        "(default 600)")
    daemon.add_argument("--max-sources", type=cliargs.positive, default=8, metavar="N",
                        help="Recall sources kept open at most (default 8)")
    daemon.add_argument("--log-file", metavar="PATH",
                        help="log here, rotated at 5 MiB with 3 old files kept (default "
                        "$XDG_STATE_HOME/streamd/daemon.log; '-' for stderr)")
    # For tests of the upgrade path: announce another version than this one's.
    import argparse

    daemon.add_argument("--announce-version", help=argparse.SUPPRESS)

    sub.add_parser("attach", help="relay stdio to the resident daemon, starting it if "
                   "needed (what Recall should run)", add_help=False)
    sub.add_parser("status", help="whether the resident daemon runs (exit 0) or not (3)",
                   add_help=False)
    sub.add_parser("stop", help="stop the resident daemon", add_help=False)

    search = command(
        sub, "search", "search stream files and print ranked hits",
        usage="streamd search [options] QUERY PATH...\n"
              "       streamd search [options] -e QUERY PATH...",
        epilog="The query comes first, as with grep and rg. A QUERY that names a file (or "
               "ends in .jsonl) is refused, because it is almost always a path typed "
               "first: give it with -e to search for it. Times take RFC 3339, a date "
               "(UTC midnight), a duration before now (2h, 3d) or today/yesterday. "
               "Exit 0 with hits, 1 with none (or an error), 2 for a usage error.")
    search.add_argument("words", nargs="*", metavar="QUERY PATH",
                        help="the query, then one or more JSONL stream files (with -e, "
                        "every word is a file)")
    search.add_argument("-e", "--query", metavar="QUERY",
                        help="the query, given as an option (one that starts with '-', or "
                        "names a file)")
    search.add_argument("--since", type=cliargs.instant, metavar="TIME",
                        help="only records at or after TIME (2026-05-02, 2h, yesterday, "
                        "RFC 3339)")
    search.add_argument("--until", type=cliargs.instant, metavar="TIME",
                        help="only records at or before TIME")
    search.add_argument("--as-of", type=cliargs.instant, metavar="TIME",
                        help="search the stream as it was known at TIME")
    search.add_argument("--limit", type=cliargs.positive, default=10, metavar="N",
                        help="print at most N hits (default 10)")
    _recall_options(search, what="searching")

    expand = command(
        sub, "expand", "print the evidence behind a locator",
        usage="streamd expand [options] LOCATOR PATH...",
        epilog="The locator comes first, as the query does in search: the locator printed "
               "by search (stream:v2/r1, or v2/r1).")
    expand.add_argument("words", nargs="*", metavar="LOCATOR PATH",
                        help="a locator from search, then the stream files it came from")
    expand.add_argument("--detail", choices=["summary", "excerpt", "full", "context"],
                        default="full",
                        help="how much to print: summary, excerpt, full (default) or "
                        "context (the record and its episode)")
    expand.add_argument("--budget", type=cliargs.count, default=0, metavar="BYTES",
                        help="print at most BYTES bytes, marking a cut (default 0: all)")
    _recall_options(expand, what="expanding")

    index = command(sub, "index", "build a workdir's index ahead of time, with progress",
                    usage="streamd index [options] PATH... --workdir DIR")
    index.add_argument("paths", nargs="*", metavar="PATH", help="the JSONL stream files")
    index.add_argument("--workdir", metavar="DIR",
                       help="the workdir the adapter will be initialized with (required; "
                       "created if missing)")
    index.add_argument("--full", action="store_true",
                       help="rebuild from scratch (needed to replace an index of other files)")
    _verbose(index)

    demo = command(sub, "demo", "index a bundled sample stream and show what streamd does")
    _verbose(demo)
    sub.add_parser("conformance", help="verify or record conformance transcripts",
                   add_help=False)
    sub.add_parser("log", help="the durable event log (see 'streamd log --help')",
                   add_help=False)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of ``parser``'s subcommands, by name."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _split_globals(argv: list[str]) -> tuple[list[str], str | None, list[str]] | None:
    """(the global options before the command, the command, what follows it);
    None when the whole parser should read ``argv`` (help, version, a flag
    that wants a value and has none, an option nobody knows)."""
    i, leading = 0, []
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in _VALUE_GLOBALS:
            if "=" in arg:
                leading.append(arg)
                i += 1
                continue
            if i + 1 >= len(argv):
                return None
            leading += argv[i:i + 2]
            i += 2
        elif arg in _FLAG_GLOBALS:
            leading.append(arg)
            i += 1
        elif arg.startswith("-") and arg != "-":
            return None
        else:
            return leading, arg, argv[i + 1:]
    return leading, None, []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The resident daemon's clients come first and import only the stdlib.
    if argv[:1] == ["attach"]:
        from streamd.resident.attach import main as attach_main

        return attach_main(argv[1:])
    if argv[:1] == ["status"]:
        from streamd.resident.control import status_main

        return status_main(argv[1:])
    if argv[:1] == ["stop"]:
        from streamd.resident.control import stop_main

        return stop_main(argv[1:])
    split = _split_globals(argv)
    if split is not None:
        leading, command, rest = split
        if command in _APPLIES or command in _OWN_PARSERS:
            allowed = _APPLIES.get(command, frozenset())
            for opt in leading:
                name = opt.split("=", 1)[0]
                if name.startswith("-") and name not in allowed:
                    return _not_here(name, command)
        if command in _OWN_PARSERS:
            return _own_parser(command, leading + rest)
    return _run_parsed(argv, split)


def _not_here(option: str, command: str | None) -> int:
    from streamd.cliargs import fail

    if command == "attach":
        return fail(f"{option} does not apply to attach: the daemon's options go after "
                    "'streamd attach --'", 2)
    return fail(f"{option} does not apply to {command} (see 'streamd {command} --help')", 2)


def _own_parser(command: str, argv: list[str]) -> int:
    if command == "conformance":
        from streamd.conformance import main as conformance_main

        return conformance_main(argv)
    if command == "log":
        from streamd.eventlog.cli import main as log_main

        return log_main(argv)
    return main([command, *argv])  # attach, status, stop: checked above to have no options


def _run_parsed(argv: list[str], split: tuple[list[str], str | None, list[str]] | None) -> int:
    from streamd.cliargs import UsageError, fail

    parser = build_parser()
    try:
        if split is None or split[1] is None:
            args = parser.parse_args(argv)
        else:
            leading, command, rest = split
            sub = subcommands(parser).get(command)
            if sub is None:
                return fail(f"unknown command {command!r} (see 'streamd --help')", 2)
            args = parser.parse_args(leading)
            # Everything after "--" is a word (a query or path that starts with
            # "-"), and so is the value of -e, as with grep and rg.
            cut = rest.index("--") if "--" in rest else len(rest)
            options, after = rest[:cut], rest[cut + 1:]
            if command == "search":
                options = _query_values(options)
            # Intermixed: options may sit among the paths, as with grep and rg.
            args = sub.parse_intermixed_args(options, namespace=args)
            if after:
                if not hasattr(args, "words"):
                    return fail(f"{command} takes no argument after '--'", 2)
                args.words = [*args.words, *after]
            args.command = command
    except SystemExit as exc:  # --help, --version, or the one line of a usage error
        return exc.code if isinstance(exc.code, int) else 2
    if args.command in (None, "serve", "daemon"):
        from streamd.eventlog import dbtarget

        # Now, not at the first eventlog call: by then a password had shown in
        # ps for as long as the daemon ran, and a database that names nothing
        # served would be found only by the first client to use it.
        if (refused := dbtarget.usage_error(getattr(args, "db", None))) is not None:
            return fail(refused, 2)
    if args.command == "daemon":
        return _resident(args)
    _setup_logging(getattr(args, "verbose", False))
    try:
        if args.command in (None, "serve"):
            return _serve(args)
        if args.command == "search":
            return _search(args)
        if args.command == "expand":
            return _expand(args)
        if args.command == "index":
            return _index(args)
        if args.command == "demo":
            from streamd.demo import run_demo

            return run_demo()
    except UsageError as exc:
        return fail(str(exc), 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Point stdout at
        # /dev/null so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    parser.print_help()
    return 2


def _query_values(argv: list[str]) -> list[str]:
    """``-e -x`` as ``--query=-x``: argparse would take ``-x`` for an option."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("-e", "--query") and i + 1 < len(argv):
            out.append(f"--query={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _serve(args: argparse.Namespace) -> int:
    import trio

    from streamd.cliargs import fail
    from streamd.daemon import Daemon, serve_socket, serve_stdio

    daemon = Daemon(_config(args))
    path = getattr(args, "socket", None)
    try:
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                return fail(f"--socket {path}: there is no directory {parent}")
            try:
                trio.run(serve_socket, daemon, path)
            except OSError as exc:
                return fail(f"--socket {path}: cannot listen there: {exc.strerror or exc}")
        else:
            trio.run(serve_stdio, daemon)
    except KeyboardInterrupt:
        pass  # a signal is how a server is meant to end
    return 0


# --- the resident daemon -----------------------------------------------------


def _resident(args: argparse.Namespace) -> int:
    """``streamd daemon``: claim the socket directory, then serve until stopped.

    A second daemon, or an unsafe directory, is one line on stderr and exit 1,
    before any logging is set up: that is all a losing racer ever prints (its
    stderr is /dev/null when attach started it)."""
    import logging

    import trio

    from streamd import logsink
    from streamd.daemon import Daemon
    from streamd.recall.sources import SourceRegistry
    from streamd.resident import launch, paths
    from streamd.resident.lock import AlreadyRunning
    from streamd.resident.server import ResidentDaemon, ResidentOptions

    directory = os.path.abspath(args.runtime_dir) if args.runtime_dir else paths.runtime_dir()
    log_file = args.log_file or paths.log_path()
    verbose = getattr(args, "verbose", False)

    sources = SourceRegistry(idle_close=args.source_idle, max_open=args.max_sources)
    options = ResidentOptions(runtime_dir=directory, idle_exit=args.idle_exit,
                              log_file="(stderr)" if log_file == "-" else log_file)
    if args.announce_version:
        options.version = args.announce_version
    resident = ResidentDaemon(Daemon(_config(args), sources=sources), options, sources)
    try:
        resident.claim()
    except (AlreadyRunning, paths.UnsafeDirectory, OSError) as exc:
        print(f"streamd daemon: {exc}", file=sys.stderr)
        return 1
    try:
        if log_file == "-":
            logsink.install(_log_level(verbose), sys.stderr, DAEMON_LOG_FORMAT)
        else:
            logsink.install_file(_log_level(verbose), log_file, DAEMON_LOG_FORMAT)
    except OSError as exc:
        resident.release()
        print(f"streamd daemon: cannot open the log file {log_file}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    # Its own comings and goings are worth a line at the default level.
    logging.getLogger("streamd.resident").setLevel(logging.INFO)
    launch.detach_startup_pipe()  # what could stop it from serving was said
    try:
        trio.run(resident.serve)
    except KeyboardInterrupt:
        pass
    return 0


# --- one-shot search, expand and index -----------------------------------------


def _first_and_paths(args: argparse.Namespace, what: str, given: str | None) -> tuple[str, list]:
    """The QUERY (or LOCATOR) and the paths, by the rule that the query comes
    first: a first word that is a file is a path typed in the query's place."""
    from streamd.cliargs import UsageError

    words = list(args.words)
    if given is not None:
        first = given
    elif not words:
        raise UsageError(f"{args.command} needs a {what} and at least one PATH "
                         f"(see 'streamd {args.command} --help')")
    else:
        first = words.pop(0)
        if os.path.isfile(first) or first.endswith((".jsonl", ".ndjson")):
            hint = f"; -e {first!r} searches for it" if args.command == "search" else ""
            raise UsageError(f"the {what.lower()} comes first: {first!r} is a file "
                             f"(streamd {args.command} {what} PATH...{hint})")
    if not words:
        raise UsageError(f"{args.command} needs at least one PATH after the {what.lower()}")
    return first, words


def _prepare_workdir(workdir: str | None, paths: list[str], full: bool) -> None:
    """Create the workdir, and refuse one holding the index of other files
    unless ``--full`` says to replace it (it would be, silently, otherwise)."""
    if workdir is None:
        return
    try:
        os.makedirs(workdir, exist_ok=True)
    except FileExistsError:
        raise _Runtime(f"--workdir {workdir}: exists and is not a directory") from None
    except OSError as exc:
        raise _Runtime(f"--workdir {workdir}: cannot create it: {exc.strerror or exc}") from None
    held = _indexed_files(workdir)
    wanted = [os.path.abspath(p) for p in paths]
    if held and held != wanted and not full:
        names = ", ".join(os.path.basename(p) for p in held)
        raise _Runtime(f"--workdir {workdir} holds the index of other files ({names}); "
                       "give --full to replace it")


def _indexed_files(workdir: str) -> list[str]:
    """The files a workdir's saved index (or checkpoint) covers, in order."""
    import json

    for name in (os.path.join("index", "manifest.json"), "cursor.json"):
        try:
            with open(os.path.join(workdir, name), "rb") as f:
                files = json.load(f).get("files") or []
            return [str(c["path"]) for c in files]
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            continue
    return []


class _Runtime(Exception):
    """Something found while running (exit 1), said in one line."""


def _open(paths: list[str], args: argparse.Namespace):
    from streamd.recall import oneshot

    _prepare_workdir(args.workdir, paths, args.full)
    return oneshot.open_adapter(paths, args.workdir, full=args.full)


def _search(args: argparse.Namespace) -> int:
    import json

    import msgspec

    from streamd.cliargs import UsageError, fail, said_of_flag
    from streamd.errors import RpcError
    from streamd.golang import gotime
    from streamd.recall import oneshot
    from streamd.recall.wire import SearchParams

    query, paths = _first_and_paths(args, "QUERY", args.query)
    filters = {name: gotime.format_nano(t) for name, t in (("since", args.since),
                                                           ("until", args.until))
               if t is not None}
    body = {"query": query, "filters": filters, "limit": args.limit, "deadline": NO_DEADLINE}
    if args.as_of is not None:
        body["as_of"] = gotime.format_nano(args.as_of)
    try:
        params = msgspec.convert(body, SearchParams)
    except msgspec.ValidationError as exc:  # every value was checked as it was parsed
        raise UsageError(said_of_flag(str(exc), {"as_of": "--as-of"})) from None
    try:
        adapter, snap = _open(paths, args)
        result = msgspec.to_builtins(oneshot.search(adapter, snap, params))
    except _Runtime as exc:
        return fail(str(exc))
    except RpcError as exc:
        return fail(exc.message)
    hits = len(result["candidates"])
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        _print_hits(result, unsaved=args.workdir is not None and adapter.checkpoint_failed)
    return 0 if hits else 1


def _print_hits(result: dict, unsaved: bool = False) -> None:
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    err_color = sys.stderr.isatty() and not os.environ.get("NO_COLOR")

    def paint(code: str, text: str, on: bool = color) -> str:
        return f"\033[{code}m{text}\033[0m" if on else text

    for c in result["candidates"]:
        excerpt = c.get("excerpt", "").replace("\n", " ")
        if len(excerpt) > 80:
            excerpt = excerpt[:79] + "…"
        print(
            f"{paint('1', str(c['local_rank']).rjust(3))}  {paint('36', c['locator'])}  "
            f"{c['event_time']}  {paint('1', c['title'])}"
            + (f"  {paint('2', excerpt)}" if excerpt else "")
        )
    sys.stdout.flush()
    print(_summary(result, unsaved, lambda code, text: paint(code, text, err_color)),
          file=sys.stderr)


def _summary(result: dict, unsaved: bool, paint) -> str:
    """The one stderr line after the hits: counts, then anything a person
    must not miss (missing files, lines that are not records, an index that
    could not be saved), which ``--json`` carries in its diagnostics."""
    d = result["diagnostics"]
    if "matched" not in d:  # skipped: a filter this adapter does not support
        return paint("33", f"skipped: unsupported filters {', '.join(d['unsupported_filters'])}")
    how = d["query_mode"] if result["outcome"] == "success" else \
        f"{d['query_mode']}, {result['outcome']}"
    line = paint("2", f"{d['matched']} matched of {d['indexed']} records ({how}), "
                      f"{d['elapsed_ms']} ms")
    notes = []
    if d.get("missing_files"):
        notes.append(f"missing: {', '.join(d['missing_files'])}")
    failed = d.get("failed_records", 0)
    if failed:
        notes.append(f"{failed} line{'s' if failed != 1 else ''} could not be read as records")
    if unsaved:
        notes.append("the workdir is not writable: the index was not saved")
    return "; ".join([line, *(paint("33", n) for n in notes)])


def _expand(args: argparse.Namespace) -> int:
    import json

    import msgspec

    from streamd.cliargs import UsageError, fail
    from streamd.errors import RpcError
    from streamd.recall import oneshot
    from streamd.recall.wire import ExpandParams

    given, paths = _first_and_paths(args, "LOCATOR", None)
    locator = given if ":" in given else f"stream:{given}"
    try:
        params = msgspec.convert(
            {"locator": locator, "detail": args.detail, "budget_bytes": args.budget,
             "deadline": NO_DEADLINE},
            ExpandParams,
        )
    except msgspec.ValidationError:
        raise UsageError(f"{given!r} is not a locator (like stream:v2/r1, as search "
                         "prints them)") from None
    try:
        adapter, snap = _open(paths, args)
        result = msgspec.to_builtins(oneshot.expand(adapter, snap, params))
    except _Runtime as exc:
        return fail(str(exc))
    except RpcError as exc:
        return fail(exc.message)
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
        return 0
    content = result["content"]
    if result["truncated"]:
        # The marker is on a line of its own, so a cut line still reads as cut.
        print(f"{content}…")
        print(f"[truncated at --budget {args.budget} bytes; --budget 0 prints it all]")
    else:
        print(content)
    return 0


def _index(args: argparse.Namespace) -> int:
    from streamd.cliargs import UsageError, fail
    from streamd.errors import RpcError
    from streamd.progress import Progress
    from streamd.recall.adapter import StreamAdapter
    from streamd.recall.index.parallel import drive
    from streamd.recall.wire import InitializeParams

    if not args.paths:
        raise UsageError("index needs at least one PATH (see 'streamd index --help')")
    if not args.workdir:
        raise UsageError("index needs --workdir DIR: the workdir the adapter will be "
                         "initialized with")
    files = [os.path.abspath(p) for p in args.paths]
    adapter = StreamAdapter()
    progress = Progress(sum(max(catchup_size(p), 0) for p in files), sys.stderr)
    try:
        _prepare_workdir(args.workdir, files, args.full)
        adapter.initialize(InitializeParams(
            protocol_version_min=1, protocol_version_max=1, workdir=args.workdir,
            source_id="stream", location=os.path.dirname(files[0]), settings={"files": files},
        ))
        steps = adapter.build(full=args.full)
        snap = drive(steps, lambda: progress.update(adapter.building))
    except _Runtime as exc:
        progress.clear()
        return fail(str(exc))
    except RpcError as exc:
        progress.clear()
        return fail(exc.message)
    except KeyboardInterrupt:
        progress.clear()  # what was sealed is saved: the next run continues from it
        raise
    progress.done(adapter.building)
    missing = (f"{len(snap.missing)} missing file{'s' if len(snap.missing) != 1 else ''}"
               + (f" ({', '.join(snap.missing)})" if snap.missing else ""))
    print(f"{snap.name}: {snap.indexed} records indexed, {snap.failed} failed, "
          f"{missing}; {snap.watermark}")
    if adapter.checkpoint_failed:
        return fail(f"--workdir {args.workdir} is not writable: the index was not saved")
    return 0


def catchup_size(path: str) -> int:
    from streamd.recall.index.streamfile import file_size

    return file_size(path) or 0
