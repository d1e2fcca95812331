"""What became of a stream file since a generation read it.

Sans-I/O: the adapter says what it saw of one file (its cursor in the
published generation, its size now, the fingerprint of the consumed bytes
then and now) and this says what that means for the next build:

* ``NONE``: as it was read; no build.
* ``GREW`` / ``APPEARED`` / ``VANISHED`` (never read): an incremental pass
  reads what is new (or notes the file missing), as in the reference.
* ``REWRITTEN``: the bytes the index holds are no longer the file's: it is
  shorter than its cursor, gone after being read, or the first or last 64 KiB
  of what was consumed differ (``fingerprint``). The next build starts over
  from nothing and the generation it publishes says ``stream_rewritten``.

The reference decides by size alone, so it misses a rewrite that keeps (or
grows) the length; so would a process that compared fingerprints only when
it adopts an index from disk, which is why every catch-up compares them.
A rewrite strictly inside a file (ends unchanged) shows only when a line read
back for an answer is no longer the record indexed there
(:meth:`StreamAdapter.reread`), and then counts the same way.
"""

from __future__ import annotations

import enum

from streamd.recall.index.streamfile import Cursor


class Change(enum.Enum):
    NONE = "none"
    GREW = "grew"
    APPEARED = "appeared"
    VANISHED = "vanished"
    REWRITTEN = "rewritten"


def needs_fingerprint(cur: Cursor | None, size: int | None) -> bool:
    """Whether :func:`change` needs the consumed bytes' fingerprint now: the
    file had bytes read and is still at least that long."""
    return cur is not None and cur.offset > 0 and size is not None and size >= cur.offset


def change(cur: Cursor | None, size: int | None, then: str = "", now: str = "") -> Change:
    """What became of a file whose cursor is ``cur`` (None: the generation
    never saw it) and whose size is now ``size`` (None: absent). ``then`` and
    ``now`` are the fingerprints of its consumed bytes when the generation was
    built and now; either one "" means unknown (never taken, unreadable now):
    then the length decides, as it would without them."""
    if size is None:
        if cur is None:
            return Change.VANISHED
        if cur.missing:
            return Change.NONE
        return Change.REWRITTEN if cur.offset > 0 else Change.VANISHED
    if cur is None or cur.missing:
        return Change.APPEARED
    if size < cur.offset:
        return Change.REWRITTEN
    if cur.offset > 0 and then and now and then != now:
        return Change.REWRITTEN
    return Change.GREW if size > cur.offset else Change.NONE
