"""A segment file's header: what it says of the segment, and its own checksum.

The header is JSON after a fixed start: the segment's first record and
record count, and each array's element type, length, offset and CRC-32
(``checksum``). The arrays' checksums cannot vouch for the header that
locates them. Each of the 3,150 one-bit flips of a 400-record segment's
header that left its JSON parseable was, before it had a checksum: 901
refused as damaged; 2,209 refused by a check that raised out of the
adoption, which rebuilt without a word in the log; 31 adopted with
answers unchanged (a byte order of ``'='``, an element type of
``timedelta64``); one adopted with wrong answers (the record numbers'
``'<u4'`` read ``'>u4'``: every posting byte-swapped from bytes that match
their checksum, every relevance 0); and 8 a ``SyntaxError`` out of every
start (an element type's ``'<'`` read ``','``, which numpy parses as a
list of fields). With it, all 3,150 are refused and named in the log.

Layout, by format:

* ``STRMSEG2`` (written now): magic, the JSON's length (8 bytes, little
  endian), the header's CRC-32 (4 bytes, little endian), the JSON, zeros
  to the next multiple of 8. The CRC-32 covers every byte of that but its
  own four: magic, length, JSON and padding.
* ``STRMSEG1`` (written before): magic, length, JSON, padding; no checksum
  of its own. Adopted on the checks it always had, so an upgrade rebuilds
  nothing; its arrays' checksums, if it has them, are checked as before.
  Its element types must be those every streamd has written
  (``segment.read``): that is where the flips that answered wrong or
  raised were.

A header that fails any check (its checksum, its magic, its length, its
JSON, a field's type or range, an array's name or element type) is
:class:`Damaged`: the restart names the file in its log and indexes anew.
The ``'1'`` and ``'2'`` of the magics differ in two bits, so one flip
cannot make a checked header pass for an unchecked one.
"""

from __future__ import annotations

import os
from typing import Annotated, BinaryIO

import msgspec

from streamd.recall.index import checksum

__all__ = ["MAGIC", "MAGIC_UNCHECKED", "Array", "Damaged", "Header", "encode", "read"]

MAGIC = b"STRMSEG2"
MAGIC_UNCHECKED = b"STRMSEG1"
_LENGTH = 8
_SUM = 4


class Damaged(ValueError):
    """A segment read back is not one that was written (the file was damaged):
    an index holding it is not adopted, and is built anew."""


_Count = Annotated[int, msgspec.Meta(ge=0, lt=1 << 62)]


class Array(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    dtype: str
    len: _Count
    offset: _Count
    # None in a file written before arrays had checksums.
    crc32: Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)] | None = None


class Header(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    base: _Count
    count: _Count
    arrays: list[Array]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Header)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % 8)


def encode(header: Header) -> bytes:
    """The header's bytes as ``STRMSEG2`` writes them, padded to a multiple of 8."""
    body = _encoder.encode(header)
    start = MAGIC + len(body).to_bytes(_LENGTH, "little")
    rest = body + _padding(len(start) + _SUM + len(body))
    crc = checksum.crc32(rest, checksum.crc32(start))
    return start + crc.to_bytes(_SUM, "little") + rest


def read(path: str, f: BinaryIO) -> tuple[Header, int]:
    """The header of segment file ``f`` (named ``path`` in errors), and where
    its arrays begin. Raises :class:`Damaged` for any header but one as it
    was written (see the module's rules)."""
    start = f.read(len(MAGIC) + _LENGTH)
    magic, summed = start[:len(MAGIC)], start[:len(MAGIC)] == MAGIC
    if not summed and magic != MAGIC_UNCHECKED:
        raise Damaged(f"{path} is not a segment file")
    size = int.from_bytes(start[len(MAGIC):], "little")
    fixed = len(start) + (_SUM if summed else 0)
    if size > os.fstat(f.fileno()).st_size - fixed:
        # Read as asked, a damaged length is a MemoryError (a failure of
        # every build, not a segment found damaged).
        raise Damaged(f"{path}: its header runs past the end of the file")
    given = f.read(_SUM) if summed else b""
    rest = f.read(size + len(_padding(fixed + size)))
    body = rest[:size]
    if summed and int.from_bytes(given, "little") != checksum.crc32(
            rest, checksum.crc32(start)):
        raise Damaged(f"{path}: its header does not match its checksum")
    try:
        header = _decoder.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError too
        raise Damaged(f"{path}: its header does not decode ({exc})") from None
    return header, fixed + size + len(_padding(fixed + size))
