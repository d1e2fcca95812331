"""The cancellation conformance kit: ``streamd conformance cancel``.

A fixed matrix of cancellation scenarios run against any Recall adapter, each
against a fresh process and fixture, one row each with the rule it checks.
The parts stack bottom-up, each importing only the ones below it:

* :mod:`~streamd.conformance.cancel.script` - sans-I/O: the frames, the steps
  of a script (send, await an answer, pause, end of input), the lockstep flow
  of the transcript format as a script, and the :class:`Observation` a run makes.
* :mod:`~streamd.conformance.cancel.judging` - sans-I/O: reading frames and the
  checks judges share; pass, fail or observed, never from a measured time.
* :mod:`~streamd.conformance.cancel.scenario`,
  :mod:`~streamd.conformance.cancel.cancels`,
  :mod:`~streamd.conformance.cancel.endings` and
  :mod:`~streamd.conformance.cancel.matrix` - sans-I/O: the scenarios, each a
  script, a rule with its source, and a judge, and which of them a recorded
  case can express; the matrix in order, and the probe for ``debug_stall_ms``.
* :mod:`~streamd.conformance.cancel.live` - the Trio layer: a fresh process
  and directory per scenario, every frame collected and timed.
* :mod:`~streamd.conformance.cancel.report` and
  :mod:`~streamd.conformance.cancel.record` - a row as text or JSON Lines; the
  recordable scenarios written as cases and recorded by the replayer.
* :mod:`~streamd.conformance.cancel.cli` - argument parsing and the exit status.
"""

from streamd.conformance.cancel.judging import DEADLINE_EXCEEDED, Findings, Judgement, Verdict
from streamd.conformance.cancel.live import DEFAULT_TIMEOUT, EXIT_GRACE, observe, run_scenario
from streamd.conformance.cancel.matrix import matrix, offers_stall
from streamd.conformance.cancel.record import record_scenarios, write_case
from streamd.conformance.cancel.report import Row, format_row, row_json
from streamd.conformance.cancel.scenario import (
    BRIEF_MS,
    FIXTURE_FILES,
    HELD_MS,
    RACE_OFFSETS,
    RACE_TRIALS,
    Scenario,
)
from streamd.conformance.cancel.script import (
    Await,
    Close,
    Observation,
    Pause,
    Place,
    Received,
    Send,
    Sent,
    Step,
)

__all__ = [
    "BRIEF_MS",
    "DEADLINE_EXCEEDED",
    "DEFAULT_TIMEOUT",
    "EXIT_GRACE",
    "FIXTURE_FILES",
    "HELD_MS",
    "RACE_OFFSETS",
    "RACE_TRIALS",
    "Await",
    "Close",
    "Findings",
    "Judgement",
    "Observation",
    "Pause",
    "Place",
    "Received",
    "Row",
    "Scenario",
    "Send",
    "Sent",
    "Step",
    "Verdict",
    "format_row",
    "matrix",
    "observe",
    "offers_stall",
    "record_scenarios",
    "row_json",
    "run_scenario",
    "write_case",
]
