"""A generation: one published build of the index, and how far a build has come.

A generation is an index view plus the cursors, counts and build time that
produced it. Once published it never changes; searches in flight keep the one
they started on. No I/O here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from streamd.golang import gotime
from streamd.recall.index.index import View
from streamd.recall.index.streamfile import Cursor
from streamd.recall.query import render


@dataclass(slots=True)
class Generation:
    gen: int
    view: View
    files: list[Cursor]
    built_at: int
    latest: int
    consumed: int
    failed: int
    missing: list[str]
    rewritten: bool
    # Set on a prefix published while its build goes on: how far it has come.
    indexing: Progress | None = None
    # Each read file's consumed bytes, summed up (``fingerprint``), as of the
    # build: what every catch-up compares against (``changes``).
    prints: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"gen-{self.gen}"

    @property
    def indexed(self) -> int:
        return self.view.n

    @property
    def complete(self) -> bool:
        return not self.failed and not self.missing and self.indexing is None

    @property
    def coverage(self) -> str:
        return "complete" if self.complete else "partial"

    @property
    def watermark(self) -> str:
        latest = None if self.latest == gotime.ZERO_TIME else self.latest
        return render.watermark(self.consumed, self.indexed, latest)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a build has come: bytes of the stream files indexed, of all
    they held when it started."""

    consumed_bytes: int
    total_bytes: int
