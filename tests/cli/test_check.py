"""A line that is not a record is named with its reason: ``streamd check``
lists every one as ``FILE:LINE: reason``; ``index`` and ``search`` name the
first few on stderr (the file as typed) and point at ``check`` for the rest;
``index`` does not exit 0 when lines failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamd.cli import main
from streamd.recall import check
from streamd.recall.records import MAX_LINE_BYTES

GOOD = b'{"schema": 2, "id": "r1", "event_time": "2026-05-02T10:00:00Z", "title": "alpha"}\n'
BAD = [
    (b"this is not json\n", "not JSON"),
    (b'{"id": "x", "event_time": "2026-05-02T10:00:00Z"}\n', 'record needs a "schema" (1 or 2)'),
    (b'{"schema": 7, "id": "x", "event_time": "2026-05-02T10:00:00Z"}\n',
     "schema 7 is not read (only schemas 1 and 2 are)"),
    (b'{"schema": 1, "title": "no id"}\n', "record needs an id and an event_time"),
    (b'{"schema": 2, "id": "x", "event_time": "noon"}\n', "event_time is not an RFC 3339 time"),
    (b"[1, 2]\n", "an array, not a JSON object"),
    (b'{"schema": 2, "id": "x\x00y", "event_time": "2026-05-02T10:00:00Z"}\n',
     "not JSON: a raw control character U+0000 in a string at column 23"
     " (JSON writes it as \\u0000)"),
    (b'{"schema": 2, "id": "x\\qy", "event_time": "2026-05-02T10:00:00Z"}\n',
     "not JSON: invalid \\escape at column 23"),
]


def lines(text: str) -> list[str]:
    # A warning of the indexing core, in log format, is not the command's output.
    return [ln for ln in text.splitlines() if not ln.startswith("streamd 2")]


def run(capsys, *argv) -> tuple[int, list[str], list[str]]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, lines(out), lines(err)


@pytest.fixture
def here(tmp_path: Path, monkeypatch) -> Path:
    """The working directory: paths are typed relative to it, as people do."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, *rows: bytes) -> str:
    path.write_bytes(b"".join(rows))
    return path.name


def test_check_names_every_failed_line_with_its_reason_and_exits_1(here: Path, capsys):
    name = write(here / "mine.jsonl", GOOD, b"\n", *(row for row, _ in BAD), GOOD)
    code, out, err = run(capsys, "check", name)
    assert code == 1
    assert out == [f"{name}:{n}: {why}" for n, (_, why) in enumerate(BAD, start=3)]
    assert err == [f"{name}: 2 records, {len(BAD)} lines not records, 1 blank line"]


def test_check_of_a_clean_stream_exits_0(here: Path, capsys):
    name = write(here / "ok.jsonl", GOOD, GOOD)
    assert run(capsys, "check", name) == (0, [], [f"{name}: 2 records, every line a record"])


def test_check_says_what_the_index_would_never_read_or_not_yet(here: Path, capsys):
    long = b'{"schema": 2, "id": "big", "event_time": "2026-05-02T10:00:00Z", "text": "' + \
        b"x" * MAX_LINE_BYTES + b'"}\n'
    name = write(here / "edge.jsonl", GOOD, long, GOOD[:-1])  # the last without its newline
    code, out, _ = run(capsys, "check", name)
    assert code == 1
    assert out == [
        f"{name}:2: line is {len(long) - 1:,} bytes, over the {MAX_LINE_BYTES:,}-byte (1 MiB) "
        "limit of a record",
        f"{name}:3: the last line has no newline: the index reads a line once it ends with "
        "one, so this one is not read yet",
    ]


def test_check_json_is_a_line_per_failure_then_a_summary(here: Path, capsys):
    name = write(here / "mine.jsonl", GOOD, BAD[0][0])
    code, out, err = run(capsys, "check", name, "--json")
    assert (code, err) == (1, [])
    assert [json.loads(line) for line in out] == [
        {"type": "failure", "path": name, "line": 2, "reason": "not JSON"},
        {"type": "summary", "records": 1, "failed": 1,
         "files": [{"path": name, "lines": 2, "records": 1, "blank": 0, "failed": 1}]},
    ]


def test_index_names_the_first_failures_as_typed_and_does_not_exit_0(here: Path, capsys):
    name = write(here / "mine.jsonl", GOOD, *(row for row, _ in BAD))
    code, out, err = run(capsys, "index", name, "--workdir", "wd")
    assert code == 1
    assert out[0].startswith(f"gen-1: 1 record indexed, {len(BAD)} failed")
    reasons = [ln for ln in err if ln.startswith(f"{name}:")]
    assert reasons == [f"{name}:{n}: {why}" for n, (_, why) in enumerate(BAD[:3], start=2)]
    assert err[-1] == (f"streamd: {len(BAD) - 3} more lines are not records;"
                       f" 'streamd check {name}' "
                       "names every one")


def test_index_of_a_stream_with_no_record_at_all_exits_1(here: Path, capsys):
    name = write(here / "none.jsonl", BAD[0][0])
    code, out, err = run(capsys, "index", name, "--workdir", "wd")
    assert code == 1 and out[0].startswith("gen-1: 0 records indexed, 1 failed")
    assert f"{name}:1: not JSON" in err


def test_search_names_the_failures_after_its_summary(here: Path, capsys):
    good = write(here / "a.jsonl", GOOD)
    bad = write(here / "b.jsonl", BAD[0][0], GOOD.replace(b"r1", b"r2"))
    code, out, err = run(capsys, "search", "alpha", good, bad)
    assert code == 0 and len(out) == 2
    assert err[0].endswith("; 1 line could not be read as records")
    assert err[1:] == [f"{bad}:1: not JSON"]


def test_first_failures_reads_no_further_than_its_bound(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(GOOD * 1000 + BAD[0][0])
    found, whole = check.first_failures([(str(path), "s.jsonl")], 3, max_bytes=len(GOOD) * 10)
    assert (found, whole) == ([], False)
    found, whole = check.first_failures([(str(path), "s.jsonl")], 3)
    assert ([str(f) for f in found], whole) == (["s.jsonl:1001: not JSON"], True)


def test_every_reason_the_plain_path_gives_agrees_with_the_compiled_core(tmp_path: Path):
    # The compiled core's yes is taken without asking why; it must never say
    # yes to a line the plain path refuses (or no to one it reads).
    from streamd.recall.index import native

    if native.accepts(b"{}") is None:
        pytest.skip("the compiled core is not installed")
    for row, _ in BAD:
        assert native.accepts(row.strip()) is False
        assert check.reason(row, len(row)) is not None
    assert native.accepts(GOOD.strip()) is True and check.reason(GOOD, len(GOOD)) is None
