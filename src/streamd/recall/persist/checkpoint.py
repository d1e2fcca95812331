"""``cursor.json``: the Recall checkpoint of the last published generation.

It is what makes generation ids continue across restarts and what a fresh
process compares against to notice a stream rewritten while it was down. It
is written atomically and only after the generation it describes is
published (and after the durable index, see ``durable``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from streamd.golang import gotime
from streamd.recall.index import streamfile
from streamd.recall.index.streamfile import Cursor
from streamd.recall.persist import cursors
from streamd.recall.persist.atomic import write_atomic

CHECKPOINT_FILE = "cursor.json"

@dataclass(slots=True)
class Checkpoint:
    generation: int = 0
    updated_at: int | None = None
    watermark: str = ""
    files: list[Cursor] = field(default_factory=list)


# Generations count builds from 1: far below this (2^53, a JSON number any
# reader holds exactly) in any workdir's life.
MAX_GENERATION = 1 << 53


def load_checkpoint(workdir: str) -> Checkpoint:
    """A missing or unreadable checkpoint means nothing was published here yet."""
    try:
        # Never a plain open: a FIFO in its place would block it for good,
        # and with it the initialize (and the whole daemon's event loop).
        with streamfile.open_regular(os.path.join(workdir, CHECKPOINT_FILE)) as f:
            raw = json.load(f)
        # Each field of the JSON type the reference's Go struct has, or the
        # checkpoint is none, as there (a generation of "7" or 7.5 was
        # continued as gen-8, where the reference starts again at gen-1).
        files = [cursors.decode(c) for c in cursors.typed(raw, "files", list, [])]
        updated = cursors.typed(raw, "updated_at", str, None)
        updated_at = None if updated is None else gotime.parse(updated)
        if updated is not None and updated_at is None:
            raise ValueError("updated_at is not an RFC 3339 time")
        generation = cursors.typed(raw, "generation", int, 0)
        if not 0 <= generation <= MAX_GENERATION:
            raise ValueError("not a generation this adapter numbered")
        return Checkpoint(
            generation=generation,
            updated_at=updated_at,
            watermark=cursors.typed(raw, "source_watermark", str, ""),
            files=files,
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return Checkpoint()


def save_checkpoint(workdir: str, cp: Checkpoint) -> None:
    """Written only after the generation it describes is published: a
    checkpoint ahead of its data would let a later pass skip records nothing
    indexed."""
    body = {
        "generation": cp.generation,
        "updated_at": gotime.format_nano(cp.updated_at or 0),
        "source_watermark": cp.watermark,
        "files": [cursors.encode(c) for c in cp.files],
    }
    write_atomic(os.path.join(workdir, CHECKPOINT_FILE),
                 [json.dumps(body, separators=(",", ":")).encode()])
