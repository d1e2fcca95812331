"""What a cancellation scenario sends, and what a run of it observed: sans-I/O.

A scenario is a *script*: a list of steps the Trio layer
(:mod:`~streamd.conformance.cancel.live`) follows against a fresh adapter
process. The steps are few on purpose, so every scenario reads as a
transcript:

- :class:`Send` writes one line to the adapter's stdin.
- :class:`Await` waits until a response for one request id has arrived. It is
  how a script orders its sends after an answer without guessing at time.
- :class:`Pause` sleeps. Only the race of a cancel with its completion uses it,
  and only to drive the race at several offsets: no judgement reads a time.
- :class:`Close` closes stdin: end of input.

After the last step the runner closes stdin (if the script did not) and reads
stdout to its end, so every frame the adapter ever wrote is in the
:class:`Observation`, and "no frame for this cancel" is a statement about the
whole run, not about a window of time.

The frames are built here too (:func:`request`, :func:`notification`), with the
placeholders of the transcript format (``${FIXTURE}``, ``${WORKDIR}``) left in,
so one definition serves the live run (bound by :func:`bind`) and a recorded
conformance case (written as is).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from streamd.conformance.transcript import Await as LockstepAwait
from streamd.conformance.transcript import (
    BadFrame,
    Line,
    LineKind,
    classify,
    decode_frame,
    lockstep_steps,
    message,
    substitute,
)
from streamd.conformance.transcript import Send as LockstepSend

RequestId = int | str

#: Far enough that it never expires during a run; the transcript format wants
#: fixed deadlines, so a recorded case replays the same any day.
FAR_DEADLINE = "2099-01-01T00:00:00Z"
#: Already past at arrival, on any machine's clock.
PAST_DEADLINE = "2000-01-01T00:00:00Z"


@dataclass(frozen=True)
class Send:
    data: bytes  # one frame, without the newline; placeholders already bound
    label: str  # what it is, for the report ("recall/cancel 2", "search 3")
    # Seconds from the moment of writing: the runner puts that wall-clock
    # instant where the frame says ${DEADLINE}. Bound at the write, not when
    # the script is built, so a slow start cannot spend the deadline first.
    deadline_in: float | None = None


@dataclass(frozen=True)
class Await:
    id: RequestId  # wait until a response with this id has arrived


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Close:
    """End of input: the adapter's stdin is closed."""


Step = Send | Await | Pause | Close


# --------------------------------------------------------------------------
# What a run observed
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    at: float  # seconds since the adapter started
    label: str
    data: bytes


@dataclass(frozen=True)
class Received:
    at: float  # seconds since the adapter started
    data: bytes
    frame: Any  # decoded, or None when the line is not JSON (or nests past decoding)
    # Why no JSON-RPC message can be this frame, naming it clipped ("is not
    # JSON: panic: ..."), or None. The replayer's reading (transcript.message),
    # so the kit and a recorded case never disagree on what a bad frame is.
    bad: str | None = None

    @staticmethod
    def of(at: float, data: bytes) -> Received:
        try:
            return Received(at, data, message(data))
        except BadFrame as exc:
            bad = exc.about(data)
        try:
            frame = decode_frame(data)  # JSON all the same, it still shows in the row
        except ValueError:
            frame = None
        return Received(at, data, frame, bad)


@dataclass(frozen=True)
class Observation:
    """Everything one run saw. Times are reported, never judged."""

    sent: tuple[Sent, ...]
    received: tuple[Received, ...]
    exit_code: int | None  # None: it had to be killed, or never started
    exited_at: float | None  # when the process was seen to exit
    closed_at: float | None  # when stdin was closed
    problem: str | None = None  # the harness's own trouble: a hang, a kill
    stderr: bytes = b""  # the tail of what the adapter logged
    # The frame (numbered from 1) the script stopped at, waiting for an answer,
    # because no JSON-RPC message can be it; ``problem`` already names it.
    stopped_at: int | None = None

    def sent_at(self, label: str) -> float | None:
        for sent in self.sent:
            if sent.label == label:
                return sent.at
        return None


# --------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def request(request_id: Any, method: str, params: Any) -> str:
    return _frame({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def notification(method: str, params: Any) -> str:
    return _frame({"jsonrpc": "2.0", "method": method, "params": params})


def cancel(request_id: Any, method: str = "recall/cancel") -> str:
    return notification(method, {"id": request_id})


def initialize(stall_ms: int = 0) -> str:
    settings: dict[str, Any] = {"files": ["signals.jsonl"]}
    if stall_ms:
        settings["debug_stall_ms"] = stall_ms
    return request(
        1,
        "recall/initialize",
        {
            "protocol_version_min": 1,
            "protocol_version_max": 1,
            "workdir": "${WORKDIR}",
            "source_id": "signals",
            "location": "${FIXTURE}",
            "settings": settings,
        },
    )


def search(request_id: RequestId, deadline: str = FAR_DEADLINE) -> str:
    return request(
        request_id,
        "recall/search",
        {"query": "deploy", "filters": {}, "limit": 5, "deadline": deadline},
    )


def expand(request_id: RequestId, deadline: str = FAR_DEADLINE) -> str:
    return request(
        request_id,
        "recall/expand",
        {"locator": "signals:v1/sig-1", "detail": "summary", "budget_bytes": 0,
         "deadline": deadline},
    )


def health(request_id: RequestId, deadline: str = FAR_DEADLINE) -> str:
    return request(request_id, "recall/health", {"deadline": deadline})


def refresh(request_id: RequestId, deadline: str = FAR_DEADLINE) -> str:
    return request(request_id, "recall/refresh", {"deadline": deadline})


def shutdown(request_id: RequestId) -> str:
    return request(request_id, "recall/shutdown", {})


def rfc3339(unix_ns: int) -> str:
    """A wall-clock instant as the protocol writes a deadline (milliseconds)."""
    at = dt.datetime.fromtimestamp(unix_ns / 1e9, dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _frame(value: Any) -> str:
    return _encoder.encode(value).decode()


# --------------------------------------------------------------------------
# Binding and the lockstep flow
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where one run's fixture and workdir are."""

    fixture: str
    workdir: str


def bind(template: str, place: Place, label: str) -> Send:
    return Send(substitute(template, fixture=place.fixture, workdir=place.workdir).encode(), label)


def label_of(template: str) -> str:
    """A short name for a line in a report: ``search 2``, ``recall/cancel 2``."""
    frame = decode_frame(template.encode())
    method = str(frame.get("method", "?")).removeprefix("recall/")
    if "id" in frame:
        return f"{method} {_id_text(frame['id'])}"
    params = frame.get("params")
    if not isinstance(params, dict) or "id" not in params:
        return f"{frame.get('method')} (no id)"
    return f"{frame.get('method')} {_id_text(params['id'])}"


def _id_text(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else _frame(value)


def lockstep(templates: Sequence[str], place: Place) -> list[Step]:
    """The transcript format's lockstep flow over ``templates`` as a script:
    a request waits for its response before the next request goes out, a
    notification goes out at once, and stdin closes after the last answer.
    The same plan the replayer follows, so a live run and a recorded case of
    one scenario are the same conversation."""
    lines = []
    labels = {}
    for number, template in enumerate(templates, start=1):
        data = substitute(template, fixture=place.fixture, workdir=place.workdir).encode()
        kind, request_id = classify(data)
        lines.append(Line(number, data, kind, request_id))
        labels[number] = label_of(template)
    steps: list[Step] = []
    for step in lockstep_steps(lines):
        if isinstance(step, LockstepSend):
            steps.append(Send(step.line.data, labels[step.line.number]))
        elif isinstance(step, LockstepAwait):
            steps.append(Await(step.line.id))
    steps.append(Close())
    return steps


def request_ids(steps: Iterable[Step]) -> list[RequestId]:
    """The id of every request a script sends, in order."""
    ids = []
    for step in steps:
        if isinstance(step, Send):
            kind, request_id = classify(step.data)
            if kind is LineKind.REQUEST:
                ids.append(request_id)
    return ids
