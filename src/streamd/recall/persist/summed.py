"""A JSON object that carries the CRC-32 of its own bytes: the index's manifest.

The manifest says which segments make the index and up to which byte of
each stream file they read. One flipped bit of it could be adopted: a
renamed ``"offset"`` key reads as offset 0 (a cursor's absent fields are
zero), so the restart skipped the check of what was consumed and read the
file again from its start, indexing every record twice; a flipped digit
of an offset was taken for a stream rewritten while no process ran
(health ``stream_rewritten``). Of the 1,935 one-bit flips of a test's
one-file manifest that left its JSON parseable, 42 were adopted with wrong
answers (the renamed offset), 261 adopted with answers unchanged (a
file's counts or the latest time changed), and 1,632 refused without a
word in the log.

Rules:

* The object's first member is ``"crc32"``, eight lowercase hex digits at
  a fixed place (``_PREFIX``): the CRC-32 (``checksum``) of every byte of
  the file but those eight. It is checked before the JSON is parsed, so a
  flip that breaks the JSON is damage too, not a file that is not ours.
* A file that does not start so was written before manifests had a
  checksum, and is read as it was then (its format number says which).
"""

from __future__ import annotations

import json
from typing import Any

from streamd.recall.index import checksum
from streamd.recall.index.segheader import Damaged

__all__ = ["dumps", "loads"]

_PREFIX = b'{"crc32": "'
_DIGITS = 8


def dumps(body: dict[str, Any]) -> bytes:
    """``body`` as JSON, its checksum first."""
    text = json.dumps({"crc32": "0" * _DIGITS, **body}).encode()
    rest = text[len(_PREFIX) + _DIGITS:]
    return _PREFIX + b"%08x" % _crc(rest) + rest


def loads(data: bytes, name: str) -> tuple[Any, bool]:
    """The JSON value in ``data``, and whether it carried a checksum (then
    without it). Raises :class:`~streamd.recall.index.segheader.Damaged`
    (naming ``name``) for one that does not match, ValueError for other
    bytes that are not JSON."""
    if not data.startswith(_PREFIX):
        return json.loads(data), False
    given, rest = data[len(_PREFIX):len(_PREFIX) + _DIGITS], data[len(_PREFIX) + _DIGITS:]
    if given != b"%08x" % _crc(rest):
        raise Damaged(f"{name} does not match its checksum")
    body = json.loads(data)
    del body["crc32"]
    return body, True


def _crc(rest: bytes) -> int:
    return checksum.crc32(rest, checksum.crc32(_PREFIX))
