"""``streamd search``, ``expand``, ``index`` and ``check``: the Recall adapter
for people, on stream files named on the command line, without a daemon
(``check`` runs in :mod:`streamd.cli.check`; its parser is here with the others).

The rules they share, after :mod:`streamd.cli.args`:

* The query (or locator) comes first, then the paths, as with grep and rg.
* Every path is checked before anything is read: one that is missing,
  unreadable, a directory or not a regular file is an error (exit 2), said
  as ``streamd: PATH: cause`` with the path as it was typed (the wire keeps
  the reference's base names). Nothing is searched then: a word typed where
  a path goes is far more often half of an unquoted query than a file that
  should be skipped.
* Lines that are not records never fail a command; ``index`` and ``search``
  name the first few as ``FILE:LINE: reason`` on stderr, ``check`` every one.
* ``--json`` is JSON Lines: one compact object per line (see docs/cli.md).
* Exit 0 a match (``search``), a record shown (``expand``), every line a
  record (``index``, ``check``); 1 no hit, no such record, lines that are
  not records; 2 an error; 130 interrupted.

Imports are inside the functions: ``streamd --help`` builds these parsers
without loading the adapter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from streamd.cli.args import ERROR, NOT_FOUND, OK, UsageError, command, renamed
from streamd.cli.output import Stdout
from streamd.cli.terminal import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from streamd.recall.adapter import StreamAdapter
    from streamd.recall.generation import Generation

# A far deadline: one-shot commands wait for their build, however long it takes.
NO_DEADLINE = "2999-01-01T00:00:00Z"
# Failed lines ``index`` and ``search`` name before pointing at ``check``.
SHOWN_FAILURES = 3


# --- parsers --------------------------------------------------------------------------


def _verbose(p: argparse.ArgumentParser) -> None:
    import argparse

    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log what happens to stderr (STREAMD_LOG=debug for more)")


def _json(p: argparse.ArgumentParser, what: str) -> None:
    # Default False, never SUPPRESS: a --json given before the command is
    # already in the namespace, and a subparser's default does not replace it.
    p.add_argument("--json", action="store_true", default=False,
                   help=f"print JSON Lines ({what}) instead of lines for people")


def _rebuild(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--rebuild", action="store_true",
                   help=f"rebuild the index from scratch before {what} (needed to replace "
                   "a --workdir index of other files)")
    renamed(p, "--full", "--rebuild")


def _workdir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", metavar="DIR",
                   help="keep the durable index here and reuse it: later runs read only "
                   "what was appended (created if missing)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from streamd.cli import args as cliargs

    search = command(
        sub, "search", "search stream files and print ranked hits",
        usage="streamd search [options] QUERY PATH...\n"
              "       streamd search [options] -e QUERY PATH...",
        epilog="The query comes first, as with grep and rg; a query of several words goes "
               "in quotes. A QUERY that names a file (or ends in .jsonl) is refused, because "
               "it is almost always a path typed first: give it with -e to search for it. "
               "Times take RFC 3339, a date (UTC midnight), a duration before now (2h, 3d) "
               "or today/yesterday. Exit 0 with hits, 1 with none, 2 for an error.")
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
    _workdir(search)
    _rebuild(search, "searching")
    _json(search, "a line per hit, then a summary line")
    _verbose(search)

    expand = command(
        sub, "expand", "print the evidence behind a locator",
        usage="streamd expand [options] LOCATOR PATH...",
        epilog="The locator comes first, as the query does in search: the locator printed "
               "by search (stream:v2/r1, or v2/r1). Exit 0 with the record shown, 1 when the "
               "files hold no such record, 2 for an error.")
    expand.add_argument("words", nargs="*", metavar="LOCATOR PATH",
                        help="a locator from search, then the stream files it came from")
    expand.add_argument("--detail", choices=["summary", "excerpt", "full", "context"],
                        default="full",
                        help="how much of the record to print: summary, excerpt, full "
                        "(default: the whole record) or context (the record and its episode)")
    expand.add_argument("--budget", type=cliargs.count, default=0, metavar="BYTES",
                        help="print at most BYTES bytes, marking a cut (default 0: all)")
    _workdir(expand)
    _rebuild(expand, "expanding")
    _json(expand, "the wire result on one line")
    _verbose(expand)

    index = command(sub, "index", "build a workdir's index ahead of time, with progress",
                    usage="streamd index [options] PATH... --workdir DIR",
                    epilog="Exit 0 when every line is a record, 1 when some are not (the "
                    "first few are named; 'streamd check' names all), 2 for an error, "
                    "130 interrupted (run it again to continue).")
    index.add_argument("paths", nargs="*", metavar="PATH", help="the JSONL stream files")
    index.add_argument("--workdir", metavar="DIR",
                       help="the workdir the adapter will be initialized with (required; "
                       "created if missing)")
    index.add_argument("--rebuild", action="store_true",
                       help="rebuild from scratch (needed to replace an index of other files)")
    renamed(index, "--full", "--rebuild")
    _verbose(index)

    check = command(sub, "check", "name every line of stream files that is not a record, "
                    "and why", usage="streamd check [options] PATH...",
                    epilog="Each failed line is printed as FILE:LINE: reason; a count per "
                    "file goes to stderr. Exit 0 when every line is a record, 1 when some "
                    "are not, 2 for an error. The record format: docs/records.md.")
    check.add_argument("paths", nargs="*", metavar="PATH", help="the JSONL stream files")
    _json(check, "a line per failed line, then a summary line")
    _verbose(check)


# --- what every command checks first -------------------------------------------------------


class _Runtime(Exception):
    """Something found while running (exit 2), said in one line."""


def first_and_paths(args: argparse.Namespace, what: str, given: str | None) -> tuple[str, list]:
    """The QUERY (or LOCATOR) and the paths, by the rule that the query comes
    first: a first word that is a file is a path typed in the query's place."""
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


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a stream file, in a person's words, or None."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, a device or a socket)"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None


def unreadable(paths: list[str], query: str | None = None) -> bool:
    """Say every path that cannot be read, one line each; whether there was one.
    ``query``: the query typed before them, for the hint a missing first
    path gets when other paths follow it (most often the second word of a
    query left unquoted; a lone path quoted into the query would leave none)."""
    from streamd.cli.args import fail

    bad = False
    for n, path in enumerate(paths):
        why = path_problem(path)
        if why is None:
            continue
        if (n == 0 and len(paths) > 1 and query is not None and why == "no such file"
                and os.sep not in path):
            import shlex

            why += f" (a query of several words goes in quotes: {shlex.quote(query + ' ' + path)})"
        fail(f"{path}: {why}")
        bad = True
    return bad


def _plain_path_notice() -> None:
    from streamd.recall.index import native

    if (line := native.unavailable()) is not None:
        print(f"streamd: {line}", file=sys.stderr)


def prepare_workdir(workdir: str | None, paths: list[str], rebuild: bool) -> None:
    """Create the workdir, and refuse one holding the index of other files
    unless ``--rebuild`` says to replace it (it would be, silently, otherwise).
    Said at once here; the build looks again once it holds the workdir's
    lock (:func:`refuse_other_files`), as another command may fill it meanwhile."""
    if workdir is None:
        return
    try:
        os.makedirs(workdir, exist_ok=True)
    except FileExistsError:
        raise _Runtime(f"--workdir {workdir}: exists and is not a directory") from None
    except OSError as exc:
        raise _Runtime(f"--workdir {workdir}: cannot create it: {exc.strerror or exc}") from None
    refuse_other_files(workdir, paths, rebuild)


def refuse_other_files(workdir: str, paths: list[str], rebuild: bool) -> None:
    """Raise ``_Runtime`` when ``workdir`` holds the index of files other
    than ``paths`` and ``--rebuild`` was not given."""
    held = _indexed_files(workdir)
    wanted = [os.path.abspath(p) for p in paths]
    if held and held != wanted and not rebuild:
        names = ", ".join(os.path.basename(p) for p in held)
        raise _Runtime(f"--workdir {workdir} holds the index of other files ({names}); "
                       "give --rebuild to replace it")


def _indexed_files(workdir: str) -> list[str]:
    """The files a workdir's saved index (or checkpoint) covers, in order."""
    from streamd import regular_files
    from streamd.recall.persist import summed

    for name in (os.path.join("index", "manifest.json"), "cursor.json"):
        try:
            # Never a plain open: a FIFO left at either name blocked it for
            # good (and with it `streamd index` and `search --workdir`).
            fd = regular_files.open_fd(os.path.join(workdir, name), os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                # A manifest that fails its checksum (a Damaged, so a
                # ValueError) names nothing: one flipped bit of a path
                # refused the workdir as another file set's.
                files = summed.loads(f.read(), name)[0].get("files") or []
            return [str(c["path"]) for c in files]
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            continue
    return []


def _open(paths: list[str], args: argparse.Namespace) -> tuple[StreamAdapter, Generation]:
    from streamd.recall import oneshot

    prepare_workdir(args.workdir, paths, args.rebuild)
    _plain_path_notice()
    workdir = args.workdir
    return oneshot.open_adapter(
        paths, workdir, full=args.rebuild,
        locked_check=None if workdir is None else
        lambda: refuse_other_files(workdir, paths, args.rebuild))


def say_failures(generation: Generation, paths: list[str]) -> None:
    """The first few lines of ``generation`` that are not records, as
    ``FILE:LINE: reason`` on stderr (FILE as typed), and where the rest are."""
    from streamd.recall import check

    if not generation.failed:
        return
    shown = {os.path.abspath(p): p for p in paths}
    failing = [(c.path, shown.get(c.path, c.path)) for c in generation.files if c.failed]
    found, _ = check.first_failures(failing, SHOWN_FAILURES)
    for failure in found:
        print(failure, file=sys.stderr)
    if generation.failed > len(found):
        import shlex

        more = generation.failed - len(found)
        lines = f"{more}{' more' if found else ''} line{'s are' if more != 1 else ' is'}"
        files = " ".join(shlex.quote(given) for _, given in failing)
        print(f"streamd: {lines} not records; 'streamd check {files}' names every one",
              file=sys.stderr)


def _dumps(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --- search -------------------------------------------------------------------------------


def search(args: argparse.Namespace) -> int:
    import msgspec

    from streamd.cli.args import fail, said_of_flag
    from streamd.errors import RpcError
    from streamd.golang import gotime
    from streamd.recall import oneshot
    from streamd.recall.wire import SearchParams

    query, paths = first_and_paths(args, "QUERY", args.query)
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
    if unreadable(paths, None if args.query is not None else query):
        return ERROR
    try:
        adapter, generation = _open(paths, args)
        result = msgspec.to_builtins(oneshot.search(adapter, generation, params))
    except _Runtime as exc:
        return fail(str(exc))
    except RpcError as exc:
        return fail(exc.message)
    hits = len(result["candidates"])
    out = Stdout()
    if args.json:
        for candidate in result.pop("candidates"):
            out.line(_dumps({"type": "hit", **candidate}))
        out.line(_dumps({"type": "summary", "hits": hits, **result}))
        out.flush()
    else:
        _print_hits(out, result, unsaved=_unsaved(adapter) if args.workdir is not None else "")
    say_failures(generation, paths)
    return OK if hits else NOT_FOUND


def _unsaved(adapter: StreamAdapter) -> str:
    """Why the index is not in the workdir, for a person; "" when it is."""
    if not adapter.checkpoint_failed:
        return ""
    why = adapter.save_error
    return f"the index was not saved: {why}" if why else "the index was not saved"


def _print_hits(out: Stdout, result: dict, unsaved: str = "") -> None:
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    err_color = sys.stderr.isatty() and not os.environ.get("NO_COLOR")

    def paint(code: str, text: str, on: bool = color) -> str:
        return f"\033[{code}m{text}\033[0m" if on else text

    for c in result["candidates"]:
        excerpt = c.get("excerpt", "").replace("\n", " ")
        if len(excerpt) > 80:
            excerpt = excerpt[:79] + "…"
        # From the records: nothing in them may drive the terminal.
        excerpt, title, locator = (printable(excerpt), printable(c["title"]),
                                   printable(c["locator"]))
        out.line(
            f"{paint('1', str(c['local_rank']).rjust(3))}  {paint('36', locator)}  "
            f"{c['event_time']}  {paint('1', title)}"
            + (f"  {paint('2', excerpt)}" if excerpt else "")
        )
    out.flush()
    print(_summary(result, unsaved, lambda code, text: paint(code, text, err_color)),
          file=sys.stderr)


def _summary(result: dict, unsaved: str, paint) -> str:
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
        notes.append(unsaved)
    return "; ".join([line, *(paint("33", n) for n in notes)])


# --- expand -------------------------------------------------------------------------------


def expand(args: argparse.Namespace) -> int:
    import msgspec

    from streamd.cli.args import fail
    from streamd.errors import LOCATOR_EXPIRED, LOCATOR_UNKNOWN, RpcError
    from streamd.recall import oneshot
    from streamd.recall.adapter import StreamAdapter
    from streamd.recall.wire import ExpandParams

    given, paths = first_and_paths(args, "LOCATOR", None)
    locator = given if ":" in given else f"stream:{given}"
    not_one = f"{given!r} is not a locator (like stream:v2/r1, as search prints them)"
    try:
        params = msgspec.convert(
            {"locator": locator, "detail": args.detail, "budget_bytes": args.budget,
             "deadline": NO_DEADLINE},
            ExpandParams,
        )
        # Its form is checked before any file is read: a malformed locator is
        # a mistake on the command line, not a record the files lack.
        StreamAdapter(persist=False).parse_locator(params)
    except (msgspec.ValidationError, RpcError):
        raise UsageError(not_one) from None
    if unreadable(paths):
        return ERROR
    try:
        adapter, generation = _open(paths, args)
        result = msgspec.to_builtins(oneshot.expand(adapter, generation, params))
    except _Runtime as exc:
        return fail(str(exc))
    except RpcError as exc:
        return fail(exc.message, NOT_FOUND if exc.code in (LOCATOR_UNKNOWN, LOCATOR_EXPIRED)
                    else ERROR)
    out = Stdout()
    if args.json:
        out.line(_dumps(result))
        out.flush()
        return OK
    content = result["content"]
    if sys.stdout.isatty():
        # A terminal would obey a control character in the record; a pipe
        # or a file gets the content as it is.
        content = printable(content, lines=True)
    if result["truncated"]:
        # The marker is on a line of its own, so a cut line still reads as cut.
        out.line(f"{content}…")
        out.line(f"[truncated at --budget {args.budget} bytes; --budget 0 prints it all]")
    else:
        out.line(content)
    out.flush()
    return OK


# --- index --------------------------------------------------------------------------------


@contextlib.contextmanager
def _stop_on_sigint() -> Iterator[threading.Event]:
    """An event a first Ctrl-C sets (the build stops at its next step, within
    a tenth of a second); a second one interrupts at once."""
    stop = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def index(args: argparse.Namespace) -> int:
    from streamd.cli.args import INTERRUPTED, fail
    from streamd.cli.progress import Progress
    from streamd.errors import RpcError
    from streamd.recall.adapter import StreamAdapter
    from streamd.recall.index.parallel import Abandoned, drive
    from streamd.recall.wire import InitializeParams

    if not args.paths:
        raise UsageError("index needs at least one PATH (see 'streamd index --help')")
    if not args.workdir:
        raise UsageError("index needs --workdir DIR: the workdir the adapter will be "
                         "initialized with")
    if unreadable(args.paths):
        return ERROR
    files = [os.path.abspath(p) for p in args.paths]
    adapter = StreamAdapter(
        locked_check=lambda: refuse_other_files(args.workdir, files, args.rebuild))
    progress = Progress(sum(max(catchup_size(p), 0) for p in files), sys.stderr)
    try:
        prepare_workdir(args.workdir, files, args.rebuild)
        _plain_path_notice()
        adapter.initialize(InitializeParams(
            protocol_version_min=1, protocol_version_max=1, workdir=args.workdir,
            source_id="stream", location=os.path.dirname(files[0]), settings={"files": files},
        ))
        steps = adapter.build(full=args.rebuild)
        with _stop_on_sigint() as stop:
            generation = drive(steps, lambda: progress.update(adapter.building), stop)
    except _Runtime as exc:
        progress.clear()
        return fail(str(exc))
    except RpcError as exc:
        progress.clear()
        return fail(exc.message)
    except Abandoned:
        # Stopped between two steps, where the build saves what it read (a
        # Ctrl-C raised inside a step could not: it would end the build
        # there, and a state caught mid-step is not one to save).
        progress.clear()
        at = progress.fraction(adapter.building)
        fail(f"index interrupted at {at:.0%}; what it indexed is kept in --workdir "
             f"{args.workdir}: run the same command again to continue")
        return INTERRUPTED
    except KeyboardInterrupt:
        # A second Ctrl-C: at once, wherever the build was; the next run
        # continues from its last save (every two seconds).
        progress.clear()
        fail("index interrupted")
        raise
    progress.done(adapter.building)
    gone = len(generation.missing)
    missing = (f"{gone} missing file{'s' if gone != 1 else ''}"
               + (f" ({', '.join(generation.missing)})" if generation.missing else ""))
    indexed = f"{generation.indexed} record{'s' if generation.indexed != 1 else ''}"
    out = Stdout()
    out.line(f"{generation.name}: {indexed} indexed, {generation.failed} failed, "
             f"{missing}; {generation.watermark}")
    out.flush()
    if unsaved := _unsaved(adapter):
        return fail(f"--workdir {args.workdir}: {unsaved}")
    if generation.missing:  # each was checked before: it went away while being read
        return fail(f"{', '.join(generation.missing)}: went away while being indexed")
    say_failures(generation, args.paths)
    return NOT_FOUND if generation.failed else OK


def catchup_size(path: str) -> int:
    from streamd.recall.index.streamfile import file_size

    return file_size(path) or 0
