"""``streamd log`` has one shape: a session is ``--app A --user U --session S``
in every command that names one, the same flags the read commands filter by;
``--help`` advertises only what exists; and errors are said the way a person
would, never in the wire's vocabulary."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog import cli as log_cli
from streamd.eventlog.cli import build_parser, main

AT = ["--app", "app", "--user", "u", "--session", "s"]


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.db"
    monkeypatch.setenv("STREAMD_DB", str(path))
    return path


def run(capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def every_command() -> dict[str, argparse.ArgumentParser]:
    out = {}
    for name, p in subparsers(build_parser()).items():
        inner = subparsers(p)
        if inner:
            out.update({f"{name} {n}": q for n, q in inner.items()})
        else:
            out[name] = p
    return out


def flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


# The one exception: backup's destination is the object of the command (as
# cp's is), not a filter or a session's address, and there is only one.
_POSITIONAL = {"backup": ["dest"]}


def test_no_log_command_takes_a_positional_argument():
    for name, p in every_command().items():
        positionals = [a.dest for a in p._actions if not a.option_strings]
        assert positionals == _POSITIONAL.get(name, []), name


@pytest.mark.parametrize(("command", "required"), [
    ("append", {"--app", "--user", "--session"}),
    ("sessions get", {"--app", "--user", "--session"}),
    ("sessions delete", {"--app", "--user", "--session"}),
    ("sessions create", {"--app", "--user"}),
    ("sessions list", {"--app"}),
    ("since", set()), ("tail", set()), ("branches", set()), ("locks", set()),
])
def test_a_session_is_addressed_by_the_same_three_flags_everywhere(command, required):
    p = every_command()[command]
    have = flags(p)
    address = {f for f in ("--app", "--user", "--session") if f in have}
    assert address >= required
    assert {f for f in address if have[f].required} == required


def test_the_old_positional_shape_is_refused_with_the_one_that_works(db, capsys):
    code, out, err = run(capsys, "append", "app", "u", "s", "--author", "me")
    assert code == 2 and out == []
    assert err == ["streamd: missing --app, --user, --session; a session is given as "
                   "--app A --user U --session S (see 'streamd log append --help')"]
    assert not db.exists()



def test_listing_sessions_without_an_app_says_how_a_listing_is_asked_for(db, capsys):
    # sessions list takes no --session: the three-flag shape of one session
    # would send a reader adding flags the command refuses.
    code, out, err = run(capsys, "sessions", "list", "--user", "u")
    assert code == 2 and out == []
    assert err == ["streamd: missing --app; sessions are listed by --app A, and --user U "
                   "for one user's (see 'streamd log sessions list --help')"]
    assert not db.exists()

def test_the_shape_works_end_to_end(db, capsys):
    assert run(capsys, "sessions", "create", *AT)[0] == 0
    assert run(capsys, "append", *AT, "--author", "me", "--text", "hi")[1] == ["seq 1"]
    code, out, _ = run(capsys, "sessions", "get", *AT)
    assert code == 0 and out[0].startswith("app/u/s  created") and "me: hi" in out[1]
    assert run(capsys, "sessions", "list", "--app", "app", "--user", "u")[1][0].startswith(
        "app/u/s")
    assert [json.loads(x)["seq"] for x in run(capsys, "since", "--json", *AT)[1]] == [1]
    assert run(capsys, "sessions", "delete", *AT)[1] == ["deleted app/u/s"]


def test_deleting_a_session_that_never_existed_is_not_found_and_exit_1(db, capsys):
    run(capsys, "append", *AT, "--author", "me", "--text", "hi")
    code, out, err = run(capsys, "sessions", "delete", "--app", "app", "--user", "u",
                         "--session", "never")
    assert (code, out, err) == (1, [], ["streamd: session app/u/never not found"])
    assert run(capsys, "since")[1][0].split()[0] == "1"  # the log is unchanged



def test_log_help_says_every_reason_for_exit_1(capsys):
    # It named only a missing session; `log verify` exits 1 for problems found.
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "1 the session asked for does not exist, or verify found problems," in text

def test_log_help_advertises_only_commands_that_exist(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    top = subparsers(build_parser())
    listed = re.findall(r"^    (\w+) ", text, re.MULTILINE)
    assert listed == list(top)
    # The sessions line names its actions, and each of them exists.
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("sessions "))
    named = set(re.findall(r"\w+", line.split(None, 1)[1])) - {"or", "sessions"}
    assert named == set(subparsers(top["sessions"])) == {"list", "get", "create", "delete"}


def test_an_empty_session_is_said_as_a_person_would(db, capsys):
    code, _, err = run(capsys, "append", "--app", "app", "--user", "u", "--session", "",
                       "--author", "me")
    assert (code, err) == (2, ["streamd: --session must not be empty "
                               "(see 'streamd log append --help')"])


def test_a_value_only_the_log_checks_is_named_by_its_flag_not_its_wire_path():
    exc = RpcError(INVALID_PARAMS, "Expected `str` of length >= 1 - at `$.session`")
    assert log_cli._human(exc) == ("--session must not be empty", 2)
    exc = RpcError(INVALID_PARAMS, "Expected `int` >= 0 - at `$.from_seq`")
    assert log_cli._human(exc) == ("--from must be 0 or more", 2)
    exc = RpcError(INVALID_PARAMS, "Expected `str` of length >= 1 - at `$.filter.app`")
    assert log_cli._human(exc) == ("--app must not be empty", 2)


@pytest.mark.parametrize("argv", [
    ["sessions", "get", "--app", "app", "--user", "u", "--session", "nope"],
    ["sessions", "create", *AT],
    ["append", *AT, "--author", "other", "--id", "e1", "--text", "hi"],
    ["since", "--tree", "p"],
    ["append", *AT, "--author", "me", "--content", "{"],
])
def test_errors_carry_no_wire_vocabulary(db, capsys, argv):
    run(capsys, "append", *AT, "--author", "me", "--id", "e1", "--text", "hi")
    code, out, err = run(capsys, *argv)
    assert code in (1, 2) and out == [] and len(err) == 1
    line = err[0]
    assert line.startswith("streamd: ")
    for wire in ("$.", "invalid_params", "session_not_found", "event_conflict", "-320"):
        assert wire not in line, line


def test_an_error_inside_tails_nursery_is_one_line_not_an_exception_group(
    db, capsys, monkeypatch
):
    from streamd.errors import CLOSED

    run(capsys, "append", *AT, "--author", "me", "--text", "hi")

    def broken_watch(self, *args, **kwargs):
        raise RpcError(CLOSED, "event log is closed")

    monkeypatch.setattr(log_cli.EventLog, "watch", broken_watch)
    assert run(capsys, "tail") == (2, [], ["streamd: event log is closed"])


def test_a_nested_or_unknown_field_is_still_named_as_a_flag():
    from streamd.cli.args import said_of_flag

    assert said_of_flag("Expected `int` >= 1 - at `$.filters.limit`", {}) == (
        "--limit must be at least 1")
    assert said_of_flag("Expected `str`, got `int` - at `$.as_of`", {"as_of": "--as-of"}) == (
        "--as-of: Expected str, got int")
