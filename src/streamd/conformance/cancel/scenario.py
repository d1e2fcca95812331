"""What a scenario is, the constants the matrix shares, and the checks its
judges share.

Every scenario runs against a fresh adapter process with a fresh copy of
:data:`FIXTURE_FILES` and an empty workdir. Searches are held in flight with
``debug_stall_ms`` (the reference's setting for exactly this, "an artificial
pre-scan delay"); an adapter whose settings schema lacks it is run without,
and a judgement that needed the hold says so instead of failing. Two holds:

- :data:`HELD_MS` (30 s): long enough that only a cancel, a deadline or end of
  input can end the request within a run, so "it ended" names its cause.
- :data:`BRIEF_MS` (1 s): for scenarios where the held work must finish on its
  own (the siblings of a cancelled request, the work a shutdown waits for).

Sources a row cites: Recall's adapter protocol (its ``docs/adapter-protocol.md``
and the ``recall/cancel`` params schema), JSON-RPC 2.0, and streamd's own
end-of-input rule (``docs/wire-eof.md``) where the protocol is silent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamd.conformance.cancel import script as s
from streamd.conformance.cancel.judging import (
    Findings,
    Judgement,
    answers,
    check_answered_once,
    check_cancelled,
    check_no_strays,
    check_run,
    describe,
    is_result,
)
from streamd.conformance.cancel.script import Observation, Place, Step

HELD_MS = 30_000
BRIEF_MS = 1_000
#: How far ahead scenario 8's deadline is set, from the moment its search is written.
MIDWAY_S = 1.5
#: Race offsets (seconds between a search and its cancel) and trials per offset.
RACE_OFFSETS = (0.0, 0.0005, 0.001, 0.002, 0.005)
RACE_TRIALS = 10

RECALL = "Recall adapter protocol"
CANCEL_SCHEMA = "Recall adapter protocol (recall/cancel params schema)"
JSONRPC = "JSON-RPC 2.0"
EOF_RULE = "streamd end of input (wire-eof.md); the protocol only asks for exit 0"

SEARCH_VOLATILE = ("/result/candidates/*/confirmed_at", "/result/diagnostics/elapsed_ms")
HEALTH_VOLATILE = ("/result/checked_at", "/result/last_success_at")

#: observed_at is given, so no answer depends on the time the index was built.
FIXTURE_FILES = {
    "signals.jsonl": (
        b'{"schema":1,"id":"sig-1","kind":"event","event_time":"2026-05-02T09:12:00Z",'
        b'"observed_at":"2026-05-02T09:12:04Z","system":"deploys",'
        b'"title":"deploy 41 started","body":"Rolling deploy of the indexer."}\n'
        b'{"schema":1,"id":"sig-2","kind":"event","event_time":"2026-05-02T09:20:00Z",'
        b'"observed_at":"2026-05-02T09:20:03Z","system":"deploys",'
        b'"title":"deploy 41 finished","body":"Every host is healthy."}\n'
        b'{"schema":2,"id":"sig-3","kind":"message","event_time":"2026-05-02T09:25:00Z",'
        b'"observed_at":"2026-05-02T09:25:02Z",'
        b'"title":"Release notes","text":"The deploy is done; notes follow.","actor":"ana"}\n'
    )
}


@dataclass(frozen=True)
class Scenario:
    name: str
    number: str  # the numbering, "7b" for a variant
    title: str
    rule: str
    source: str
    script: Callable[[Place], list[Step]]
    judge: Callable[[Observation], Judgement]
    # Lockstep request lines when the transcript format can express it (for
    # --record), with the frame count its rule predicts; None: live only.
    case: tuple[str, ...] | None = None
    responses: int = 0
    volatile: tuple[str, ...] = ()
    description: str = ""  # a recorded case's manifest description


# --------------------------------------------------------------------------
# Checks the judges share
# --------------------------------------------------------------------------


def start(obs: Observation, ids: Sequence[s.RequestId], exit_rule: bool = True) -> Findings:
    """The checks every row makes: the run itself, no answer to a
    notification, and a handshake that succeeded."""
    found = Findings()
    check_run(found, obs, exit_rule=exit_rule)
    check_no_strays(found, obs, ids)
    if 1 in ids:
        init = check_answered_once(found, obs, 1, "initialize")
        if init is not None and not is_result(init.frame):
            found.fail(f"initialize answered {describe(init.frame)}")
    return found


def cancelled(found: Findings, obs: Observation, rid: s.RequestId, label: str, held: bool) -> None:
    """-32007 and never a result; without a hold the search may win the race,
    which is then what the row reports."""
    if not held:
        got = answers(obs, rid)
        if len(got) == 1 and is_result(got[0].frame):
            found.observe(f"{label} finished before its cancel (no debug_stall_ms to hold it)")
            return
    check_cancelled(found, obs, rid, label)


def arrived_before(obs: Observation, rid: s.RequestId, label: str) -> bool | None:
    """Whether the answer to ``rid`` arrived before the line ``label`` was
    written: an order of events, not a measured time. A frame is stamped
    after it was read and a line as its write begins, so "before" means the
    answer existed before the line did."""
    got = answers(obs, rid)
    at = obs.sent_at(label)
    if not got or at is None:
        return None
    return got[0].at < at


def time_answer(
    found: Findings, obs: Observation, rid: s.RequestId, after: str,
    name: str = "cancel_to_answer_ms",
) -> None:
    """Report how long after the line ``after`` the answer to ``rid`` came."""
    got = answers(obs, rid)
    found.time(name, obs.sent_at(after), got[0].at if got else None)


def lockstep_scenario(
    name: str, number: str, title: str, rule: str, source: str,
    lines: Sequence[str], responses: int, volatile: tuple[str, ...],
    judge: Callable[[Observation], Judgement], why: str,
) -> Scenario:
    """A scenario the lockstep flow expresses: its live run is its case's
    conversation. ``why`` is the case's description: why the answer is right."""
    return Scenario(
        name, number, title, rule, source,
        script=lambda place: s.lockstep(lines, place),
        judge=judge, case=tuple(lines), responses=responses, volatile=volatile,
        description=f"{why} Rule ({source}): {rule}.",
    )

