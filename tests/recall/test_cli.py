"""The command line for people: search, expand and index over stream files."""

from __future__ import annotations

import io
import json
import os

import pytest

from streamd.cli import main
from streamd.cli.progress import Progress
from streamd.recall.index import build
from streamd.recall.index import streamfile as catchup


@pytest.fixture
def stream(recall_world):
    w = recall_world
    return w.write(
        "a.jsonl",
        w.rec("r1", "2026-05-02T10:00:00Z", title="Deploy alpha", text="alpha went out",
              system="tasks", ref="TD-1"),
        w.rec("r2", "2026-05-02T10:05:00Z", title="Rollback", text="alpha rolled back"),
        w.rec("r3", "2026-05-02T10:09:00Z", title="Unrelated", text="nothing here"),
    )


def test_search_prints_ranked_hits_one_per_line(stream, capsys):
    assert main(["search", "alpha", str(stream), "--limit", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[:2] == ["1", "stream:v2/r1"]  # title hit outranks a text hit
    assert "2026-05-02T10:05:00Z" in lines[1] and "Rollback" in lines[1]


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_search_json_is_the_wire_result_a_line_per_hit(stream, capsys):
    assert main(["search", "td-1", str(stream), "--json"]) == 0
    *hits, summary = json_lines(capsys.readouterr().out)
    assert summary["type"] == "summary" and summary["diagnostics"]["query_mode"] == "exact"
    assert [(c["type"], c["source_record_id"]) for c in hits] == [("hit", "r1")]


def test_search_with_a_workdir_reads_only_new_bytes_the_second_time(
    stream, recall_world, capsys, monkeypatch
):
    work = recall_world.root / "cli-work"
    work.mkdir()
    assert main(["search", "alpha", str(stream), "--workdir", str(work)]) == 0
    reads = []
    real = catchup.lines_after
    monkeypatch.setattr(catchup, "lines_after",
                        lambda p, o, e=None: reads.append(o) or real(p, o, e))
    # The compiled path reads blocks, not lines.
    real_native = build.read_blocks
    monkeypatch.setattr(build, "read_blocks", lambda c, cur, *a: reads.append(cur.offset)
                        or real_native(c, cur, *a))
    capsys.readouterr()
    assert main(["search", "alpha", str(stream), "--workdir", str(work), "--json"]) == 0
    assert reads == [os.path.getsize(stream)]
    assert json_lines(capsys.readouterr().out)[-1]["diagnostics"]["matched"] == 2


def test_expand_prints_the_evidence(stream, capsys):
    assert main(["expand", "v2/r1", str(stream), "--detail", "full"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Deploy alpha\nevent at 2026-05-02T10:00:00Z\nupstream: tasks TD-1\n")
    assert "alpha went out" in out


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["search", "x", "{missing}"], 2, "missing.jsonl: no such file"),
        (["expand", "bogus", "{stream}"], 2, "'bogus' is not a locator"),
        (["expand", "v2/nope", "{stream}"], 1, "holds no record nope"),
    ],
)
def test_bad_input_is_a_clear_error_and_a_failing_status(stream, capsys, argv, code, message):
    argv = [a.format(stream=stream, missing=stream.parent / "missing.jsonl") for a in argv]
    assert main(argv) == code
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("streamd: ") and message in err[0]


def test_a_bad_time_flag_is_refused_before_reading_anything(stream, capsys, monkeypatch):
    from streamd.recall import oneshot

    monkeypatch.setattr(oneshot, "open_adapter", lambda *a, **k: pytest.fail("read"))
    assert main(["search", "x", str(stream), "--since", "sometime"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamd: --since 'sometime' is not a time: give RFC 3339")


def test_index_builds_a_workdir_a_daemon_can_resume(stream, recall_world, capsys):
    work = recall_world.root / "prebuilt"
    assert main(["index", str(stream), "--workdir", str(work)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("gen-1: 3 records indexed, 0 failed")
    assert "indexed 0.0 MB" in out.err
    assert (work / "index" / "manifest.json").exists() and (work / "cursor.json").exists()



def test_index_counts_one_record_in_the_singular(tmp_path, capsys):
    # "gen-1: 1 records indexed" read as a slip of the program.
    one = tmp_path / "one.jsonl"
    one.write_text('{"schema": 1, "id": "n1", "event_time": "2026-05-02T09:00:00Z"}\n')
    assert main(["index", str(one), "--workdir", str(tmp_path / "wd")]) == 0
    assert capsys.readouterr().out.startswith("gen-1: 1 record indexed, 0 failed, ")

def test_the_progress_line_reports_rates_and_an_eta():
    p = Progress(total_bytes=100_000_000, out=io.StringIO())
    p.started = 0.0
    line = p.line(done=25_000_000, records=50_000, now=10.0)
    assert "25.0%" in line
    assert "5,000 rec/s" in line
    assert "2.5 MB/s" in line
    assert "ETA   30s" in line
