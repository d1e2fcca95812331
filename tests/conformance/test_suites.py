"""streamd's own Recall suites, replayed against the real process.

``conformance/stream`` is the suite Recall users point their config at, so it
must hold only what every faithful implementation does and only what Recall's
own replayer accepts. ``conformance/stream-streamd`` holds the rest: wire-level
cases that are not JSON requests, and every case that shows one of the
deliberate differences docs/differences.md lists.

Set ``STREAMD_REFERENCE_ADAPTER`` to a built reference ``recall-stream`` to
replay both suites against it too (docs/conformance.md says how to build one).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest

from streamd import conformance
from streamd.conformance.cancel import matrix as cancel_matrix

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
RECALL_SUITE = REPO / "conformance" / "stream"
STREAMD_SUITE = REPO / "conformance" / "stream-streamd"
# The event log as a Recall source: Recall's format only (its doctor replays
# it), against ``streamd --eventlog``.
EVENTLOG_SOURCE_SUITE = REPO / "conformance" / "eventlog-source"
# The cancellation kit's lockstep scenarios (streamd conformance cancel
# --record), recorded from streamd; Recall's format only.
CANCEL_SUITE = REPO / "conformance" / "cancel"
REFERENCE = os.environ.get("STREAMD_REFERENCE_ADAPTER")

# The manifest keys of Recall's transcript format; streamd's extensions
# (adapter_args, await_frames, place_files) belong in the streamd-only suite.
RECALL_MANIFEST_KEYS = {"case", "description", "flow", "placeholders", "volatile", "responses"}
PLACEHOLDER = re.compile(rb"\$\{([A-Za-z_]+)\}")

RECALL_CASES = 16
STREAMD_CASES = 4
EVENTLOG_SOURCE_CASES = 12
CANCEL_CASES = 9
# The cancel cases the reference passes too; the others show where streamd
# differs (a past deadline on expand, health, refresh; $/cancelRequest).
CANCEL_CASES_THE_REFERENCE_PASSES = {
    "cancel-inflight", "cancel-malformed", "cancel-not-inflight", "cancel-twice",
    "deadline-past-search",
}


def _cases(suite: Path) -> list[Path]:
    return conformance.discover_cases(suite)


def test_the_recall_suite_holds_exactly_its_cases():
    assert len(_cases(RECALL_SUITE)) == RECALL_CASES


def test_the_streamd_suite_holds_exactly_its_cases():
    assert len(_cases(STREAMD_SUITE)) == STREAMD_CASES


def test_the_eventlog_source_suite_holds_exactly_its_cases():
    assert len(_cases(EVENTLOG_SOURCE_SUITE)) == EVENTLOG_SOURCE_CASES


def test_the_cancel_suite_holds_exactly_the_kits_recordable_scenarios():
    recordable = {sc.name for sc in cancel_matrix() if sc.case is not None}
    assert {p.name for p in _cases(CANCEL_SUITE)} == recordable
    assert len(recordable) == CANCEL_CASES


@pytest.mark.parametrize(
    "case", _cases(RECALL_SUITE) + _cases(EVENTLOG_SOURCE_SUITE) + _cases(CANCEL_SUITE),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_recall_suite_case_is_one_recalls_replayer_accepts(case):
    manifest = json.loads((case / "manifest.json").read_bytes())
    assert set(manifest) <= RECALL_MANIFEST_KEYS, "a streamd extension belongs in stream-streamd"
    for number, line in enumerate((case / "request.jsonl").read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        # Recall's replayer refuses a request line that is not JSON.
        frame = msgspec.json.decode(line)
        assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", f"line {number}"
        for name in PLACEHOLDER.findall(line):
            assert name.decode() in manifest["placeholders"], f"line {number} uses ${name}"


@pytest.mark.parametrize("case", _cases(STREAMD_SUITE), ids=lambda p: p.name)
def test_every_streamd_only_case_says_which_difference_it_shows(case):
    description = json.loads((case / "manifest.json").read_bytes())["description"]
    assert description.startswith("Deliberate difference: ")


@pytest.mark.parametrize("suite", [RECALL_SUITE, STREAMD_SUITE, CANCEL_SUITE],
                         ids=lambda p: p.name)
def test_the_suite_replays_against_streamd(suite, capsys):
    assert conformance.main(["verify", str(suite)]) == 0, capsys.readouterr().out


def test_the_eventlog_source_suite_replays_against_streamd_eventlog(capsys):
    adapter = shlex.join([sys.executable, "-m", "streamd", "--eventlog"])
    verdict = conformance.main(["verify", str(EVENTLOG_SOURCE_SUITE), "--adapter", adapter])
    assert verdict == 0, capsys.readouterr().out


@pytest.mark.parametrize("case", _cases(EVENTLOG_SOURCE_SUITE), ids=lambda p: p.name)
def test_an_eventlog_source_case_writes_nothing_into_its_fixture(case):
    # Its log is built at initialize from the fixture's JSONL into WORKDIR.
    assert sorted(p.name for p in (case / "fixture").iterdir()) == ["events.jsonl"]


@pytest.mark.skipif(REFERENCE is None, reason="STREAMD_REFERENCE_ADAPTER is not set")
def test_the_recall_suite_replays_against_the_reference(capsys):
    assert conformance.main(["verify", str(RECALL_SUITE), "--adapter", REFERENCE]) == 0, (
        capsys.readouterr().out
    )


@pytest.mark.skipif(REFERENCE is None, reason="STREAMD_REFERENCE_ADAPTER is not set")
@pytest.mark.parametrize("case", _cases(STREAMD_SUITE), ids=lambda p: p.name)
def test_every_streamd_only_case_differs_from_the_reference(case, capsys):
    assert REFERENCE is not None
    argv = ["verify", str(STREAMD_SUITE), case.name, "--adapter", shlex.join([REFERENCE])]
    assert conformance.main(argv) == 1, capsys.readouterr().out


@pytest.mark.skipif(REFERENCE is None, reason="STREAMD_REFERENCE_ADAPTER is not set")
@pytest.mark.parametrize("case", _cases(CANCEL_SUITE), ids=lambda p: p.name)
def test_the_cancel_suite_against_the_reference_passes_exactly_where_it_agrees(case, capsys):
    assert REFERENCE is not None
    argv = ["verify", str(CANCEL_SUITE), case.name, "--adapter", shlex.join([REFERENCE])]
    want = 0 if case.name in CANCEL_CASES_THE_REFERENCE_PASSES else 1
    assert conformance.main(argv) == want, capsys.readouterr().out


def test_the_readmes_recall_config_names_paths_that_exist_in_a_clone():
    readme = (REPO / "README.md").read_text()  # the front door keeps the Recall setup
    pattern = r"<!-- recall-config -->\n```toml\n(.*?)```\n<!-- /recall-config -->"
    block = re.search(pattern, readme, re.S)
    assert block, "the README's Recall config block is gone"
    config = tomllib.loads(block.group(1).replace("/home/me/streamd", str(REPO)))
    adapter = config["adapters"]["streamd"]
    assert adapter["freshness_modes"] == ["indexed"]
    assert Path(adapter["conformance"]) == RECALL_SUITE
    # The quick start installs the script in .venv/bin of the clone; whatever
    # environment runs this test has the same script beside its interpreter.
    assert Path(adapter["command"]) == REPO / ".venv" / "bin" / "streamd"
    assert (Path(sys.executable).parent / "streamd").is_file()
    (source,) = config["sources"]
    assert source["adapter"] == "streamd"
    assert re.fullmatch(r"[A-Za-z0-9_-]{4,64}", source["source_uid"])


def test_the_eventlog_source_docs_recall_config_names_paths_that_exist_in_a_clone():
    page = (REPO / "docs" / "eventlog-source.md").read_text()
    pattern = (r"<!-- eventlog-recall-config -->\n```toml\n(.*?)```\n"
               r"<!-- /eventlog-recall-config -->")
    block = re.search(pattern, page, re.S)
    assert block, "the event-log source's Recall config block is gone"
    config = tomllib.loads(block.group(1).replace("/home/me/streamd", str(REPO)))
    adapter = config["adapters"]["streamd-eventlog"]
    assert adapter["args"] == ["attach", "--eventlog"]
    assert adapter["freshness_modes"] == ["indexed"]
    assert Path(adapter["conformance"]) == EVENTLOG_SOURCE_SUITE
    assert Path(adapter["command"]) == REPO / ".venv" / "bin" / "streamd"
    (source,) = config["sources"]
    assert source["adapter"] == "streamd-eventlog"
    assert re.fullmatch(r"[A-Za-z0-9_-]{4,64}", source["source_uid"])
    assert source["location"].endswith("/streamd/events.db")  # the daemon's default log
