"""``streamd conformance {verify,record}``: argument parsing, one line per case,
and an exit status. Everything it reports comes from
:mod:`streamd.conformance.driver`. ``streamd conformance cancel`` is handed to
:mod:`streamd.conformance.cancel.cli`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from streamd.cli.args import INTERRUPTED, interrupted
from streamd.conformance.case import discover_cases
from streamd.conformance.driver import DEFAULT_TIMEOUT, CaseResult, record_case, verify_case

STDERR_TAIL_LINES = 20

USAGE = """\
usage: streamd conformance verify DIR [--adapter 'CMD'] [--timeout SECONDS] [CASE ...]
       streamd conformance record DIR [--adapter 'CMD'] [--timeout SECONDS] [CASE ...]
       streamd conformance cancel [--adapter 'CMD'] [--json] [--record DIR] [--trials N]
                                  [--timeout SECONDS] [SCENARIO ...]"""


def adapter_command(adapter: str | None) -> list[str]:
    """``--adapter``'s command line, split as a shell would; this streamd on
    stdio when it is not given. ValueError says what is wrong with it."""
    if adapter is None:
        return [sys.executable, "-m", "streamd"]
    try:
        command = shlex.split(adapter)
    except ValueError as exc:
        raise ValueError(f"--adapter: {exc}") from None
    if not command:
        raise ValueError("--adapter is empty")
    return command


def format_result(result: CaseResult, *, recording: bool = False) -> str:
    if result.ok:
        return f"RECORDED {result.name} ({result.detail})" if recording else f"PASS {result.name}"
    out = [f"FAIL {result.name}: {result.detail}"]
    if result.stderr is not None:
        text = result.stderr.decode("utf-8", "replace").rstrip("\n")
        if not text:
            out.append("  adapter stderr: (empty)")
        else:
            all_lines = text.split("\n")
            shown = all_lines[-STDERR_TAIL_LINES:]
            cut = f" (last {len(shown)} lines)" if len(shown) < len(all_lines) else ""
            out.append(f"  adapter stderr{cut}:")
            out.extend(f"  | {line}" for line in shown)
    return "\n".join(out)


def main(argv: list[str]) -> int:
    """``streamd conformance {verify,record,cancel} ...``; argv excludes "conformance".

    Exit status: 0 when every case passed (or was recorded), 1 when any case
    failed, 2 for a usage error, 130 when interrupted (Ctrl-C).
    """
    if argv[:1] == ["cancel"]:
        # The cancellation kit: its own parser, rows instead of cases.
        from streamd.conformance.cancel.cli import main as cancel_main

        return cancel_main(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)  # asked for: the answer, on stdout
        return 0
    if not argv or argv[0] not in ("verify", "record"):
        print(USAGE, file=sys.stderr)
        return 2
    action = argv[0]
    parser = argparse.ArgumentParser(
        prog=f"streamd conformance {action}",
        description=(
            "Replay each case's request.jsonl against a fresh adapter process and "
            "compare with response.jsonl."
            if action == "verify"
            else "Run each case against a fresh adapter process and write its "
            "response.jsonl (volatile values masked)."
        ),
    )
    parser.add_argument("suite", metavar="DIR", help="suite directory, one case per subdirectory")
    parser.add_argument("cases", metavar="CASE", nargs="*", help="case names (default: all)")
    parser.add_argument(
        "--adapter",
        metavar="CMD",
        help="adapter command line, split like a shell would (default: this Python -m streamd)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"per-case limit (default {DEFAULT_TIMEOUT:g})",
    )
    try:
        # Intermixed, so CASE names may follow --adapter.
        args = parser.parse_intermixed_args(argv[1:])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    def usage_error(message: str) -> int:
        print(f"streamd conformance {action}: {message}", file=sys.stderr)
        return 2

    try:
        command = adapter_command(args.adapter)
    except ValueError as exc:
        return usage_error(str(exc))
    if not args.timeout > 0:
        return usage_error("--timeout must be positive")

    suite = Path(args.suite)
    if not suite.is_dir():
        return usage_error(f"{suite} is not a directory")
    available = {p.name: p for p in discover_cases(suite)}
    if not available:
        return usage_error(f"{suite} holds no cases")
    selected = []
    for name in dict.fromkeys(args.cases) or available:
        if name not in available:
            return usage_error(f"no case named {name!r} in {suite} (cases: {', '.join(available)})")
        selected.append(available[name])

    recording = action == "record"
    try:
        results = trio.run(_run_all, selected, command, args.timeout, recording)
    except BaseException as exc:
        # Ctrl-C: the adapter running is killed on the way out (the driver
        # does it, shielded), and the cases already printed stand.
        if not interrupted(exc):
            raise
        return INTERRUPTED
    failed = sum(not r.ok for r in results)
    done = len(results) - failed
    print(f"{done} {'recorded' if recording else 'passed'}, {failed} failed", flush=True)
    return 1 if failed else 0


async def _run_all(
    cases: Sequence[Path], command: Sequence[str], timeout: float, recording: bool
) -> list[CaseResult]:
    results = []
    for directory in cases:
        run = record_case if recording else verify_case
        result = await run(directory, command, timeout=timeout)
        print(format_result(result, recording=recording), flush=True)
        results.append(result)
    return results
