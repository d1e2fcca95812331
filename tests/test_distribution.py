"""The distribution is recall-streamd ("streamd" on the package index is an
unrelated project): what is installed carries that name and streamd's version,
every install hint names it, and no install line anywhere in the clone names
the other project."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

import streamd
from streamd.errors import RpcError
from streamd.eventlog import EventLog

REPO = Path(__file__).resolve().parents[1]


def test_the_installed_distribution_is_recall_streamd_at_streamds_version():
    # Fails on an environment installed before the rename: reinstall it
    # (`pip install -e '.[test]'`), as .ci/run does on a fresh clone.
    assert importlib.metadata.version("recall-streamd") == streamd.__version__
    dist = importlib.metadata.distribution("recall-streamd")
    assert "streamd = streamd.cli:main" in (dist.read_text("entry_points.txt") or "")


def test_the_project_names_itself_recall_streamd_and_its_extras_so():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "recall-streamd"
    assert project["scripts"] == {"streamd": "streamd.cli:main"}
    assert "recall-streamd[adk]" in project["optional-dependencies"]["test"]
    assert "recall-streamd[postgres]" in project["optional-dependencies"]["test"]


async def test_the_postgresql_hint_names_recall_streamd(monkeypatch):
    # psycopg missing: the import of the PostgreSQL runner fails.
    monkeypatch.setitem(sys.modules, "streamd.eventlog.postgres.runner", None)
    log = EventLog("postgresql://agent@localhost/events")
    with pytest.raises(RpcError) as err:
        async with log:
            await log.ping()
    assert err.value.message.endswith(" pip install 'recall-streamd[postgres]'"), err.value


def test_no_install_line_in_the_clone_names_the_other_project():
    # `pip install streamd`, `'streamd[adk]'`, `streamd[postgres]`: all the
    # other project's; `pip install -e .` in a clone is ours.
    other = re.compile(r"""pip install\s+(-\S+\s+)*['"]?streamd\b|(?<![\w-])streamd\[""")
    found = []
    for root, dirs, files in os.walk(REPO):
        # Not ours to fix: git's store, environments, build output, the Rust crate.
        dirs[:] = [d for d in dirs if d not in {".git", ".venv", "native", "build", "dist"}
                   and not d.endswith(".egg-info") and (d == ".ci" or not d.startswith("."))]
        for name in files:
            path = Path(root) / name
            if path.suffix not in {".md", ".py", ".toml", ".txt", ""} or path == Path(__file__):
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            found += [f"{path.relative_to(REPO)}:{n}"
                      for n, line in enumerate(text.splitlines(), 1) if other.search(line)]
    assert found == []
