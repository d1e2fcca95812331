"""Google ADK's own session-service contract, run on ``StreamdSessionService``.

ADK holds every session backend to the tests that take the ``session_service``
fixture in its ``tests/unittests/sessions/test_session_service.py``; a copy of
them, with what they import, is in ``../shared/adk-contract/`` (read-only, not
ours: see its README). This test copies that folder to a temporary directory
and runs ADK's tests there, as an ADK user would check a new backend: in a
subprocess, outside this repository's pytest configuration (which runs every
async test on Trio; ADK's run on pytest-asyncio), with our plugin
(``tests/adk/adk_contract/streamd_adk_contract_plugin.py``) adding streamd as one
more value of the fixture, and only streamd's cases selected. Every one must
pass, by default and with ``write_behind=True``, through the daemon and on a
log in the test's own process (``database=``).

The same by hand, from a copy ``C`` of the folder::

    cd C && PYTHONPATH=<repo>/tests/adk/adk_contract python -m pytest -p no:cacheprovider \\
        -p streamd_adk_contract_plugin -o asyncio_mode=auto \\
        tests/unittests/sessions/test_session_service.py -k streamd [--streamd-write-behind]
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

pytest.importorskip("google.adk")

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT.parent / "shared" / "adk-contract"
PLUGIN_DIR = Path(__file__).resolve().parent / "adk_contract"
CONTRACT_TESTS = 31
"""The tests of ADK's file that take the fixture (its README says so too)."""


def _run_contract(tmp_path: Path, *options: str) -> dict[str, str]:
    """Each streamd case of the contract and its outcome (passed, failed,
    error, skipped), from the run's JUnit report."""
    assert CONTRACT.is_dir(), f"ADK's contract tests are not at {CONTRACT}"
    for needed in ("pytest_asyncio", "sqlalchemy", "aiosqlite", "redis"):
        assert importlib.util.find_spec(needed) is not None, (
            f"ADK's contract tests need {needed}: pip install -e '.[test]'"
            " (google-adk[db,redis], pytest-asyncio)"
        )
    copy = tmp_path / "adk-contract"
    shutil.copytree(CONTRACT, copy)
    for path in [copy, *copy.rglob("*")]:  # the shared folder is read-only
        path.chmod(path.stat().st_mode | 0o200)
    # An empty configuration of the copy's own, so that pytest does not look
    # upwards for one (ours sets trio_mode).
    (copy / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PLUGIN_DIR), src, *filter(None, [env.get("PYTHONPATH")])]
    )
    argv = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "streamd_adk_contract_plugin",
        "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function",
        f"--junitxml={report}", "tests/unittests/sessions/test_session_service.py",
        "-k", "streamd", *options,
    ]
    done = subprocess.run(
        argv, cwd=copy, env=env, capture_output=True, text=True, timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert report.exists(), f"no report (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[case.get("name", "?")] = outcome
    bad = {name: o for name, o in outcomes.items() if o != "passed"}
    assert not bad, f"{bad}\n{done.stdout[-6000:]}"
    return outcomes


@pytest.mark.parametrize(
    "options",
    [(), ("--streamd-write-behind",), ("--streamd-in-process",),
     ("--streamd-in-process", "--streamd-write-behind")],
    ids=["durable", "write-behind", "in-process", "in-process-write-behind"],
)
def test_streamd_passes_adks_own_session_service_contract(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    outcomes = _run_contract(tmp_path, *options)
    assert len(outcomes) == CONTRACT_TESTS, sorted(outcomes)
    assert all(name.endswith("[streamd]") for name in outcomes)
