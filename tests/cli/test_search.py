"""``streamd search`` (and ``expand``) for people: the query comes first, as
with grep and rg; what ``--json`` reports about missing files and unreadable
lines is said in human output too; a workdir is never silently taken over;
zero hits exit 1; a cut expansion says so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.manifests import flip_manifest_bit

from streamd.cli import main
from streamd.recall.persist.lock import WorkdirLock


def lines(text: str) -> list[str]:
    # Log lines (a warning of the indexing core, say) are not the command's output.
    return [ln for ln in text.splitlines() if not ln.startswith("streamd 2")]


def hits(out: list[str]) -> list[dict]:
    """The hit lines of ``search --json`` (JSON Lines: hits, then a summary)."""
    rows = [json.loads(line) for line in out]
    assert rows[-1]["type"] == "summary"
    return [row for row in rows if row["type"] == "hit"]


def run(capsys, *argv) -> tuple[int, list[str], list[str]]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), lines(err)


@pytest.fixture
def world(recall_world):
    w = recall_world
    w.write("a.jsonl",
            w.rec("r1", "2026-05-02T10:00:00Z", title="Deploy alpha", text="alpha went out"),
            w.rec("r2", "2026-05-02T10:05:00Z", title="Rollback", text="alpha rolled back"))
    w.write("b.jsonl",
            w.rec("b1", "2026-05-02T11:00:00Z", title="Beta", text="beta and alpha"),
            b"this line is not JSON\n")
    return w


# --- the query comes first -----------------------------------------------------------


def test_a_query_typed_between_two_paths_is_refused(world, capsys):
    a, b = world.path("a.jsonl"), world.path("b.jsonl")
    code, out, err = run(capsys, "search", a, "alpha", b)
    assert (code, out) == (2, [])
    assert err == [f"streamd: the query comes first: '{a}' is a file (streamd search QUERY "
                   f"PATH...; -e '{a}' searches for it)"]


def test_paths_then_the_query_the_old_order_is_refused_the_same_way(world, capsys):
    a = world.path("a.jsonl")
    code, _, err = run(capsys, "search", a, "alpha")
    assert code == 2 and err[0].startswith(f"streamd: the query comes first: '{a}' is a file")


def test_a_query_that_looks_like_a_stream_file_is_refused_even_if_missing(world, capsys):
    code, _, err = run(capsys, "search", "gone.jsonl", world.path("a.jsonl"))
    assert code == 2 and err[0].startswith("streamd: the query comes first: 'gone.jsonl'")


def test_dash_e_takes_any_query_and_leaves_every_word_a_path(world, capsys):
    a, b = world.path("a.jsonl"), world.path("b.jsonl")
    code, out, _ = run(capsys, "search", "-e", "beta", a, b, "--json")
    assert code == 0
    assert [c["source_record_id"] for c in hits(out)] == ["b1"]
    code, _, _ = run(capsys, "search", "-e", str(a), a)  # a file name, searched for
    assert code in (0, 1)
    for argv in (["--", "-zzz", a], ["-e", "-zzz", a], [a, "--query", "-zzz"]):
        code, _, err = run(capsys, "search", *argv)
        assert code == 1 and err[0].startswith("0 matched of 2 records"), argv


def test_options_may_sit_among_the_paths(world, capsys):
    code, out, _ = run(capsys, "search", "alpha", world.path("a.jsonl"), "--limit", "1",
                       world.path("b.jsonl"))
    assert code == 0 and len(out) == 1


def test_a_query_without_a_path_is_a_usage_error(world, capsys):
    assert run(capsys, "search", "alpha") == (
        2, [], ["streamd: search needs at least one PATH after the query"])


# --- what --json knows, human output says ---------------------------------------------


def test_a_missing_file_is_an_error_and_nothing_is_searched(world, capsys):
    gone = world.path("gone.jsonl")
    code, out, err = run(capsys, "search", "alpha", world.path("a.jsonl"), gone)
    assert (code, out) == (2, [])
    assert err == [f"streamd: {gone}: no such file"]


def test_lines_that_are_not_records_are_said_on_stderr(world, capsys):
    code, out, err = run(capsys, "search", "alpha", world.path("b.jsonl"))
    assert code == 0 and len(out) == 1
    assert err[0].endswith("; 1 line could not be read as records")


# --- a workdir holding another file set's index ---------------------------------------


def test_a_workdir_of_other_files_is_refused_without_rebuild(world, capsys):
    work = world.root / "work"
    a, b = world.path("a.jsonl"), world.path("b.jsonl")
    assert run(capsys, "index", a, "--workdir", work)[0] == 0
    manifest = (work / "index" / "manifest.json").read_bytes()
    for command in (["search", "alpha", b], ["expand", "v2/b1", b], ["index", b]):
        code, out, err = run(capsys, *command, "--workdir", work)
        assert (code, out) == (2, [])
        assert err == [f"streamd: --workdir {work} holds the index of other files "
                       "(a.jsonl); give --rebuild to replace it"]
    assert (work / "index" / "manifest.json").read_bytes() == manifest
    code, out, _ = run(capsys, "search", "beta", b, "--workdir", work, "--rebuild")
    assert code == 0 and "stream:v2/b1" in out[0]
    assert run(capsys, "search", "beta", b, "--workdir", work)[0] == 0  # now it is b's



@pytest.mark.subprocess
@pytest.mark.parametrize("command", [["index"], ["search", "beta"]])
def test_a_workdir_another_command_fills_with_other_files_while_this_one_waits_is_refused(
        world, capsys, monkeypatch, command):
    # `streamd index a.jsonl --workdir w & streamd index b.jsonl --workdir w`:
    # both found w empty, the second waited for the first's lock, then built
    # b over a's index (exit 0 for both, a's index gone, never said).
    work = world.root / "work"
    a, b = world.path("a.jsonl"), world.path("b.jsonl")
    first = []

    def held_by_another(lock: WorkdirLock) -> bool:
        if not first:
            # Another process holds the lock: the other command, which
            # builds a.jsonl's index meanwhile.
            first.append(subprocess.run(
                [sys.executable, "-m", "streamd", "index", str(a), "--workdir", str(work)],
                capture_output=True, timeout=120))
            return False
        return try_acquire(lock)

    try_acquire = WorkdirLock.try_acquire
    monkeypatch.setattr(WorkdirLock, "try_acquire", held_by_another)
    code, out, err = run(capsys, *command, b, "--workdir", work)
    assert first[0].returncode == 0, first[0].stderr
    assert (code, out) == (2, [])
    assert err[-1] == (f"streamd: --workdir {work} holds the index of other files "
                       "(a.jsonl); give --rebuild to replace it")
    manifest = json.loads((work / "index" / "manifest.json").read_bytes())
    assert [f["path"] for f in manifest["files"]] == [str(a)]
    monkeypatch.undo()
    assert run(capsys, "search", "-e", "r1", a, "--workdir", work)[0] == 0


def test_a_manifest_naming_other_files_only_because_it_is_damaged_is_no_refusal(
        world, capsys):
    # One bit of the manifest's path flipped ("a.jsonm"): the workdir was
    # refused as another file set's until --rebuild. The manifest fails its
    # checksum, the checkpoint names the files, and the index is built anew.
    work = world.root / "work"
    a = world.path("a.jsonl")
    assert run(capsys, "index", a, "--workdir", work)[0] == 0
    flip_manifest_bit(work / "index" / "manifest.json", "files.path", "value")
    code, out, err = run(capsys, "search", "alpha", a, "--workdir", work)
    assert code == 0 and "stream:v2/r1" in "".join(out), err

def test_the_same_files_reuse_the_workdir_without_full(world, capsys):
    work = world.root / "work"
    a = world.path("a.jsonl")
    assert run(capsys, "index", a, "--workdir", work)[0] == 0
    assert run(capsys, "search", "alpha", a, "--workdir", work)[0] == 0


# --- exit status like grep and rg -----------------------------------------------------


def test_zero_hits_exit_1_and_print_no_hit(world, capsys):
    code, out, err = run(capsys, "search", "nothingmatches", world.path("a.jsonl"))
    assert (code, out) == (1, [])
    assert err[0].startswith("0 matched of 2 records")
    code, out, _ = run(capsys, "search", "nothingmatches", world.path("a.jsonl"), "--json")
    assert code == 1 and hits(out) == []


def test_hits_exit_0(world, capsys):
    assert run(capsys, "search", "alpha", world.path("a.jsonl"))[0] == 0


# --- expand --------------------------------------------------------------------------


def test_a_cut_expansion_ends_with_a_marker(world, capsys):
    code, out, _ = run(capsys, "expand", "v2/r1", world.path("a.jsonl"), "--budget", "20")
    assert code == 0
    assert out[-2].endswith("…")
    assert out[-1] == "[truncated at --budget 20 bytes; --budget 0 prints it all]"
    code, out, _ = run(capsys, "expand", "v2/r1", world.path("a.jsonl"))
    assert code == 0 and not any("truncated" in ln for ln in out)


def test_the_json_of_a_cut_expansion_is_the_wire_result(world, capsys):
    code, out, _ = run(capsys, "expand", "v2/r1", world.path("a.jsonl"), "--budget", "20",
                       "--json")
    (line,) = out
    result = json.loads(line)
    assert code == 0 and result["truncated"] is True
    assert result["truncation_boundary"] == "budget_bytes"
    assert len(result["content"].encode()) <= 20


def test_a_locator_that_cannot_be_one_is_a_usage_error(world, capsys):
    code, _, err = run(capsys, "expand", "v2/r1\nx", world.path("a.jsonl"))
    assert code == 2
    assert err == ["streamd: 'v2/r1\\nx' is not a locator (like stream:v2/r1, as search "
                   "prints them)"]
