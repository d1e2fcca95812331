"""One flipped bit of the workdir's manifest (which segments, up to which
byte of each file) is caught at restart by the manifest's own checksum:
it is not adopted, the log names it, and the files are indexed anew. Before,
a renamed ``"offset"`` was read as offset 0 and the restart indexed every
record a second time; a flipped offset was taken for a stream rewritten
while no process ran; most other flips were refused without a word in the
log. A manifest written before it had a checksum is still adopted."""

from __future__ import annotations

import logging

import pytest
from support.manifests import KEYS, checksum_place_renamed, flip_manifest_bit, without_checksum

from .test_damaged import answers, stream

FLIPS = [(key, part) for key in KEYS for part in ("name", "value")
         if (key, part) != ("files.missing", "value")]  # no one-bit flip of false parses


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(("key", "part"), FLIPS, ids=[f"{k}-{p}" for k, p in FLIPS])
def test_one_flipped_bit_of_the_manifest_is_caught_at_restart_and_indexed_anew(
        recall_world, caplog, key: str, part: str) -> None:
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    manifest = w.work / "index" / "manifest.json"
    flip_manifest_bit(manifest, key, part)
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
        health = w.health(restarted)
    assert restarted.generation is not None and restarted.generation.indexed == 400
    assert health["status"] == "healthy", health  # not stream_rewritten
    warned = _warnings(caplog)
    assert any(f"the saved index is damaged ({manifest} does not match its checksum)" in m
               for m in warned), warned


def test_an_offset_renamed_in_the_manifest_is_not_read_from_the_start_again(
        recall_world) -> None:
    # The fault in full: "offset" read "offseu", a cursor's absent offset is
    # 0, so the check of what was consumed was skipped and the restart read
    # the file from its start onto the adopted index: 800 records for 400,
    # each search answering every record twice.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    flip_manifest_bit(w.work / "index" / "manifest.json", "files.offset", "name")
    restarted = w.adapter()
    assert answers(w, restarted) == expected
    assert restarted.generation is not None and restarted.generation.indexed == 400


def test_a_manifest_whose_checksum_has_lost_its_place_is_damaged(recall_world, caplog) -> None:
    # Its checksum's key damaged, the rest of it would be read unchecked.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    manifest = w.work / "index" / "manifest.json"
    checksum_place_renamed(manifest)
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert any(f"{manifest} has lost its checksum" in m for m in _warnings(caplog))


def test_a_manifest_written_before_manifests_had_a_checksum_is_adopted(
        recall_world, caplog) -> None:
    # An upgrade must not rebuild every workdir.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_checksum(w.work / "index" / "manifest.json")
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert segment.exists()  # adopted: a rebuild would have written another
    assert not _warnings(caplog)
