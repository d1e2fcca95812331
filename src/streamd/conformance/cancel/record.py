"""``--record DIR``: the scenarios the lockstep flow can express, as conformance cases.

A case is written (manifest, request.jsonl, fixture/) and then recorded by
:func:`streamd.conformance.driver.record_case`, the replayer itself, so its
response.jsonl is an observation of the adapter, never a claim written here.
The manifest's ``responses`` is the count the scenario's rule predicts, so an
adapter that breaks the rule (a second answer, an answered notification) is
refused a recording instead of having its behaviour written down as the truth.
Only Recall's manifest keys are used, so Recall's doctor replays the cases too.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from streamd.conformance.cancel.scenario import FIXTURE_FILES, Scenario
from streamd.conformance.driver import CaseResult, record_case
from streamd.conformance.transcript import FLOW_LOCKSTEP

PLACEHOLDERS = {
    "FIXTURE": "absolute path of this case's fixture/ directory",
    "WORKDIR": "absolute path of a fresh, writable, empty directory",
}


def write_case(scenario: Scenario, suite: Path) -> Path:
    """The case directory of a recordable scenario, without its response.jsonl."""
    assert scenario.case is not None
    directory = suite / scenario.name
    fixture = directory / "fixture"
    if fixture.exists():
        shutil.rmtree(fixture)
    fixture.mkdir(parents=True)
    for name, data in FIXTURE_FILES.items():
        (fixture / name).write_bytes(data)
    manifest = {
        "case": scenario.name,
        "description": scenario.description,
        "flow": FLOW_LOCKSTEP,
        "placeholders": PLACEHOLDERS,
        "volatile": list(scenario.volatile),
        "responses": scenario.responses,
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (directory / "request.jsonl").write_text("".join(line + "\n" for line in scenario.case))
    return directory


async def record_scenarios(
    scenarios: Sequence[Scenario], suite: Path, command: Sequence[str], timeout: float
) -> list[CaseResult]:
    results = []
    for scenario in scenarios:
        if scenario.case is None:
            continue
        try:
            directory = write_case(scenario, suite)
        except OSError as exc:
            # DIR is the user's (missing parent, read-only, a file where a
            # case's directory goes): the scenario fails saying so, the rest
            # are still recorded.
            where = f": {exc.filename}" if exc.filename else ""
            detail = f"cannot write the case: {exc.strerror or exc}{where}"
            results.append(CaseResult(scenario.name, False, detail))
            continue
        results.append(await record_case(directory, command, timeout=timeout))
    return results
