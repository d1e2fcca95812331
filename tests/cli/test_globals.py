"""Global options work before or after the command, ``--version`` exists, every
subcommand answers ``--help``, every flag says what it does, and docs/cli.md or
docs/configuration.md names every flag (and no flag that is gone)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

import streamd
from streamd.cli import commands as cli
from streamd.eventlog import cli as log_cli
from streamd.resident import attach, control

THIN_USAGES = {"attach": attach.USAGE, "status": control.STATUS_USAGE, "stop": control.STOP_USAGE}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def walk(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(words, parser) of ``parser`` and every subcommand under it."""
    yield words, parser
    for name, sub in subparsers(parser).items():
        yield from walk(sub, (*words, name))


def every_command_line() -> list[tuple[str, ...]]:
    """Each command a person can ask --help of, as the words before --help."""
    lines = [words for words, _ in walk(cli.build_parser())]
    lines += [("log", *words) for words, _ in walk(log_cli.build_parser())][1:]
    lines += [("conformance",), ("conformance", "verify"), ("conformance", "record"),
              ("conformance", "cancel")]
    return sorted(set(lines))


def test_the_walk_sees_every_command():
    lines = every_command_line()
    for expected in [(), ("search",), ("attach",), ("log",), ("log", "sessions", "delete"),
                     ("conformance", "verify"), ("daemon",), ("demo",)]:
        assert expected in lines
    assert len(lines) >= 25


@pytest.mark.parametrize("words", every_command_line(), ids=" ".join)
def test_every_subcommand_answers_help(words, capsys):
    assert cli.main([*words, "--help"]) == 0
    out, err = capsys.readouterr()
    # Asked for, help is the answer: on stdout, as grep's and rg's (a pager
    # or `| head` reads it); stderr is for mistakes.
    assert out.strip() and "usage:" in out
    assert err == ""


def test_every_flag_has_help_text():
    parsers = [(("streamd",), cli.build_parser()), (("streamd", "log"), log_cli.build_parser())]
    missing = []
    for prefix, top in parsers:
        for words, p in walk(top):
            for action in p._actions:  # positionals say what they are too
                if action.help == argparse.SUPPRESS or isinstance(
                        action, argparse._SubParsersAction):
                    continue
                if not (action.help or "").strip():
                    name = action.option_strings[-1] if action.option_strings else action.dest
                    missing.append(" ".join((*prefix, *words, name)))
    assert missing == []


@pytest.mark.parametrize(("command", "flags"), [
    ("attach", ["--runtime-dir", "--start-timeout", "--help"]),
    ("status", ["--json", "--runtime-dir", "--help"]),
    ("stop", ["--runtime-dir", "--help"]),
])
def test_the_thin_clients_say_what_each_flag_does(command, flags):
    lines = THIN_USAGES[command].split("options:")[1].splitlines()
    for flag in flags:
        (line,) = [ln for ln in lines if flag in ln.split()]
        assert len(line.split(flag, 1)[1].split()) >= 3  # a description follows


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"streamd {streamd.__version__}\n"


def test_db_before_log_is_the_same_as_after_it(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("STREAMD_DB", raising=False)
    db = tmp_path / "x.db"
    at = ["--app", "a", "--user", "u", "--session", "s"]
    assert cli.main(["--db", str(db), "log", "append", *at, "--author", "me", "--text", "hi"]) == 0
    assert cli.main(["--db", str(db), "log", "ping"]) == 0
    assert cli.main([f"--db={db}", "log", "ping"]) == 0
    assert cli.main(["log", "ping", "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["seq 1"] + [f"ok: {db} (latest seq 1)"] * 3


def test_an_option_after_the_command_wins_over_one_before_it(tmp_path: Path, capsys):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    at = ["--app", "a", "--user", "u", "--session", "s"]
    cli.main(["--db", str(a), "log", "append", *at, "--author", "me", "--text", "hi"])
    assert cli.main(["--db", str(b), "log", "append", "--db", str(a), *at,
                     "--author", "me", "--id", "x", "--text", "hi"]) == 0
    assert a.exists() and not b.exists()
    capsys.readouterr()


def test_verbose_works_before_or_after_a_command(tmp_path: Path, capsys):
    stream = tmp_path / "s.jsonl"
    stream.write_text('{"schema": 2, "id": "r1", "event_time": "2026-05-02T10:00:00Z", '
                      '"title": "alpha"}\n')
    assert cli.main(["-v", "search", "alpha", str(stream)]) == 0
    assert cli.main(["search", "alpha", str(stream), "-v"]) == 0
    capsys.readouterr()


def test_global_daemon_options_reach_the_daemon_before_or_after_serve():
    p = cli.build_parser()
    before = cli._config(p.parse_args(["--db", "/a.db", "--watch-interval-ms", "50", "serve"]))
    after = cli._config(p.parse_args(["serve", "--db", "/a.db", "--watch-interval-ms", "50"]))
    assert before == after and before.db == "/a.db" and before.watch_interval == 0.05


@pytest.mark.parametrize(("argv", "line"), [
    (["--db", "x.db", "search", "q", "s.jsonl"],
     "streamd: --db does not apply to search (see 'streamd search --help')"),
    (["--synchronous", "NORMAL", "log", "ping"],
     "streamd: --synchronous does not apply to log (see 'streamd log --help')"),
    (["--watch-interval-ms", "50", "log", "ping"],
     "streamd: --watch-interval-ms applies to log tail only"),
    (["-v", "status"], "streamd: -v does not apply to status (see 'streamd status --help')"),
    (["--db", "x.db", "attach"], "streamd: --db does not apply to attach: the daemon's "
     "options go after 'streamd attach --'"),
    (["--db", "x.db", "conformance", "verify", "conformance/stream"],
     "streamd: --db does not apply to conformance (see 'streamd conformance --help')"),
])
def test_a_global_option_before_a_command_it_means_nothing_to_is_refused(argv, line, capsys):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [line]


@pytest.mark.parametrize("value", ["bogus", "basic_format"])
def test_a_log_level_that_is_none_is_said_once_and_the_default_kept(
    tmp_path: Path, value: str
) -> None:
    # Any name of Python's logging module was taken for a level, silently:
    # "bogus" left the default without a word, "basic_format" made the level a
    # format string.
    import os
    import subprocess
    import sys

    env = {**os.environ, "STREAMD_LOG": value}
    # The server on stdio, whose input ends at once.
    done = subprocess.run(
        [sys.executable, "-m", "streamd", "serve", "--db", str(tmp_path / "e.db")],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "STREAMD_LOG" in line]
    assert said == [f"streamd: STREAMD_LOG={value!r} is not a log level (debug, info,"
                    " warning, error, critical); logging at warning"]


# --- every flag is documented, and every documented flag exists -----------------

DOC_PAGES = ("cli.md", "configuration.md")
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# --full is refused naming its replacement (cli.md keeps the table of renames).
NOT_LISTED = {"--full", "--help"}


def listed_flags(help_text: str) -> set[str]:
    """The long flags a help lists as options (not those its prose mentions)."""
    found: set[str] = set()
    for line in help_text.splitlines():
        if line.lstrip().startswith("-"):
            found.update(LONG_FLAG.findall(re.split(r"\s{2,}", line.strip())[0]))
    return found - {"--help"}


def every_help(capsys) -> dict[str, str]:
    texts = dict(THIN_USAGES)
    for words in [*every_command_line(), ("conformance", "cancel")]:
        assert cli.main([*words, "--help"]) == 0
        out, err = capsys.readouterr()
        texts[" ".join(("streamd", *words))] = out + err
    return texts


def documented_flags() -> set[str]:
    docs = Path(__file__).resolve().parents[2] / "docs"
    return set(LONG_FLAG.findall("\n".join((docs / p).read_text() for p in DOC_PAGES)))


def test_every_flag_a_help_lists_is_on_the_cli_or_configuration_page(capsys):
    pages = documented_flags()
    missing = sorted(f"{command}: {flag}" for command, text in every_help(capsys).items()
                     for flag in listed_flags(text) - pages)
    assert missing == []


def test_every_flag_the_cli_and_configuration_pages_name_exists(capsys):
    helped = set().union(*map(listed_flags, every_help(capsys).values()))
    assert {"--tree", "--start-timeout", "--trials", "--log-file"} <= helped  # the walk's reach
    assert sorted(documented_flags() - helped - NOT_LISTED) == []


def test_the_conformance_usage_names_every_flag_of_each_action(capsys):
    from streamd.conformance.cli import USAGE

    # It is what `streamd conformance --help` prints; its cancel line lacked --timeout.
    usage: dict[str, str] = {}
    action = ""
    for line in USAGE.splitlines():  # a line without "conformance" continues the one above
        action = line.split("conformance ")[1].split()[0] if "conformance " in line else action
        usage[action] = usage.get(action, "") + line
    assert set(usage) == {"verify", "record", "cancel"}
    for action, text in usage.items():
        assert cli.main(["conformance", action, "--help"]) == 0
        out, err = capsys.readouterr()
        assert set(LONG_FLAG.findall(text)) == listed_flags(out + err), action


def doc_examples() -> list[tuple[str, list[str]]]:
    """(page, argv) of each streamd command line shown in a code block of the README
    or a page of docs/ (the dated measurement pages aside), synopses left out."""
    repo = Path(__file__).resolve().parents[2]
    found = []
    for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        if page.name.startswith("measurements"):
            continue
        fenced = False
        for line in page.read_text().splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            shown = re.match(r"^(?:\$ )?(?:[A-Z_]+=\S+ )*(streamd .*)$", line.strip())
            if (fenced or line.startswith("    ")) and shown and not re.search(
                    r"[\[|]|\.\.\.|  \w", shown.group(1).split("#")[0]):
                found.append((page.name, shlex.split(shown.group(1), comments=True)))
    return found


def test_every_command_line_the_docs_show_uses_flags_its_command_takes(capsys):
    helps = every_help(capsys)
    examples = doc_examples()
    assert len(examples) > 30  # the tour, operations, databases, the cancellation kit
    wrong = []
    for page, argv in examples:
        key, i = "streamd", 1
        while i < len(argv) and argv[i] != "--":
            word = argv[i]
            if word.startswith("-"):
                flag = word.split("=")[0]
                if flag.startswith("--") and flag not in listed_flags(helps[key]):
                    wrong.append(f"{page}: {' '.join(argv)}: {flag} is not a flag of {key}")
            elif f"{key} {word}" in helps:
                key = f"{key} {word}"
            i += 1
    assert wrong == []
