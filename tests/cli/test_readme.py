"""The README says what is true in a clone: its Python API example runs and
prints what it shows, its ``conformance verify`` examples name suites that
exist, its Usage lists every command; and no test depends on a path that
exists on one machine only."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamd.cli import commands as cli

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def block(marker: str) -> str:
    m = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```\n<!-- /{marker} -->", README, re.S)
    assert m, f"no {marker} block in the README"
    return m.group(1)


def test_the_python_api_example_runs_and_prints_what_the_readme_shows(tmp_path: Path):
    shutil.copy(REPO / "src" / "streamd" / "data" / "sample.jsonl", tmp_path / "signals.jsonl")
    (tmp_path / "example.py").write_text(block("python-api"))
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    assert done.stdout == block("python-api-output")


def test_every_conformance_verify_example_names_a_suite_in_the_clone():
    examples = re.findall(r"streamd conformance verify ([^`\n]+)", README)
    assert len(examples) >= 4
    for example in examples:
        words = shlex.split(example)
        if words[0] == "DIR":
            continue  # the synopsis
        suite = REPO / words[0]
        assert suite.is_dir(), example
        cases = [w for w in words[1:] if not w.startswith("-")]
        if "--adapter" in words:
            cases = cases[:-1] if cases else cases  # the adapter command's own word
        for case in cases:
            assert (suite / case / "request.jsonl").exists(), example


def test_usage_lists_every_command():
    usage = README.split("## Usage\n", 1)[1].split("\n## ", 1)[0]
    for name in cli.subcommands(cli.build_parser()):
        assert re.search(rf"^    streamd (\S+ \| )*{name}\b", usage, re.M), name


def test_no_test_depends_on_a_path_that_exists_on_one_machine_only():
    host_only = re.compile(r"""["'](/(?:opt|work|srv|root|Users|mnt)/|/home/(?!me/))""")
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if host_only.search(line) and "host_only" not in line:
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert found == []


def tour() -> str:
    return README.split("### A tour on the sample stream\n", 1)[1].split("\n## ", 1)[0]


def test_the_tour_copies_the_sample_the_package_ships():
    (cp,) = re.findall(r"^    (cp \S+ signals\.jsonl)$", tour(), re.M)
    assert (REPO / shlex.split(cp)[1]).is_file()
    assert shlex.split(cp)[1] == "src/streamd/data/sample.jsonl"


def test_every_tour_example_runs_on_the_sample_and_prints_what_it_shows(tmp_path: Path):
    shutil.copy(REPO / "src" / "streamd" / "data" / "sample.jsonl", tmp_path / "signals.jsonl")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "XDG_STATE_HOME": str(tmp_path / "st"),
           "XDG_RUNTIME_DIR": str(tmp_path / "run"), "NO_COLOR": "1"}
    lines = tour().splitlines()
    ran = []
    for n, line in enumerate(lines):
        if not line.startswith("    streamd "):
            continue
        argv = shlex.split(line[4:], comments=True)
        if argv[1] == "log" and "tail" in argv:
            continue  # follows live until Ctrl-C: `log since` shows the same entries
        # The tour runs the suites "from the clone", the rest beside the sample.
        cwd = REPO if argv[1] == "conformance" else tmp_path
        done = subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (line, done.stderr)
        # Lines shown under an example (indented deeper) are what it prints;
        # a shown line ending in "..." is cut there.
        for shown in lines[n + 1:]:
            if not shown.startswith("      "):
                break
            want = shown.strip().removesuffix("...").rstrip()
            assert any(got.strip().startswith(want) for got in done.stdout.splitlines()), \
                (line, shown, done.stdout)
        ran.append(argv[1])
    assert {"search", "expand", "index", "log", "conformance"} <= set(ran)


def test_the_minimal_record_the_tour_shows_is_a_record(tmp_path: Path):
    (record,) = re.findall(r"a minimal record is\n`(\{.*?\})`", tour())
    (tmp_path / "mine.jsonl").write_text(record + "\n")
    done = subprocess.run([sys.executable, "-m", "streamd", "search", "deploy", "mine.jsonl"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    assert "stream:v1/n1" in done.stdout
    assert "could not be read" not in done.stderr


def test_the_readme_is_a_front_door_and_no_user_doc_names_the_tracker_or_one_machine():
    assert len(README.splitlines()) <= 300
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert len(pages) > 8
    banned = re.compile(r"\bissues? \d|#\d|/opt/|/work/|/root/|\.\./shared")
    found = [f"{page.relative_to(REPO)}:{n}: {line.strip()}"
             for page in pages
             for n, line in enumerate(page.read_text().splitlines(), 1) if banned.search(line)]
    assert found == []


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_reaches_its_page_and_heading():
    pages = [REPO / "README.md", REPO / "bench" / "README.md", REPO / "native" / "README.md",
             *sorted((REPO / "docs").glob("*.md"))]  # fmt: skip
    headings = {
        page.resolve(): {_anchor(line.lstrip("#")) for line in page.read_text().splitlines()
                         if line.startswith("#")}
        for page in pages
    }  # fmt: skip
    broken = []
    for page in pages:
        # A target of any file (a page, LICENSE, a folder), or none: a heading of this page.
        for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)", page.read_text()):
            linked = (page.parent / target).resolve() if target else page.resolve()
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} does not exist")
            elif anchor and anchor not in headings.get(linked, set()):
                broken.append(f"{page.relative_to(REPO)}: {target} has no heading #{anchor}")
    assert broken == []
