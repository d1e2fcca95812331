"""A workdir's manifest damaged on purpose, or made as an older streamd wrote it."""

from __future__ import annotations

import json
import re
from pathlib import Path

# Where the JSON of the manifest's checksum, first in the file, begins and ends.
_SUM = re.compile(rb'^\{"crc32": "[0-9a-f]{8}", ')

# The keys ``flip_manifest_bit`` can flip a bit of: the manifest's own,
# then those of its first file (``files.*``).
KEYS = ["format", "config", "records", "latest", "kinds", "segments", "files.path",
        "files.offset", "files.records", "files.failed", "files.missing", "files.head"]


def without_checksum(path: Path) -> None:
    """Rewrite a manifest as a streamd wrote it before manifests had a
    checksum (format 2)."""
    body = json.loads(path.read_bytes())
    body.pop("crc32", None)
    body["format"] = 2
    path.write_bytes(json.dumps(body).encode())


def flip_manifest_bit(path: Path, key: str, part: str) -> str:
    """Flip the lowest bit of one byte of ``key`` in a manifest so that its
    JSON still parses: of its name's last letter (``part`` "name"), or of its
    value's last character (a number's last digit, a string's last letter,
    the last one's of a list of strings; "value"). Returns what the flipped
    member reads."""
    data = bytearray(path.read_bytes())
    start = data.index(b'"files": [') if key.startswith("files.") else 0
    name = key.removeprefix("files.").encode()
    found = re.compile(rb'"%s": ' % name).search(bytes(data), start)
    assert found is not None, key
    if part == "name":
        i = found.end() - 4
    else:
        end = found.end()
        while data[end] not in b",}":
            end += 1
        i = end - 1
        while data[i] in b'"]':
            i -= 1
    data[i] ^= 1
    json.loads(bytes(data))  # still parses
    path.write_bytes(bytes(data))
    end = data.index(b",", found.start()) if b"," in data[found.start():] else len(data)
    return bytes(data[found.start():end]).decode()


def checksum_place_renamed(path: Path) -> None:
    """The manifest with its checksum's key renamed ("crc32" to "crc33"):
    its JSON parses, its checksum is no longer where it is looked for."""
    data = path.read_bytes()
    assert _SUM.match(data), "this streamd writes no manifest checksum"
    path.write_bytes(data.replace(b'"crc32"', b'"crc33"', 1))
