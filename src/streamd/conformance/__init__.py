"""Replay recorded conformance transcripts against a live adapter, or record them.

The parts stack bottom-up, each importing only the ones below it:

* :mod:`~streamd.conformance.transcript` - the sans-I/O core, no Trio:
  placeholder substitution, volatile masking,
  structural comparison with the first difference, line classification and the
  lockstep plan (``adapter_args``, ``await_frames``, ``place_files``). The case format and the
  manifest keys are described there.
* :mod:`~streamd.conformance.case` - a case from its directory: manifest
  validation, loading, the requests and placements of one run, and the
  comparison of a run with its recording.
* :mod:`~streamd.conformance.driver` - the Trio driver: spawns the adapter in a
  fresh WORKDIR, follows the plan, drains stdout, kills on timeout, keeps the
  stderr tail; :func:`verify_case` and :func:`record_case` on top of it.
* :mod:`~streamd.conformance.cli` - ``streamd conformance {verify,record}``:
  argument parsing, one line per case, an exit status. ``python -m
  streamd.conformance`` runs it too.
"""

from streamd.conformance.case import (
    Case,
    Manifest,
    adapter_command,
    compare_transcript,
    discover_cases,
    load_case,
    placements,
    prepare_requests,
    validate_manifest,
)
from streamd.conformance.cli import STDERR_TAIL_LINES, USAGE, format_result, main
from streamd.conformance.driver import (
    DEFAULT_TIMEOUT,
    EXIT_GRACE,
    STDERR_SETTLE,
    STDERR_TAIL_BYTES,
    CaseResult,
    Run,
    record_case,
    run_transcript,
    verify_case,
)
from streamd.conformance.transcript import (
    ABSENT,
    FLOW_LOCKSTEP,
    PLACEHOLDERS,
    RENDER_LIMIT,
    VOLATILE,
    Await,
    AwaitFrames,
    BadFrame,
    CaseError,
    Difference,
    FrameLines,
    Line,
    LineKind,
    Place,
    Pointer,
    Send,
    Step,
    answers,
    classify,
    decode_frame,
    first_difference,
    format_pointer,
    json_equal,
    json_string_body,
    lockstep_steps,
    mask,
    message,
    parse_pointer,
    render,
    split_file_lines,
    substitute,
    substitute_arg,
)

__all__ = [
    "ABSENT",
    "DEFAULT_TIMEOUT",
    "EXIT_GRACE",
    "FLOW_LOCKSTEP",
    "PLACEHOLDERS",
    "RENDER_LIMIT",
    "STDERR_SETTLE",
    "STDERR_TAIL_BYTES",
    "STDERR_TAIL_LINES",
    "USAGE",
    "VOLATILE",
    "Await",
    "AwaitFrames",
    "BadFrame",
    "Case",
    "CaseError",
    "CaseResult",
    "Difference",
    "FrameLines",
    "Line",
    "LineKind",
    "Manifest",
    "Place",
    "Pointer",
    "Run",
    "Send",
    "Step",
    "adapter_command",
    "answers",
    "classify",
    "compare_transcript",
    "decode_frame",
    "discover_cases",
    "first_difference",
    "format_pointer",
    "format_result",
    "json_equal",
    "json_string_body",
    "load_case",
    "lockstep_steps",
    "main",
    "mask",
    "message",
    "parse_pointer",
    "placements",
    "prepare_requests",
    "record_case",
    "render",
    "run_transcript",
    "split_file_lines",
    "substitute",
    "substitute_arg",
    "validate_manifest",
    "verify_case",
]
