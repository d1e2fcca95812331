"""The progress line of ``streamd index`` moves as bytes are consumed (never a
long 0% then a jump to 100%), counts what was indexed before this run, and
says ``ETA --`` while the rate is unknown instead of a made-up 0 s."""

from __future__ import annotations

import io
import re
import sys

from streamd.cli import main, progress
from streamd.cli.progress import Progress
from streamd.recall.index import parallel


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Build:
    """What the progress line reads of a build (a Consumer's counters)."""

    def __init__(self, done=0, start=0, total=0, records=0):
        self.bytes_done, self.bytes_start, self.bytes_total = done, start, total
        self.records_done = records


def test_eta_is_unknown_until_a_byte_is_consumed():
    p = Progress(total_bytes=100_000_000, out=io.StringIO())
    p.started = 0.0
    line = p.line(done=0, records=0, now=5.0)
    assert line.endswith("ETA   --") and "0.0%" in line


def test_rates_and_eta_count_this_runs_bytes_and_the_bar_counts_all():
    p = Progress(total_bytes=0, out=io.StringIO())
    p.started = 0.0
    # 60 MB were indexed before; 20 MB in 10 s now, of 100 MB.
    line = p.line(done=20_000_000, records=40_000, now=10.0, start=60_000_000,
                  total=100_000_000)
    assert "80.0%" in line and "80.0 of 100.0 MB" in line
    assert "2.0 MB/s" in line and "4,000 rec/s" in line
    assert line.endswith("ETA   10s")


def test_the_build_total_wins_over_the_size_the_command_saw():
    out = Terminal()
    p = Progress(total_bytes=10, out=out, interval=0)
    p.update(Build(done=50, total=200, records=1))
    assert "25.0%" in out.getvalue()


def test_before_the_build_starts_the_line_says_nothing_it_cannot_know():
    out = Terminal()
    p = Progress(total_bytes=1000, out=out, interval=0)
    p.update(None)
    assert out.getvalue().startswith("\r[") and "ETA   --" in out.getvalue()


def test_no_line_is_drawn_off_a_terminal_but_the_summary_is():
    out = io.StringIO()
    p = Progress(total_bytes=1000, out=out, interval=0)
    p.update(Build(done=500, total=1000, records=5))
    assert out.getvalue() == ""
    p.done(Build(done=1000, total=1000, records=10))
    assert out.getvalue().startswith("indexed 0.0 MB in ")


# --- a real index ------------------------------------------------------------------


def percents(drawn: str) -> list[float]:
    return [float(m) for m in re.findall(r"\] +([\d.]+)%", drawn)]


def on_a_terminal(monkeypatch) -> Terminal:
    # In the test, not a fixture: pytest puts its own stderr back between the two.
    out = Terminal()
    monkeypatch.setattr(sys, "stderr", out)
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    return out


def records(w, n: int, first: int = 0) -> list[bytes]:
    return [w.rec(f"r{i}", title=f"record {i}", text="some words " * 8)
            for i in range(first, first + n)]


def test_an_in_process_build_moves_the_line_as_it_reads(recall_world, monkeypatch, capsys):
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 62)
    terminal = on_a_terminal(monkeypatch)
    w = recall_world
    stream = w.write("s.jsonl", *records(w, 10_000))
    assert main(["index", str(stream), "--workdir", str(w.root / "wd")]) == 0
    seen = percents(terminal.getvalue())
    assert seen == sorted(seen)
    assert len({p for p in seen if 0 < p < 100}) >= 3, seen
    assert capsys.readouterr().out.startswith("gen-1: 10000 records indexed")


def test_a_parallel_build_moves_the_line_per_chunk(recall_world, monkeypatch):
    terminal = on_a_terminal(monkeypatch)
    w = recall_world
    stream = w.write("s.jsonl", *records(w, 6000))
    size = stream.stat().st_size
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", size // 4)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", size // 6)
    monkeypatch.setattr(parallel, "FIRST_CHUNK_BYTES", size // 24)
    monkeypatch.setattr(parallel, "workers", lambda: 2)
    cut = []
    real_ranges = parallel.ranges
    monkeypatch.setattr(parallel, "ranges",
                        lambda *a: cut.extend(real_ranges(*a)) or list(cut))
    assert main(["index", str(stream), "--workdir", str(w.root / "wd")]) == 0
    assert len(cut) >= 4  # the parallel path it is, in chunks
    seen = percents(terminal.getvalue())
    assert seen == sorted(seen)
    assert len({p for p in seen if 0 < p < 100}) >= 2, seen


def test_a_catch_up_counts_what_was_indexed_before(recall_world, monkeypatch):
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 1 << 62)
    terminal = on_a_terminal(monkeypatch)
    w = recall_world
    stream = w.write("s.jsonl", *records(w, 4000))
    before = stream.stat().st_size
    work = str(w.root / "wd")
    assert main(["index", str(stream), "--workdir", work]) == 0
    w.append("s.jsonl", *records(w, 4000, first=4000))
    terminal.seek(0)
    terminal.truncate()
    assert main(["index", str(stream), "--workdir", work]) == 0
    text = terminal.getvalue()
    assert min(percents(text)) >= 100 * before / stream.stat().st_size - 0.1
    assert f"({before / 1e6:.1f} MB were indexed before)" in text


def test_an_error_mid_build_starts_on_a_clean_line(recall_world, monkeypatch):
    from streamd.errors import SOURCE_UNAVAILABLE, RpcError
    from streamd.recall.adapter import StreamAdapter

    terminal = on_a_terminal(monkeypatch)
    w = recall_world
    stream = w.write("s.jsonl", *records(w, 10))

    def failing(self, full):
        self.building = Build(done=5, total=10, records=1)
        yield None
        raise RpcError(SOURCE_UNAVAILABLE, "s.jsonl became unreadable")

    monkeypatch.setattr(StreamAdapter, "build", failing)
    assert main(["index", str(stream), "--workdir", str(w.root / "wd")]) == 2
    drawn = terminal.getvalue()
    assert "50.0%" in drawn
    # The line is erased before the error, which is a line of its own.
    assert drawn.endswith(" \rstreamd: s.jsonl became unreadable\n")
