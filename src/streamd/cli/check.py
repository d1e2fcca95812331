"""``streamd check``: every line of stream files that is not a record, and why,
as ``FILE:LINE: reason`` (or ``--json`` lines), a count per file on stderr.
Exit 0 when every line is a record, 1 when some are not, 2 for an error
(paths are checked first, as :mod:`streamd.cli.recall` checks them).

Imports are inside the function, as in :mod:`streamd.cli.recall`.
"""

from __future__ import annotations

import sys

from streamd.cli.args import ERROR, NOT_FOUND, OK, UsageError
from streamd.cli.output import Stdout

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from streamd.recall.check import Tally


def check(args: argparse.Namespace) -> int:
    from streamd.cli.args import fail
    from streamd.cli.recall import unreadable
    from streamd.errors import RpcError
    from streamd.recall.check import Tally, scan

    if not args.paths:
        raise UsageError("check needs at least one PATH (see 'streamd check --help')")
    if unreadable(args.paths):
        return ERROR
    tallies = []
    out = Stdout()
    for path in args.paths:
        tally = Tally(path)
        try:
            for failure in scan(path, path, tally):
                if args.json:
                    out.line(_dumps({"type": "failure", "path": failure.path,
                                     "line": failure.line, "reason": failure.reason}))
                else:
                    out.line(str(failure))
                if out.reader_gone:
                    # `check big.jsonl | head -1`: nobody reads the rest, and
                    # a line was printed, so some line is not a record.
                    return NOT_FOUND
        except FileNotFoundError:
            return fail(f"{path}: no such file (it went away while being read)")
        except OSError as exc:
            return fail(f"{path}: {(exc.strerror or str(exc)).lower()}")
        except RpcError as exc:
            return fail(f"{path}: {exc.message}")
        tallies.append(tally)
        if not args.json:
            out.flush()  # this file's failures before its count on stderr
            if out.reader_gone:
                return NOT_FOUND  # only failures are printed: one was
            print(_tally_line(tally), file=sys.stderr)
    failed = sum(t.failed for t in tallies)
    if args.json:
        out.line(_dumps({
            "type": "summary", "records": sum(t.records for t in tallies), "failed": failed,
            "files": [{"path": t.path, "lines": t.lines, "records": t.records,
                       "blank": t.blank, "failed": t.failed} for t in tallies],
        }))
    out.flush()
    return NOT_FOUND if failed else OK


def _tally_line(t: Tally) -> str:
    def n(count: int, what: str) -> str:
        return f"{count:,} {what}{'s' if count != 1 else ''}"

    failed = f"{n(t.failed, 'line')} not records" if t.failed else "every line a record"
    blank = f", {n(t.blank, 'blank line')}" if t.blank else ""
    return f"{t.path}: {n(t.records, 'record')}, {failed}{blank}"


def _dumps(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
