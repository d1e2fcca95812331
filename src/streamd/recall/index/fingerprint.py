"""A stream file's consumed bytes, summed up cheaply: the first and last 64 KiB.

An append-only stream never changes what was read: the bytes before a
cursor are the bytes the index holds. A truncate-and-rewrite, an editor
saving the file again, a copy over it, show at the ends of what was read
(the first line's id, the last lines), so a hash of those two ends is what
a build records and what every catch-up (and an adopting start) compares
against. Reading it all back would cost the whole stream every time.
"""

from __future__ import annotations

import hashlib

from streamd.recall.index import streamfile

HEAD_BYTES = 64 << 10


def fingerprint(path: str, consumed: int, identity: streamfile.Identity | None = None) -> str:
    """The hash of the first and the last ``HEAD_BYTES`` of the first
    ``consumed`` bytes of ``path``; "" if they cannot be read (gone,
    shorter, not a regular file, unreadable). With ``identity`` (a build's
    own file), raises :class:`~streamd.recall.index.streamfile.Replaced` if
    the path names another file now: the hash must be of what was read."""
    head = min(consumed, HEAD_BYTES)
    tail_start = max(head, consumed - HEAD_BYTES)
    if not consumed:
        identity = None  # nothing was read from it: no file to hold it to
    try:
        with streamfile.open_regular(path, identity) as f:
            data = f.read(head)
            f.seek(tail_start)
            data += f.read(consumed - tail_start)
    except OSError:
        return ""
    if len(data) != head + consumed - tail_start:
        return ""
    return hashlib.sha256(data).hexdigest()
