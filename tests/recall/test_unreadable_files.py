"""Catch-up when stream files are missing or cannot be read: a missing file is
named and makes coverage partial, a file that cannot be read (its permissions
taken away, a directory in its place) fails the catch-up or the answer that
reads it back, and what was indexed stays as it was, not rewritten.

Split from ``test_catchup.py`` (appends, rewrites, checkpoints, paths).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamd.errors import SOURCE_UNAVAILABLE, RpcError


def titles(result) -> list[str]:
    return [c["title"] for c in result["candidates"]]


def at(minute: int) -> str:
    return f"2026-05-02T10:{minute:02d}:00Z"



def test_a_missing_file_is_named_and_makes_coverage_partial(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a1", at(0), title="from a"))
    w.write("c.jsonl", w.rec("c1", at(2), title="from c"))
    adapter = w.adapter(["a.jsonl", "sub/b.jsonl", "c.jsonl"])
    result = w.search(adapter, "")
    assert titles(result) == ["from c", "from a"]
    assert result["outcome"] == "partial"
    assert result["diagnostics"]["missing_files"] == ["b.jsonl"]  # base name only
    assert result["diagnostics"]["coverage"] == "partial"
    health = w.health(adapter)
    assert (health["status"], health["coverage"]) == ("degraded", "partial")
    assert health["diagnostics"]["missing_files"] == ["b.jsonl"]
    assert "stream_rewritten" not in health["diagnostics"]

    (w.data / "sub").mkdir()
    w.write("sub/b.jsonl", w.rec("b1", at(1), title="from b"))
    result = w.search(adapter, "")
    assert titles(result) == ["from c", "from b", "from a"]
    assert result["outcome"] == "success"
    assert "missing_files" not in result["diagnostics"]


def test_an_append_to_a_file_listed_after_a_missing_one_is_seen(recall_world):
    # A deliberate difference: the reference stops change detection at the
    # first missing file.
    w = recall_world
    w.write("a.jsonl", w.rec("a1", at(0), title="one"))
    adapter = w.adapter(["gone.jsonl", "a.jsonl"])
    assert titles(w.search(adapter, "")) == ["one"]
    w.append("a.jsonl", w.rec("a2", at(1), title="two"))
    assert titles(w.search(adapter, "")) == ["two", "one"]


def test_when_every_file_is_missing_the_source_is_unavailable_not_empty(recall_world):
    w = recall_world
    adapter = w.adapter(["a.jsonl", "b.jsonl"])
    with pytest.raises(RpcError) as err:
        w.current(adapter)
    assert err.value.code == SOURCE_UNAVAILABLE
    assert err.value.message == "no configured stream file is readable (a.jsonl, b.jsonl)"
    # The failure consumed no generation number.
    w.write("b.jsonl", w.rec("b1", at(0), title="one"))
    assert w.current(adapter).name == "gen-1"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a mode-000 file")
def test_an_unreadable_file_fails_the_catch_up(recall_world):
    w = recall_world
    p = w.write("a.jsonl", w.rec("a1", at(0), title="one"))
    p.chmod(0)
    try:
        with pytest.raises(RpcError) as err:
            w.current(w.adapter())
    finally:
        p.chmod(0o644)
    assert (err.value.code, err.value.message) == (SOURCE_UNAVAILABLE, "a.jsonl is not readable")


@contextlib.contextmanager
def unreadable(path: Path) -> Iterator[None]:
    """``path`` made mode 000 for the block, and refused for real: root reads
    such a file, so under root the block runs as uid 65534 (effective only;
    the saved uid takes root back after)."""
    path.chmod(0)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            os.seteuid(65534)
        yield
    finally:
        if as_root:
            os.seteuid(0)
        path.chmod(0o644)


@pytest.fixture
def open_world(make_recall_world):
    """A world in a directory another uid can reach (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="streamd-"))
    try:
        root.chmod(0o755)
        yield make_recall_world(root)
    finally:
        shutil.rmtree(root)


def test_a_file_whose_permissions_are_taken_away_is_unreadable_not_rewritten(open_world):
    w = open_world
    p = w.write("a.jsonl", w.rec("a1", at(0), title="alpha one"), w.rec("a2", at(1), title="two"))
    adapter = w.adapter()
    assert titles(w.search(adapter, "alpha")) == ["alpha one"]
    with unreadable(p), pytest.raises(RpcError) as err:
        w.search(adapter, "alpha")
    # Not "changed under the index; refresh and retry": nothing changed.
    assert (err.value.code, err.value.message) == (SOURCE_UNAVAILABLE, "a.jsonl is not readable")
    # Readable again, it answers from the same generation: no rebuild from
    # nothing, and no stream_rewritten.
    after = w.search(adapter, "alpha")
    assert (titles(after), after["diagnostics"]["generation"]) == (["alpha one"], "gen-1")
    assert w.health(adapter)["status"] == "healthy"
    assert "stream_rewritten" not in w.health(adapter)["diagnostics"]


def test_a_directory_where_a_stream_file_belongs_is_unreadable(recall_world):
    w = recall_world
    (w.data / "a.jsonl").mkdir()
    with pytest.raises(RpcError) as err:
        w.current(w.adapter())
    assert (err.value.code, err.value.message) == (SOURCE_UNAVAILABLE, "a.jsonl became unreadable")


def test_a_failed_build_publishes_nothing_and_a_retry_indexes_appends_once(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a1", at(0), title="one"))
    w.write("b.jsonl", w.rec("b1", at(1), title="bee"))
    adapter = w.adapter(["a.jsonl", "b.jsonl"])
    assert w.current(adapter).name == "gen-1"

    # a grows, then b becomes unreadable: the build reads a's append, then fails.
    w.append("a.jsonl", w.rec("a2", at(2), title="two"))
    w.path("b.jsonl").rename(w.data / "b.saved")
    (w.data / "b.jsonl").mkdir()
    with pytest.raises(RpcError):
        w.current(adapter)
    assert adapter.generation.name == "gen-1"
    assert adapter.generation.indexed == 2

    (w.data / "b.jsonl").rmdir()
    (w.data / "b.saved").rename(w.data / "b.jsonl")
    result = w.search(adapter, "")
    assert result["diagnostics"]["generation"] == "gen-2"
    assert titles(result) == ["two", "bee", "one"]  # "two" exactly once
    assert result["diagnostics"]["indexed"] == 3
