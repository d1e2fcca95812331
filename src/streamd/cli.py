"""Command line: the daemon by default, plus tools for people.

``streamd`` with no subcommand serves JSON-RPC on stdin/stdout, which is how
a Recall core spawns it; ``streamd attach`` relays the same protocol to the
resident daemon (``streamd daemon``) instead.

Imports at the top are the standard library's lightest only: ``attach``,
``status`` and ``stop`` are dispatched before the parser is even built, and
every command imports what it needs (Trio, msgspec, the daemon) inside the
function that runs it, so ``streamd attach`` and ``streamd --help`` never load
them (``tests/test_resident_imports.py``).
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


LOG_FORMAT = "streamd %(asctime)s %(levelname)s %(message)s"
# The resident daemon's lines carry its pid: an old daemon finishing its
# clients and its successor write the same file for a while.
DAEMON_LOG_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


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


def _daemon_options(p: argparse.ArgumentParser, *, subcommand: bool = False) -> None:
    # On a subcommand the defaults are SUPPRESS, so `streamd --db X serve` keeps
    # X: a subparser's own default would overwrite what was parsed before it.
    import argparse

    def default(value):
        return argparse.SUPPRESS if subcommand else value

    p.add_argument("--db", default=default(None), help="event log database (default "
                   "$STREAMD_DB or $XDG_STATE_HOME/streamd/events.db)")
    p.add_argument("--watch-interval-ms", type=int, default=default(200),
                   help="how often watchers poll for other processes' appends (default 200)")
    p.add_argument("--watch-buffer-bytes", type=int, default=default(4 << 20),
                   help="what one watch may hold for a client that stops reading, in bytes "
                   "(default 4 MiB); past it for the stall timeout the watch ends with an "
                   "error naming the seq to resume from")
    p.add_argument("--synchronous", choices=["FULL", "NORMAL"], default=default("FULL"),
                   help="SQLite synchronous mode for the event log (default FULL: every "
                   "acknowledged append survives power loss)")
    p.add_argument("-v", "--verbose", action="store_true", default=default(False),
                   help="log requests to stderr")


def _config(args: argparse.Namespace) -> Config:
    from streamd.daemon import Config

    return Config(db=args.db, watch_interval=args.watch_interval_ms / 1000,
                  synchronous=args.synchronous, watch_buffer_bytes=args.watch_buffer_bytes)


def _seconds(value: str) -> float:
    import argparse

    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds: {value!r}")
    return seconds


def _positive(value: str) -> int:
    import argparse

    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog="streamd", description=DESCRIPTION)
    _daemon_options(parser)
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="serve JSON-RPC on stdio, or on a Unix socket")
    _daemon_options(serve, subcommand=True)
    serve.add_argument("--socket", help="serve many clients on this Unix socket path")

    daemon = sub.add_parser(
        "daemon", help="run the resident per-user daemon in the foreground (what "
        "`streamd attach` starts; for service managers)")
    _daemon_options(daemon, subcommand=True)
    daemon.add_argument("--runtime-dir", metavar="DIR",
                        help="the socket directory (default $STREAMD_RUNTIME_DIR, else "
                        "$XDG_RUNTIME_DIR/streamd, else $XDG_STATE_HOME/streamd/run)")
    daemon.add_argument("--idle-exit", type=_seconds, default=900.0, metavar="SECONDS",
                        help="exit after this long without a client (default 900; 0: never)")
    daemon.add_argument("--source-idle", type=_seconds, default=600.0, metavar="SECONDS",
                        help="close a Recall source no client has used for this long "
                        "(default 600)")
    daemon.add_argument("--max-sources", type=_positive, default=8, metavar="N",
                        help="Recall sources kept open at most (default 8)")
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

    search = sub.add_parser("search", help="search stream files and print ranked hits")
    search.add_argument("paths", nargs="+", metavar="PATH")
    search.add_argument("query")
    search.add_argument("--since")
    search.add_argument("--until")
    search.add_argument("--as-of")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--json", action="store_true", help="print the raw search result")
    search.add_argument("--workdir", help="reuse (and keep up to date) the index saved here")

    expand = sub.add_parser("expand", help="print the evidence behind a locator")
    expand.add_argument("paths", nargs="+", metavar="PATH")
    expand.add_argument("locator")
    expand.add_argument("--detail", choices=["summary", "excerpt", "full", "context"],
                        default="full")
    expand.add_argument("--budget", type=int, default=0, help="byte budget (0: unlimited)")
    expand.add_argument("--json", action="store_true")
    expand.add_argument("--workdir", help="reuse (and keep up to date) the index saved here")

    index = sub.add_parser("index", help="build a workdir's index ahead of time, with progress")
    index.add_argument("paths", nargs="+", metavar="PATH")
    index.add_argument("--workdir", required=True,
                       help="the workdir the adapter will be initialized with")
    index.add_argument("--full", action="store_true", help="rebuild from scratch")

    sub.add_parser("demo", help="index a bundled sample stream and show what streamd does")
    sub.add_parser("conformance", help="verify or record conformance transcripts",
                   add_help=False)
    sub.add_parser("log", help="the durable event log", add_help=False)
    return parser


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
    if argv[:1] == ["conformance"]:
        from streamd.conformance import main as conformance_main

        return conformance_main(argv[1:])
    if argv[:1] == ["log"]:
        from streamd.eventlog.cli import main as log_main

        return log_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "daemon":
        return _resident(args)
    _setup_logging(getattr(args, "verbose", False))
    try:
        if args.command in (None, "serve"):
            import trio

            from streamd.daemon import Daemon, serve_socket, serve_stdio

            daemon = Daemon(_config(args))
            if getattr(args, "socket", None):
                trio.run(serve_socket, daemon, args.socket)
            else:
                trio.run(serve_stdio, daemon)
            return 0
        if args.command == "search":
            return _search(args)
        if args.command == "expand":
            return _expand(args)
        if args.command == "index":
            return _index(args)
        if args.command == "demo":
            from streamd.demo import run_demo

            return run_demo()
    except KeyboardInterrupt:
        return 0
    parser.print_help()
    return 2


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
    from streamd.resident import paths
    from streamd.resident.lock import AlreadyRunning
    from streamd.resident.server import ResidentDaemon, ResidentOptions

    directory = os.path.abspath(args.runtime_dir) if args.runtime_dir else paths.runtime_dir()
    log_file = args.log_file or paths.log_path()

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
            logsink.install(_log_level(args.verbose), sys.stderr, DAEMON_LOG_FORMAT)
        else:
            logsink.install_file(_log_level(args.verbose), log_file, DAEMON_LOG_FORMAT)
    except OSError as exc:
        resident.release()
        print(f"streamd daemon: cannot open the log file {log_file}: {exc}", file=sys.stderr)
        return 1
    # Its own comings and goings are worth a line at the default level.
    logging.getLogger("streamd.resident").setLevel(logging.INFO)
    try:
        trio.run(resident.serve)
    except KeyboardInterrupt:
        pass
    return 0


# --- one-shot search and expand ----------------------------------------------


def _index(args: argparse.Namespace) -> int:
    from streamd.errors import RpcError
    from streamd.progress import Progress
    from streamd.recall.adapter import StreamAdapter
    from streamd.recall.index.parallel import drive
    from streamd.recall.wire import InitializeParams

    files = [os.path.abspath(p) for p in args.paths]
    os.makedirs(args.workdir, exist_ok=True)
    adapter = StreamAdapter()
    try:
        adapter.initialize(InitializeParams(
            protocol_version_min=1, protocol_version_max=1, workdir=args.workdir,
            source_id="stream", location=os.path.dirname(files[0]), settings={"files": files},
        ))
        total = sum(max(catchup_size(p), 0) for p in files)
        progress = Progress(total, sys.stderr)
        steps = adapter.build(full=args.full)
        snap = drive(steps, lambda: progress.update(adapter.building))
    except RpcError as exc:
        print(f"streamd: {exc.message}", file=sys.stderr)
        return 1
    progress.done(adapter.building)
    durable = "" if not adapter.checkpoint_failed else " (workdir not writable: not saved)"
    print(f"{snap.name}: {snap.indexed} records indexed, {snap.failed} failed, "
          f"{len(snap.missing)} missing files; {snap.watermark}{durable}")
    return 0 if not adapter.checkpoint_failed else 1


def catchup_size(path: str) -> int:
    from streamd.recall.index.streamfile import file_size

    return file_size(path) or 0


def _time_arg(value: str | None, name: str) -> str | None:
    from streamd.timeinput import TimeInputError, parse_instant

    if value is not None:
        try:
            parse_instant(value, f"--{name}")
        except TimeInputError as exc:
            raise SystemExit(f"streamd: {exc}") from None
    return value


def _search(args: argparse.Namespace) -> int:
    import json

    import msgspec

    from streamd.errors import RpcError
    from streamd.recall import oneshot
    from streamd.recall.wire import SearchParams

    filters = {k: v for k, v in (("since", _time_arg(args.since, "since")),
                                 ("until", _time_arg(args.until, "until"))) if v}
    body = {"query": args.query, "filters": filters, "limit": max(args.limit, 0),
            "deadline": "2999-01-01T00:00:00Z"}
    if args.as_of:
        body["as_of"] = _time_arg(args.as_of, "as-of")
    try:
        adapter, snap = oneshot.open_adapter(args.paths, args.workdir)
        params = msgspec.convert(body, SearchParams)
        result = msgspec.to_builtins(oneshot.search(adapter, snap, params))
    except RpcError as exc:
        print(f"streamd: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
        return 0
    _print_hits(result)
    return 0


def _print_hits(result: dict) -> None:
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")

    def paint(code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if color else text

    for c in result["candidates"]:
        excerpt = c.get("excerpt", "").replace("\n", " ")
        if len(excerpt) > 80:
            excerpt = excerpt[:79] + "…"
        print(
            f"{paint('1', str(c['local_rank']).rjust(3))}  {paint('36', c['locator'])}  "
            f"{c['event_time']}  {paint('1', c['title'])}"
            + (f"  {paint('2', excerpt)}" if excerpt else "")
        )
    d = result["diagnostics"]
    print(paint("2", f"{d['matched']} matched of {d['indexed']} records ({d['query_mode']}, "
                     f"{result['outcome']}), {d['elapsed_ms']} ms"), file=sys.stderr)


def _expand(args: argparse.Namespace) -> int:
    import json

    import msgspec

    from streamd.errors import RpcError
    from streamd.recall import oneshot
    from streamd.recall.wire import ExpandParams

    locator = args.locator if ":" in args.locator else f"stream:{args.locator}"
    try:
        adapter, snap = oneshot.open_adapter(args.paths, args.workdir)
        params = msgspec.convert(
            {"locator": locator, "detail": args.detail, "budget_bytes": max(args.budget, 0),
             "deadline": "2999-01-01T00:00:00Z"},
            ExpandParams,
        )
        result = msgspec.to_builtins(oneshot.expand(adapter, snap, params))
    except RpcError as exc:
        print(f"streamd: {exc.message}", file=sys.stderr)
        return 1
    except msgspec.ValidationError as exc:
        print(f"streamd: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        print(result["content"])
    return 0
