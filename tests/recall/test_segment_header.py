"""One flipped bit of a segment file's header (its record count, an array's
element type, length, offset or checksum) is caught at restart by the
header's own checksum: the segment is not adopted, the log names it, and
the files are indexed anew. Before, the header was trusted as read: most
such flips were refused by a check that raised out of the adoption and
rebuilt without a word in the log, the record numbers' byte order flipped
was adopted (every relevance 0), and an element type numpy reads as a
list of fields raised ``SyntaxError`` out of every start. A file written
before headers had checksums is still adopted, on the checks it had."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.native import path_taken
from support.segments import (
    flip_header_bit,
    flip_low_bit,
    header_fields,
    without_header_checksum,
)

from streamd.recall.index import native

from .test_damaged import answers, stream

needs_native = pytest.mark.skipif(native._native is None, reason="streamd._native is not built")


def _fields() -> list[str]:
    # The header of the segment ``stream`` writes (each array has a len,
    # offset and crc32): "count", "recs.dtype", ...
    keys = ["dtype", "len", "offset", "crc32"]
    arrays = ["term_hash", "term_local", "starts", "recs", "meta", "big_pos", "big_count",
              "ident_hash", "ident_rec", "columns", "ids"]
    return ["base", "count"] + [f"{a}.{k}" for a in arrays for k in keys]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _restarted_after(w, caplog, damage: Callable[[Path], object]) -> tuple[Path, Any, list[str]]:
    """The world's stream indexed into one segment, ``damage`` done to it,
    and a restart, which answers as the index did before: the segment, the
    restarted adapter and the warnings it logged."""
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    damage(segment)
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    return segment, restarted, _warnings(caplog)


def _unchecked(then: Callable[[Path], object]) -> Callable[[Path], None]:
    """A segment's header made an older streamd's (no checksum of its own),
    then ``then`` done to it."""
    def damage(segment: Path) -> None:
        without_header_checksum(segment)
        then(segment)
    return damage


def _flip_byte(byte: int) -> Callable[[Path], None]:
    def damage(segment: Path) -> None:
        data = bytearray(segment.read_bytes())
        data[byte] ^= 1
        segment.write_bytes(bytes(data))
    return damage


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_native)],
                         ids=["plain", "compiled"])
@pytest.mark.parametrize("field", _fields())
def test_one_flipped_bit_in_any_header_field_is_caught_at_restart_and_indexed_anew(
        recall_world, caplog, field: str, compiled: bool) -> None:
    array, _, key = field.rpartition(".")

    def damage(segment: Path) -> None:
        assert (array, key) in header_fields(segment)
        flip_header_bit(segment, array, key)

    with path_taken(compiled):
        segment, restarted, warned = _restarted_after(recall_world, caplog, damage)
    assert restarted.generation is not None and restarted.generation.indexed == 400
    assert not segment.exists()
    assert any(f"{segment}: its header does not match its checksum" in m
               and "indexing anew" in m for m in warned), warned


@pytest.mark.parametrize("byte", [0, 7, 8, 15, 16, 19],
                         ids=["magic", "magic-end", "length", "length-top", "checksum",
                              "checksum-top"])
def test_one_flipped_bit_of_the_header_start_is_caught_at_restart(
        recall_world, caplog, byte: int) -> None:
    # The magic, the JSON's length, the header's own checksum: a flipped
    # magic or length was refused without a word in the log.
    segment, _, warned = _restarted_after(recall_world, caplog, _flip_byte(byte))
    assert not segment.exists()
    assert any(f"the saved index is damaged ({segment}" in m for m in warned), warned


def test_record_numbers_read_in_the_wrong_byte_order_are_not_adopted(
        recall_world, caplog) -> None:
    # A header without a checksum of its own (an older streamd's): its
    # '<u4' flipped to '>u4' read every posting byte-swapped from bytes that
    # match their checksum. It was adopted, and every search answered its
    # records with relevance 0, restart after restart.
    def byte_order(segment: Path) -> None:
        assert flip_header_bit(segment, "recs", "dtype") == '">u4"'

    segment, _, warned = _restarted_after(recall_world, caplog, _unchecked(byte_order))
    assert not segment.exists()
    assert any(f"{segment}: its recs are not of type <u4" in m for m in warned), warned


def test_an_element_type_numpy_reads_as_fields_is_damage_not_an_error(
        recall_world, caplog) -> None:
    # '<i8' with its '<' flipped to ',' is ',i8': numpy parses it as a list
    # of fields and raised SyntaxError out of the adoption, a traceback
    # from `streamd search` at every run until the workdir was removed.
    def fields(segment: Path) -> None:
        data = bytearray(segment.read_bytes())
        at = data.index(b'"starts", "dtype": "<i8"') + len(b'"starts", "dtype": "')
        data[at] ^= ord("<") ^ ord(",")  # one bit
        segment.write_bytes(bytes(data))

    segment, _, warned = _restarted_after(recall_world, caplog, _unchecked(fields))
    assert not segment.exists()
    assert any(f"{segment}: its starts are not of type <i8" in m for m in warned), warned


def test_an_unchecked_header_that_does_not_decode_is_named_in_the_log(
        recall_world, caplog) -> None:
    # A key's name damaged in an older streamd's header: the file was
    # refused (a KeyError) and indexed anew without a word in the log.
    def key(segment: Path) -> None:
        segment.write_bytes(segment.read_bytes().replace(b'"count"', b'"coune"', 1))

    segment, _, warned = _restarted_after(recall_world, caplog, _unchecked(key))
    assert not segment.exists()
    assert any(f"{segment}: its header does not decode" in m for m in warned), warned


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_native)],
                         ids=["plain", "compiled"])
def test_a_segment_written_before_headers_had_checksums_is_adopted(
        recall_world, caplog, compiled: bool) -> None:
    # An upgrade must not rebuild every workdir: the header is checked as
    # it was when it was written, and the arrays against their checksums.
    with path_taken(compiled):
        segment, _, warned = _restarted_after(
            recall_world, caplog, without_header_checksum)
    assert segment.exists()  # adopted: a rebuild would have written another
    assert not warned


def test_such_a_segment_still_has_its_arrays_checked_against_their_checksums(
        recall_world, caplog) -> None:
    # Only its header goes unchecked: a posting's bit flipped is still caught.
    segment, _, warned = _restarted_after(
        recall_world, caplog, _unchecked(lambda segment: flip_low_bit(segment, "recs")))
    assert not segment.exists()
    assert any(f"{segment}: its recs do not match their checksums" in m for m in warned)


@needs_native
@pytest.mark.parametrize(("written", "read"), [(False, True), (True, False)],
                         ids=["plain-then-compiled", "compiled-then-plain"])
def test_an_index_saved_on_either_path_is_adopted_on_the_other(
        recall_world, caplog, written: bool, read: bool) -> None:
    # The headers' and the manifest's checksums are the same CRC-32 on both
    # paths: a restart that takes the other path must not rebuild.
    w = recall_world
    with path_taken(written):
        stream(w)
        expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    with path_taken(read), caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert segment.exists()
    assert not _warnings(caplog)
