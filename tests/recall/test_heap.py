"""A big build hands the heap memory it freed back to the system."""

from __future__ import annotations

import platform

import pytest

from streamd import heap
from streamd.recall import oneshot


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_is_released_where_glibc_offers_malloc_trim():
    assert heap.release() is True


def _stream(path, start: int, n: int) -> None:
    with open(path, "a") as f:
        for i in range(start, start + n):
            f.write(f'{{"schema":1,"id":"r{i}","kind":"note","event_time":'
                    f'"2026-01-01T00:00:{i % 60:02d}Z","body":"word{i % 7}"}}\n')


def test_a_pass_that_adds_many_records_trims_and_a_small_one_does_not(tmp_path, monkeypatch):
    trims: list[None] = []
    monkeypatch.setattr(heap, "TRIM_RECORDS", 50)
    monkeypatch.setattr(heap, "release", lambda: trims.append(None) or True)
    stream = tmp_path / "s.jsonl"
    _stream(stream, 0, 80)
    adapter, generation = oneshot.open_adapter([str(stream)], str(tmp_path / "wd"))
    assert generation.indexed == 80
    assert len(trims) == 1  # 80 records from nothing
    _stream(stream, 80, 10)
    generation = oneshot.current(adapter)
    assert generation.indexed == 90
    assert len(trims) == 1  # 10 more: not worth a trim
    generation = oneshot.current(adapter, full=True)
    assert generation.indexed == 90
    assert len(trims) == 2  # a full rebuild allocated all 90 anew


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_building_process_fixes_the_allocator_thresholds_where_glibc_offers_mallopt():
    heap.tune.cache_clear()
    assert heap.tune() is True


def test_the_commands_that_build_tune_the_allocator_and_clients_do_not():
    from streamd.cli import commands

    for argv in ([], ["serve"], ["daemon"], ["index", "s.jsonl"], ["search", "x", "s.jsonl"]):
        assert commands._builds(argv), argv
    for argv in (["log", "tail"], ["status"], ["check", "s.jsonl"]):
        assert not commands._builds(argv), argv
