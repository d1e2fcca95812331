"""A scenario's row, for people and as JSON Lines: values in, text out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from streamd.conformance.cancel.judging import Judgement, describe, is_response
from streamd.conformance.cancel.scenario import Scenario
from streamd.conformance.cancel.script import Observation

#: Lines of a long conversation (the race) shown before the rest is counted.
SHOWN = 8


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    observation: Observation
    judgement: Judgement

    @property
    def ok(self) -> bool:
        return self.judgement.ok


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _clipped(items: list[str]) -> str:
    if len(items) <= SHOWN:
        return ", ".join(items) or "(nothing)"
    return ", ".join(items[:SHOWN]) + f", ... ({len(items)} in all)"


def _received(obs: Observation) -> list[str]:
    out = []
    for r in obs.received:
        if is_response(r.frame):
            out.append(f"{msgspec.json.encode(r.frame['id']).decode()}: {describe(r.frame)}")
        elif isinstance(r.frame, dict) and "method" in r.frame:
            out.append(f"notification {r.frame['method']}")
        else:
            out.append(describe(r.frame))
    return out


def format_row(row: Row) -> str:
    sc, obs, j = row.scenario, row.observation, row.judgement
    lines = [
        f"{j.verdict.upper():8} {sc.number:4} {sc.name}: {sc.title}",
        f"         rule ({sc.source}): {sc.rule}",
        f"         sent: {_clipped([s.label for s in obs.sent])}"
        + (" | end of input" if obs.closed_at is not None else ""),
        f"         got:  {_clipped(_received(obs))}"
        + (f" | exit {obs.exit_code}" if obs.exit_code is not None else ""),
    ]
    if j.times:
        lines.append("         times: " + ", ".join(f"{k} {v:g}" for k, v in j.times.items()))
    if j.detail:
        lines.append(f"         {j.detail}")
    if j.verdict == "fail" and obs.stderr.strip():
        tail = obs.stderr.decode("utf-8", "replace").rstrip("\n").split("\n")[-5:]
        lines.append("         adapter stderr (last lines):")
        lines.extend(f"         | {line}" for line in tail)
    return "\n".join(lines)


def row_json(row: Row) -> bytes:
    """One JSON Lines object: the verdict, the rule and its source, and every
    frame sent and received with its time (ms since the adapter started)."""
    sc, obs, j = row.scenario, row.observation, row.judgement
    value: dict[str, Any] = {
        "scenario": sc.name,
        "number": sc.number,
        "title": sc.title,
        "pass": j.ok,
        "verdict": j.verdict,
        "rule": sc.rule,
        "source": sc.source,
        "detail": j.detail,
        "times": j.times,
        "sent": [
            {"at_ms": _ms(s.at), "label": s.label, "frame": _decoded(s.data)} for s in obs.sent
        ],
        "received": [
            {"at_ms": _ms(r.at), "frame": r.frame if r.frame is not None else
             r.data.decode("utf-8", "replace")}
            for r in obs.received
        ],
        "end_of_input_ms": _ms(obs.closed_at),
        "exit_code": obs.exit_code,
        "exited_ms": _ms(obs.exited_at),
        "problem": obs.problem,
    }
    return msgspec.json.encode(value)


def _decoded(data: bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data.decode("utf-8", "replace")
