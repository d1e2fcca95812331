"""The cancellation matrix: every scenario in the issue's order, and the probe
that tells whether an adapter's settings schema offers ``debug_stall_ms``."""

from __future__ import annotations

from collections.abc import Sequence

from streamd.conformance.cancel import cancels, endings
from streamd.conformance.cancel import script as s
from streamd.conformance.cancel.judging import answers, is_result
from streamd.conformance.cancel.scenario import (
    BRIEF_MS,
    HELD_MS,
    RACE_OFFSETS,
    RACE_TRIALS,
    Scenario,
)
from streamd.conformance.cancel.script import Await, Close, Observation, Place, Step


def matrix(
    *, stall: bool = True, trials: int = RACE_TRIALS, offsets: Sequence[float] = RACE_OFFSETS
) -> list[Scenario]:
    """Every scenario, in the issue's order. ``stall`` is whether the adapter's
    settings schema offers ``debug_stall_ms``."""
    held = HELD_MS if stall else 0
    brief = BRIEF_MS if stall else 0
    return [
        cancels.cancel_inflight(held, stall),
        cancels.cancel_one_of_several(brief, stall),
        cancels.cancel_not_inflight(),
        cancels.cancel_twice(held, stall),
        cancels.cancel_races_completion(trials, offsets),
        cancels.cancel_malformed(held, stall),
        *(endings.deadline_past(method) for method in ("search", "expand", "health", "refresh")),
        endings.deadline_midway(held, stall),
        endings.shutdown_inflight(brief),
        endings.eof_inflight(held),
        endings.eof_inflight_eventlog(),
        cancels.cancel_lsp_spelling(held, stall),
    ]


# --------------------------------------------------------------------------
# The probe: does the settings schema offer debug_stall_ms?
# --------------------------------------------------------------------------


def probe(place: Place) -> list[Step]:
    """A handshake without settings beyond the file, to read the manifest."""
    return [s.bind(s.initialize(), place, "initialize 1"), Await(1), Close()]


def offers_stall(obs: Observation) -> bool | None:
    """Whether the handshake's settings_schema lists ``debug_stall_ms``; None
    when there was no manifest to read (the rows will say why)."""
    got = answers(obs, 1)
    if not got or not is_result(got[0].frame):
        return None
    manifest = got[0].frame["result"]
    schema = manifest.get("settings_schema") if isinstance(manifest, dict) else None
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return isinstance(properties, dict) and "debug_stall_ms" in properties
