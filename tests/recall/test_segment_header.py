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


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_native)],
                         ids=["plain", "compiled"])
@pytest.mark.parametrize("field", _fields())
def test_one_flipped_bit_in_any_header_field_is_caught_at_restart_and_indexed_anew(
        recall_world, caplog, field: str, compiled: bool) -> None:
    w = recall_world
    array, _, key = field.rpartition(".")
    with path_taken(compiled):
        stream(w)
        expected = answers(w, w.adapter())
        (segment,) = (w.work / "index").glob("seg-*")
        assert (array, key) in header_fields(segment)
        flip_header_bit(segment, array, key)
        with caplog.at_level(logging.WARNING, logger="streamd.recall"):
            restarted = w.adapter()
            assert answers(w, restarted) == expected
    assert restarted.generation is not None and restarted.generation.indexed == 400
    assert not segment.exists()
    warned = _warnings(caplog)
    assert any(f"{segment}: its header does not match its checksum" in m
               and "indexing anew" in m for m in warned), warned



@pytest.mark.parametrize("byte", [0, 7, 8, 15, 16, 19],
                         ids=["magic", "magic-end", "length", "length-top", "checksum",
                              "checksum-top"])
def test_one_flipped_bit_of_the_header_start_is_caught_at_restart(
        recall_world, caplog, byte: int) -> None:
    # The magic, the JSON's length, the header's own checksum: a flipped
    # magic or length was refused without a word in the log.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    data = bytearray(segment.read_bytes())
    data[byte] ^= 1
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert not segment.exists()
    assert any(f"the saved index is damaged ({segment}" in m for m in _warnings(caplog)), \
        _warnings(caplog)

def test_record_numbers_read_in_the_wrong_byte_order_are_not_adopted(
        recall_world, caplog) -> None:
    # A header without a checksum of its own (an older streamd's): its
    # '<u4' flipped to '>u4' read every posting byte-swapped from bytes that
    # match their checksum. It was adopted, and every search answered its
    # records with relevance 0, restart after restart.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_header_checksum(segment)
    assert flip_header_bit(segment, "recs", "dtype") == '">u4"'
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert not segment.exists()
    warned = _warnings(caplog)
    assert any(f"{segment}: its recs are not of type <u4" in m for m in warned), warned


def test_an_element_type_numpy_reads_as_fields_is_damage_not_an_error(
        recall_world, caplog) -> None:
    # '<i8' with its '<' flipped to ',' is ',i8': numpy parses it as a list
    # of fields and raised SyntaxError out of the adoption, a traceback
    # from `streamd search` at every run until the workdir was removed.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_header_checksum(segment)
    data = bytearray(segment.read_bytes())
    at = data.index(b'"starts", "dtype": "<i8"') + len(b'"starts", "dtype": "')
    data[at] ^= ord("<") ^ ord(",")  # one bit
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert not segment.exists()
    assert any(f"{segment}: its starts are not of type <i8" in m for m in _warnings(caplog))


def test_an_unchecked_header_that_does_not_decode_is_named_in_the_log(
        recall_world, caplog) -> None:
    # A key's name damaged in an older streamd's header: the file was
    # refused (a KeyError) and indexed anew without a word in the log.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_header_checksum(segment)
    segment.write_bytes(segment.read_bytes().replace(b'"count"', b'"coune"', 1))
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert not segment.exists()
    assert any(f"{segment}: its header does not decode" in m for m in _warnings(caplog))


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_native)],
                         ids=["plain", "compiled"])
def test_a_segment_written_before_headers_had_checksums_is_adopted(
        recall_world, caplog, compiled: bool) -> None:
    # An upgrade must not rebuild every workdir: the header is checked as
    # it was when it was written, and the arrays against their checksums.
    w = recall_world
    with path_taken(compiled):
        stream(w)
        expected = answers(w, w.adapter())
        (segment,) = (w.work / "index").glob("seg-*")
        without_header_checksum(segment)
        with caplog.at_level(logging.WARNING, logger="streamd.recall"):
            restarted = w.adapter()
            assert answers(w, restarted) == expected
    assert segment.exists()  # adopted: a rebuild would have written another
    assert not _warnings(caplog)


def test_such_a_segment_still_has_its_arrays_checked_against_their_checksums(
        recall_world, caplog) -> None:
    # Only its header goes unchecked: a posting's bit flipped is still caught.
    w = recall_world
    stream(w)
    expected = answers(w, w.adapter())
    (segment,) = (w.work / "index").glob("seg-*")
    without_header_checksum(segment)
    flip_low_bit(segment, "recs")
    with caplog.at_level(logging.WARNING, logger="streamd.recall"):
        restarted = w.adapter()
        assert answers(w, restarted) == expected
    assert not segment.exists()
    assert any(f"{segment}: its recs do not match their checksums" in m
               for m in _warnings(caplog))



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
