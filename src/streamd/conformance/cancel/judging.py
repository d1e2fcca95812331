"""Judging an observation: pure functions over the frames a run collected.

A scenario's judge says one of three things (:class:`Verdict`):

- ``pass``: the adapter met the rule the row cites.
- ``fail``: it broke it: a result after a cancel, two answers to one request,
  no answer where one is owed, an answer to a notification, a hang, an exit
  status other than 0.
- ``observed``: the protocol leaves this behaviour open, or streamd
  deliberately differs from the reference here, and the adapter did something
  other than what streamd does. The row says what, and the kit does not fail.

No judgement reads a time. Times are measured and reported (the
``times`` of a :class:`Judgement`); whether a cancel "was fast enough" is not
a rule of the protocol, and a judgement that depended on it would fail on a
loaded machine for a reason that is not the adapter's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamd.conformance.cancel.script import Observation, Received, RequestId
from streamd.conformance.transcript import json_equal, render

Verdict = Literal["pass", "fail", "observed"]

#: Recall's deadline_exceeded: what a cancelled or timed-out request answers.
DEADLINE_EXCEEDED = -32007


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    detail: str  # one sentence a reader can act on
    times: dict[str, float] = field(default_factory=dict)  # milliseconds, reported only

    @property
    def ok(self) -> bool:
        return self.verdict != "fail"


class Findings:
    """What a judge found, collected as it checks; :meth:`judgement` orders it:
    any failure fails the row, else anything observed makes it ``observed``."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.observations: list[str] = []
        self.facts: list[str] = []
        self.times: dict[str, float] = {}

    def fail(self, text: str) -> None:
        self.failures.append(text)

    def observe(self, text: str) -> None:
        self.observations.append(text)

    def fact(self, text: str) -> None:
        self.facts.append(text)

    def time(self, name: str, start: float | None, end: float | None) -> None:
        if start is not None and end is not None:
            self.times[name] = round((end - start) * 1000, 1)

    def judgement(self) -> Judgement:
        if self.failures:
            return Judgement("fail", "; ".join(self.failures + self.facts), self.times)
        if self.observations:
            return Judgement("observed", "; ".join(self.observations + self.facts), self.times)
        return Judgement("pass", "; ".join(self.facts), self.times)


# --------------------------------------------------------------------------
# Reading frames
# --------------------------------------------------------------------------


def is_response(frame: Any) -> bool:
    return isinstance(frame, dict) and "method" not in frame and "id" in frame


def answers(obs: Observation, request_id: RequestId) -> list[Received]:
    """Every response to ``request_id``, in arrival order (JSON equality of
    ids: 2 and 2.0 are one id, 2 and "2" are two)."""
    return [
        r for r in obs.received if is_response(r.frame) and json_equal(r.frame["id"], request_id)
    ]


def stops_wait(received: Sequence[Received], request_id: RequestId) -> tuple[int, str] | None:
    """The number (from 1) of the first frame no JSON-RPC message can be, and
    why, when it came before any answer to ``request_id``; else None.

    A wait for that answer stops there, as the replayer's does: such a frame
    answers nothing and nothing says the answer will still come, so waiting on
    ended only at the scenario's timeout. Judged in arrival order, so whether
    a run stops never depends on how the frames were split into reads.
    """
    for n, r in enumerate(received, start=1):
        if r.bad is not None:
            return n, r.bad
        if is_response(r.frame) and json_equal(r.frame["id"], request_id):
            return None
    return None


def error_code(frame: Any) -> int | None:
    error = frame.get("error") if isinstance(frame, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def is_result(frame: Any) -> bool:
    return isinstance(frame, dict) and "result" in frame and "error" not in frame


def is_cancelled(frame: Any) -> bool:
    return error_code(frame) == DEADLINE_EXCEEDED and "result" not in frame


def describe(frame: Any) -> str:
    """A frame in a few words: ``result``, ``-32007 "context canceled"``."""
    if frame is None:
        return "a line that is not JSON"
    if is_result(frame):
        return "result"
    code = error_code(frame)
    if code is not None:
        message = frame["error"].get("message")
        return f"{code} {render(message)}" if isinstance(message, str) else str(code)
    return render(frame)


# --------------------------------------------------------------------------
# Checks every scenario makes
# --------------------------------------------------------------------------


def check_run(found: Findings, obs: Observation, *, exit_rule: bool = True) -> None:
    """The harness's own trouble, frames no JSON-RPC message can be, and the
    exit status (Recall: end of input and ``recall/shutdown`` end the process
    with 0)."""
    if obs.problem:
        found.fail(obs.problem)
    for n, r in enumerate(obs.received, start=1):
        if r.bad is not None and n != obs.stopped_at:  # that one the problem names
            found.fail(f"response {n} {r.bad}")
    if exit_rule and obs.problem is None and obs.exit_code not in (0, None):
        found.fail(f"exited with status {obs.exit_code}, not 0")


def check_no_strays(found: Findings, obs: Observation, requests: Iterable[RequestId]) -> None:
    """JSON-RPC 2.0: a notification is never answered. A response whose id is
    none of the requests sent answers a notification (a cancel)."""
    sent = list(requests)
    for r in obs.received:
        if not is_response(r.frame):
            continue
        if not any(json_equal(r.frame["id"], i) for i in sent):
            found.fail(
                f"answered a notification: {describe(r.frame)} with id {render(r.frame['id'])}"
            )


def check_answered_once(
    found: Findings, obs: Observation, request_id: RequestId, label: str
) -> Received | None:
    """JSON-RPC 2.0: a request is answered, once. Returns the answer."""
    got = answers(obs, request_id)
    if not got:
        found.fail(f"{label} was never answered")
        return None
    if len(got) > 1:
        found.fail(
            f"{label} was answered {len(got)} times: "
            + ", then ".join(describe(r.frame) for r in got)
        )
    return got[0]


def check_cancelled(
    found: Findings, obs: Observation, request_id: RequestId, label: str
) -> Received | None:
    """Recall: a cancelled request answers -32007, never a result."""
    answer = check_answered_once(found, obs, request_id, label)
    if answer is not None:
        if is_result(answer.frame):
            found.fail(f"{label} answered a result after its cancel")
        elif not is_cancelled(answer.frame):
            found.fail(f"{label} answered {describe(answer.frame)}, not -32007")
        else:
            found.fact(f"{label}: {describe(answer.frame)}")
    return answer


def responses_to(obs: Observation, ids: Sequence[RequestId]) -> dict[RequestId, list[Received]]:
    return {i: answers(obs, i) for i in ids}
