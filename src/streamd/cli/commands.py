"""Command line: the daemon by default, plus tools for people.

``streamd`` with no subcommand serves JSON-RPC on stdin/stdout, which is how
a Recall core spawns it; ``streamd attach`` relays the same protocol to the
resident daemon (``streamd daemon``) instead.

Imports at the top are the standard library's lightest only: ``attach``,
``status`` and ``stop`` are dispatched before the parser is even built, and
every command imports what it needs (Trio, msgspec, the daemon) inside the
function that runs it, so ``streamd attach`` and ``streamd --help`` never load
them (``tests/resident/test_imports.py``).

Options and errors follow :mod:`streamd.cli.args`: a mistake is one line
``streamd: ...`` naming the flag or path; exit 0 a match, 1 nothing found, 2
an error, as grep and rg have them; 130 for a command a Ctrl-C interrupted,
never a traceback. The servers (plain ``streamd``, ``serve``, ``daemon``, and
``attach``) take SIGINT and SIGTERM as the way they are meant to stop: exit 0.
The global options (``--db``, ``--json``, ``-v``, and the daemon's tuning
options) may come before the command or after it; given before a command
they do not apply to, they are refused rather than ignored. The Recall
commands for people (``search``, ``expand``, ``index``, ``check``) are in
:mod:`streamd.cli.recall`.
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
    from streamd.resident.claim import Claim

DESCRIPTION = (
    "streamd: a Recall stream adapter and a durable event log over newline-delimited "
    "JSON-RPC 2.0. With no subcommand it serves JSON-RPC on stdin/stdout."
)
EPILOG = (
    "Exit status, as grep and rg have it: 0 success (a match), 1 nothing found (search: "
    "no hit; index, check: lines that are not records), 2 an error, 130 interrupted. "
    "Global options (--db, --json, -v) may come before or after the command. "
    "Every command, exit code and --json shape: docs/cli.md."
)


LOG_FORMAT = "streamd %(asctime)s %(levelname)s %(message)s"
# The resident daemon's lines carry its pid: an old daemon finishing its
# clients and its successor write the same file for a while.
DAEMON_LOG_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"

# The options that may come before the command, and which commands they mean
# something to. `streamd --db X log ping` is `streamd log --db X ping`.
_VALUE_GLOBALS = (
    "--db", "--watch-interval-ms", "--watch-buffer-bytes", "--watch-total-bytes", "--synchronous",
    "--max-leases",
    "--max-held-bytes",
)
_VERBOSE = frozenset(("-v", "--verbose"))
_FLAG_GLOBALS = (*_VERBOSE, "--json", "--eventlog")
_DAEMON_GLOBALS = frozenset(_VALUE_GLOBALS) | _VERBOSE
_APPLIES = {
    None: _DAEMON_GLOBALS | {"--eventlog"},
    "serve": _DAEMON_GLOBALS | {"--eventlog"},
    "daemon": _DAEMON_GLOBALS,
    "log": frozenset({"--db", "--watch-interval-ms", "--json", *_VERBOSE}),
    "search": _VERBOSE | {"--json"},
    "expand": _VERBOSE | {"--json"},
    "check": _VERBOSE | {"--json"},
    "index": _VERBOSE,
    "demo": _VERBOSE,
    "status": frozenset({"--json"}),
}
# Dispatched before any parser is built (stdlib-only clients, or parsers of their own).
_OWN_PARSERS = ("attach", "status", "stop", "conformance", "log")
# The commands that serve: SIGINT and SIGTERM stop them, with exit 0.
_SERVERS = (None, "serve", "daemon")
# The commands whose process builds an index: it owns its allocator (``heap.tune``).
_BUILDERS = (*_SERVERS, "index", "search", "expand", "demo")


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(verbose: bool) -> int:
    import logging

    level = logging.INFO if verbose else logging.WARNING
    asked = os.environ.get("STREAMD_LOG", "").strip()
    if not asked:
        return level
    if asked.lower() in _LOG_LEVELS:
        return int(logging.getLevelName(asked.upper()))
    # Said once, and the default kept: a mistyped level must not stop a
    # daemon, nor be ignored without a word (any name of the logging module
    # was taken for one, a format string included).
    print(f"streamd: STREAMD_LOG={asked!r} is not a log level ({', '.join(_LOG_LEVELS)});"
          f" logging at {logging.getLevelName(level).lower()}", file=sys.stderr)
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

    from streamd.cli import args as cliargs

    p.add_argument("--db", default=argparse.SUPPRESS, metavar="DB",
                   help="event log database: a file path, a postgresql:// or mysql:// URL, a"
                   " libpq string such as 'host=/run/pg dbname=events' (default $STREAMD_DB,"
                   " else "
                   "$XDG_STATE_HOME/streamd/events.db; a password goes in PGPASSWORD,"
                   " ~/.pgpass, MYSQL_PWD or ~/.my.cnf, never here)")
    p.add_argument("--watch-interval-ms", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="MS",
                   help="how often watchers poll for other processes' appends where inotify"
                   " is unavailable or STREAMD_NO_INOTIFY=1 (default 200)")
    p.add_argument("--watch-buffer-bytes", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="BYTES",
                   help="what one watch may hold for a client that stops reading (default "
                   "4 MiB); past it for the stall timeout the watch ends with an error "
                   "naming the seq to resume from")
    p.add_argument("--watch-total-bytes", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="BYTES",
                   help="what all watches together may hold for clients that are behind "
                   "(default 256 MiB); past it the watch holding the most ends at once "
                   "with an error naming the seq to resume from")
    p.add_argument("--max-leases", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="N",
                   help="leases the event log holds at once, for every client together "
                   "(default 10000); one more is refused with an error (a connection "
                   "holds at most 1000)")
    p.add_argument("--max-held-bytes", type=cliargs.positive, default=argparse.SUPPRESS,
                   metavar="BYTES",
                   help="what all clients' requests and unread answers may hold together "
                   "(default 1 GiB); past half of it a client holding more than its share "
                   "of the other half waits, one within its share is served at once")
    p.add_argument("--synchronous", choices=["FULL", "NORMAL"], default=argparse.SUPPRESS,
                   help="SQLite synchronous mode for the event log (default FULL: every "
                   "acknowledged append survives power loss)")
    _verbose(p)


def _config(args: argparse.Namespace) -> Config:
    from streamd.daemon import Config
    from streamd.eventlog.lease_budget import DEFAULT_MAX_LEASES
    from streamd.rpc.held import DEFAULT_MAX_HELD_BYTES

    return Config(db=getattr(args, "db", None),
                  watch_interval=getattr(args, "watch_interval_ms", 200) / 1000,
                  synchronous=getattr(args, "synchronous", "FULL"),
                  watch_buffer_bytes=getattr(args, "watch_buffer_bytes", 4 << 20),
                  watch_total_bytes=getattr(args, "watch_total_bytes", 256 << 20),
                  max_leases=getattr(args, "max_leases", DEFAULT_MAX_LEASES),
                  max_held_bytes=getattr(args, "max_held_bytes", DEFAULT_MAX_HELD_BYTES),
                  recall_source="eventlog" if getattr(args, "eventlog", False) else "stream")


def _eventlog_flag(p: argparse.ArgumentParser) -> None:
    import argparse

    p.add_argument("--eventlog", action="store_true", default=argparse.SUPPRESS,
                   help="serve the Recall adapter over an event log (the handshake's "
                   "location is the log) instead of JSONL streams")


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from streamd import __version__
    from streamd.cli import args as cliargs
    from streamd.cli import recall as cli_recall
    from streamd.cli.args import command

    parser = cliargs.Parser(prog="streamd", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"streamd {__version__}",
                        help="print the version and exit")
    _daemon_options(parser)
    _eventlog_flag(parser)
    # Only for the commands that print for people (search, expand, check; log
    # and status read it in their own parsers): before any other, refused.
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON Lines, one compact object per line (search, "
                        "expand, check, log, status)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = command(sub, "serve", "serve JSON-RPC on stdio, or on a Unix socket")
    _daemon_options(serve)
    _eventlog_flag(serve)
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
    daemon.add_argument("--max-connections", type=cliargs.positive, default=512, metavar="N",
                        help="clients served at once (default 512); one more is answered an"
                        " error and closed")
    daemon.add_argument("--log-file", metavar="PATH",
                        help="log here, rotated at 5 MiB with 3 old files kept (default "
                        "$XDG_STATE_HOME/streamd/daemon.log; '-' for stderr)")
    # For tests of the upgrade path: announce another version than this one's.
    daemon.add_argument("--announce-version", help=argparse.SUPPRESS)

    sub.add_parser("attach", help="relay stdio to the resident daemon, starting it if "
                   "needed (what Recall should run)", add_help=False)
    sub.add_parser("status", help="whether the resident daemon runs (exit 0) or not (3)",
                   add_help=False)
    sub.add_parser("stop", help="stop the resident daemon", add_help=False)

    cli_recall.add_parsers(sub)

    demo = command(sub, "demo", "index a bundled sample stream and show what streamd does")
    _verbose(demo)
    sub.add_parser("conformance", help="verify or record conformance transcripts; "
                   "run the cancellation matrix",
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
    if argv is None:  # the process's own command line: the process is ours
        from streamd import blas
        from streamd.cli import output

        # Before anything opens a file, which would take a closed one's number.
        output.open_standard_descriptors()
        blas.one_thread()  # before anything loads numpy
    argv = list(sys.argv[1:] if argv is None else argv)
    # The resident daemon's clients come first and import only the stdlib.
    if argv[:1] == ["attach"]:
        from streamd.resident.attach import main as attach_main

        return attach_main(argv[1:])  # it ends on SIGINT and SIGTERM by itself, with 0
    try:
        if argv[:1] == ["status"]:
            from streamd.resident.control import status_main

            return status_main(argv[1:])
        if argv[:1] == ["stop"]:
            from streamd.resident.control import stop_main

            return stop_main(argv[1:])
    except KeyboardInterrupt:
        return 130
    serving = _serves(argv)
    if serving:
        _stop_quietly_until_serving()
    if _builds(argv):
        from streamd import heap

        heap.tune()
    try:
        return _main(argv)
    except BaseException as exc:
        from streamd.cli import args as cliargs

        if not cliargs.interrupted(exc):
            raise
        # A server is meant to be stopped this way; anything else was interrupted.
        return 0 if serving else cliargs.INTERRUPTED


def _serves(argv: list[str]) -> bool:
    """Whether ``argv`` runs a server (plain ``streamd``, ``serve``, ``daemon``)."""
    split = _split_globals(argv)  # None: help, a version, a usage error
    return split is not None and split[1] in _SERVERS


def _builds(argv: list[str]) -> bool:
    """Whether ``argv`` runs a command that builds an index."""
    split = _split_globals(argv)
    return split is not None and split[1] in _BUILDERS


def _stop_quietly_until_serving() -> None:
    """SIGTERM before the server's own handler is in place (while it imports,
    say) ends the process at once with 0: nothing is open yet that a stop
    would have to close. The server's handler replaces this one, and puts it
    back when it is done."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))


def _main(argv: list[str]) -> int:
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
    from streamd.cli.args import fail

    if command == "attach":
        return fail(f"{option} does not apply to attach: the daemon's options go after "
                    "'streamd attach --'", 2)
    if command is None:
        return fail(f"{option} does not apply to plain streamd, which serves JSON-RPC "
                    "(see 'streamd --help' for the commands)", 2)
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
    from streamd.cli.args import UsageError, fail
    from streamd.cli.output import OutputFailed

    parser = build_parser()
    try:
        leading, command, rest = split if split is not None else ([], None, [])
        if command is None:
            args = parser.parse_args(argv)
        else:
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
        if args.command == "demo":
            from streamd.demo import run_demo

            return run_demo()
        from streamd.cli import check as cli_check
        from streamd.cli import recall as cli_recall

        run = {"search": cli_recall.search, "expand": cli_recall.expand,
               "index": cli_recall.index, "check": cli_check.check}.get(args.command)
        if run is not None:
            return run(args)
    except UsageError as exc:
        return fail(str(exc), 2)
    except OutputFailed as exc:
        return fail(f"cannot write to stdout: {exc}", 2)
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

    from streamd.cli.args import fail
    from streamd.daemon import Daemon, serve_socket, serve_stdio

    daemon = Daemon(_config(args))
    path = getattr(args, "socket", None)
    try:
        if path:
            # 1, not 2: a server that cannot serve (docs/cli.md).
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                return fail(f"--socket {path}: there is no directory {parent}", 1)
            try:
                trio.run(serve_socket, daemon, path)
            except OSError as exc:
                return fail(f"--socket {path}: cannot listen there: {exc.strerror or exc}", 1)
        else:
            from streamd.cli import terminal

            terminal.notice("streamd")
            trio.run(serve_stdio, daemon)
    except KeyboardInterrupt:
        pass  # a signal is how a server is meant to end
    return 0


# --- the resident daemon -----------------------------------------------------


def _resident(args: argparse.Namespace) -> int:
    """``streamd daemon``: claim the socket directory, then serve until stopped.

    A second daemon, or an unsafe directory, is one line on stderr and exit 1,
    before any logging is set up: that is all a losing racer ever prints (its
    stderr is /dev/null when attach started it). The claim comes before the
    daemon's imports, so a loser never pays for them (:mod:`streamd.resident.claim`)."""
    from streamd.resident import paths
    from streamd.resident.claim import Claim
    from streamd.resident.lock import AlreadyRunning
    from streamd.resident.stopmark import StoppedSinceSpawn

    directory = os.path.abspath(args.runtime_dir) if args.runtime_dir else paths.runtime_dir()
    claim = Claim(directory)
    try:
        claim.take()
    except (AlreadyRunning, StoppedSinceSpawn, paths.UnsafeDirectory, OSError) as exc:
        print(f"streamd daemon: {exc}", file=sys.stderr)
        return 1
    try:
        return _serve_claimed(args, claim)
    finally:
        claim.release()


def _serve_claimed(args: argparse.Namespace, claim: Claim) -> int:
    import logging

    import trio

    from streamd import logsink
    from streamd.daemon import Daemon
    from streamd.recall.sources import SourceRegistry
    from streamd.resident import launch, paths
    from streamd.resident.server import ResidentDaemon, ResidentOptions

    log_file = args.log_file or paths.log_path()
    verbose = getattr(args, "verbose", False)

    sources = SourceRegistry(idle_close=args.source_idle, max_open=args.max_sources)
    options = ResidentOptions(runtime_dir=claim.runtime_dir, idle_exit=args.idle_exit,
                              log_file="(stderr)" if log_file == "-" else log_file)
    if args.announce_version:
        options.version = args.announce_version
    config = _config(args)
    config.max_connections = args.max_connections
    resident = ResidentDaemon(Daemon(config, sources=sources), options, claim, sources)
    try:
        if log_file == "-":
            logsink.install(_log_level(verbose), sys.stderr, DAEMON_LOG_FORMAT)
        else:
            # Only the default's directory is made: a mistyped --log-file is
            # refused, as a --db is, instead of growing a tree where it points.
            logsink.install_file(_log_level(verbose), log_file, DAEMON_LOG_FORMAT,
                                 make_directory=not args.log_file)
    except OSError as exc:
        parent = os.path.dirname(os.path.abspath(log_file))
        why = (f"there is no directory {parent}" if isinstance(exc, FileNotFoundError)
               and not os.path.isdir(parent) else exc.strerror or exc)
        print(f"streamd daemon: cannot open the log file {log_file}: {why}", file=sys.stderr)
        return 1
    # Its own comings and goings are worth a line at the default level.
    logging.getLogger("streamd.resident").setLevel(logging.INFO)
    launch.detach_startup_pipe()  # what could stop it from serving was said
    try:
        trio.run(resident.serve)
    except KeyboardInterrupt:
        pass
    return 0
