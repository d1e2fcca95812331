"""``streamd conformance cancel``: run the matrix, print a row per scenario.

Exit status: 0 when every row passes or is observed, 1 when any fails (or a
recording was refused), 2 for a usage error, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import trio

from streamd.cli.args import INTERRUPTED, interrupted
from streamd.conformance.cancel.live import DEFAULT_TIMEOUT, make_place, observe, run_scenario
from streamd.conformance.cancel.matrix import matrix, offers_stall, probe
from streamd.conformance.cancel.record import record_scenarios
from streamd.conformance.cancel.report import Row, format_row, row_json
from streamd.conformance.cancel.scenario import RACE_TRIALS, Scenario
from streamd.conformance.cli import adapter_command, format_result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="streamd conformance cancel",
        description=(
            "Run the cancellation matrix against a Recall adapter: each scenario against a "
            "fresh process and fixture, one row each, with the rule it checks."
        ),
    )
    parser.add_argument("scenarios", metavar="SCENARIO", nargs="*",
                        help="scenario names (default: all)")
    parser.add_argument("--adapter", metavar="CMD",
                        help="adapter command line, split like a shell would "
                        "(default: this Python -m streamd)")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario")
    parser.add_argument("--record", metavar="DIR",
                        help="also write the lockstep-expressible scenarios as conformance "
                        "cases under DIR, recorded from the adapter")
    parser.add_argument("--trials", metavar="N", type=int, default=RACE_TRIALS,
                        help=f"trials per offset of the cancel/completion race "
                        f"(default {RACE_TRIALS})")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=DEFAULT_TIMEOUT,
                        help=f"per-scenario limit (default {DEFAULT_TIMEOUT:g})")
    try:
        args = parser.parse_intermixed_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    def usage_error(message: str) -> int:
        print(f"streamd conformance cancel: {message}", file=sys.stderr)
        return 2

    try:
        command = adapter_command(args.adapter)
    except ValueError as exc:
        return usage_error(str(exc))
    if args.trials < 1:
        return usage_error("--trials must be at least 1")
    if not args.timeout > 0:
        return usage_error("--timeout must be positive")
    known = [s.name for s in matrix()]
    for name in args.scenarios:
        if name not in known:
            return usage_error(f"no scenario named {name!r} (scenarios: {', '.join(known)})")
    record = Path(args.record) if args.record else None
    if record is not None and record.exists() and not record.is_dir():
        return usage_error(f"--record: {record} is not a directory")
    if record is not None:
        # Made before the scenarios run (minutes), so that a DIR that cannot
        # be made is a usage error now rather than a traceback after them.
        try:
            record.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return usage_error(f"--record: cannot make {record}: {exc.strerror or exc}")

    try:
        return trio.run(_run, command, args, record)
    except BaseException as exc:
        # Ctrl-C: the adapter running is killed on the way out, shielded.
        if not interrupted(exc):
            raise
        return INTERRUPTED


async def _run(command: Sequence[str], args: argparse.Namespace, record: Path | None) -> int:
    stall = await _probe(command, args.timeout)
    if not args.json:
        said = {True: "offered", False: "not offered: searches are not held in flight",
                None: "unknown (the handshake failed)"}[stall]
        print(f"adapter: {shlex.join(command)}; debug_stall_ms {said}", flush=True)
    chosen = [
        s for s in matrix(stall=stall is not False, trials=args.trials)
        if not args.scenarios or s.name in args.scenarios
    ]
    rows = []
    for scenario in chosen:
        obs = await run_scenario(scenario, command, timeout=args.timeout)
        row = Row(scenario, obs, scenario.judge(obs))
        rows.append(row)
        if args.json:
            sys.stdout.buffer.write(row_json(row) + b"\n")
            sys.stdout.flush()
        else:
            print(format_row(row), flush=True)
    failed = sum(not r.ok for r in rows)
    refused = 0
    if record is not None:
        refused = await _record(chosen, record, command, args.timeout, quiet=args.json)
    if not args.json:
        counts = {v: sum(r.judgement.verdict == v for r in rows) for v in ("pass", "observed")}
        passed, observed = counts["pass"], counts["observed"]
        print(f"{passed} passed, {observed} observed, {failed} failed", flush=True)
    return 1 if failed or refused else 0


async def _probe(command: Sequence[str], timeout: float) -> bool | None:
    with tempfile.TemporaryDirectory(prefix="streamd-cancel-probe-",
                                     ignore_cleanup_errors=True) as root:
        place = make_place(Path(root))
        return offers_stall(await observe(command, probe(place), timeout=timeout))


async def _record(
    chosen: Sequence[Scenario], suite: Path, command: Sequence[str], timeout: float, quiet: bool
) -> int:
    results = await record_scenarios(chosen, suite, command, timeout)
    for result in results:
        # JSON Lines keep stdout to one kind of object; recording lines go to stderr.
        print(format_result(result, recording=True), file=sys.stderr if quiet else sys.stdout,
              flush=True)
    return sum(not r.ok for r in results)
