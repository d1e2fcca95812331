"""The compiled path of a build: stream bytes to segments in ``streamd._native``.

The plain path (``build.Consumer`` over ``records``, ``tokenize`` and
``segment.SegmentBuilder``) costs 75-85 us of CPython per record. The
compiled core (the Rust crate in ``native/``) does the same per-record work
for a whole block of lines in one call, with the GIL released: decoding and
checking each line the way Go's encoding/json does, tokenizing with the
pinned Unicode tables, and laying out the segment arrays. Python keeps
everything around it: reading the file in blocks (``build.read_blocks``),
cursors and counters, sealing at ``SEGMENT_RECORDS``, kind tables,
persistence. This module is the compiled core's face: whether it can be
used, and the builder that stands in for ``SegmentBuilder``.

Rules:

* The plain path is the oracle. Both paths must build byte-identical
  segments from the same bytes (``tests/native/`` hold them to it), so
  which one built an index never shows: not on disk, not in an answer.
* Reading keeps the plain reader's rules (``streamfile``): regular files
  only, complete lines only (a tail without a newline waits for the next
  pass), and a line longer than ``HOLD_LIMIT`` is consumed without being
  held (it fails anyway).
* Without the compiled module (an install without a Rust toolchain) builds
  take the plain path, and the process says so once, at its first build.
  ``STREAMD_NATIVE=0`` takes the plain path deliberately (tests, benches).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from numpy.typing import DTypeLike

from streamd import DISTRIBUTION, plain
from streamd.recall.index.segment import COLUMNS, Segment

if TYPE_CHECKING:
    from streamd._native import ChunkBuilder, EventPage, _Record
    from streamd.eventlog.store import EventRow, EventRows

# The arrays of a sealed segment, by name (``ChunkBuilder.seal``).
_SealedName = Literal["term_hash", "term_local", "starts", "recs", "meta", "big_pos",
                      "big_count", "ident_hash", "ident_rec", "columns", "ids"]

# The calls this module makes of streamd._native (its INTERFACE).
INTERFACE = 6


class Core(Protocol):
    """What this module calls of ``streamd._native`` (typed in its stub): a
    protocol, so the module or None (not built, or built from other sources)
    can be held in one name."""

    @property
    def ChunkBuilder(self) -> type[ChunkBuilder]: ...

    @property
    def EventPage(self) -> type[EventPage]: ...

    def parse_record(self, line: bytes) -> _Record | None: ...

    def project_event(self, row: EventRow) -> tuple[str, str, str, bytes] | None: ...

    def rank_search(
        self, n: int,
        terms: Sequence[tuple[float, Sequence[Sequence[tuple[np.ndarray, np.ndarray]]]]],
        order: Sequence[int], positions: int, exact: np.ndarray, browse: bool,
        weights: tuple[float, float, float, float], columns: np.ndarray,
        layout: tuple[int, int, int, int], upper: tuple[int, int] | None,
        lower: tuple[int, int] | None, kinds: Sequence[bool] | None,
        removed: np.ndarray | None, ranks: Sequence[np.ndarray], block: int,
        sec_max: np.ndarray, covered: int, time_block: int, limit: int,
        stop: np.ndarray | None,
    ) -> tuple[list[int], list[float], list[bool], int, bool] | None: ...

log = logging.getLogger(__name__)

_missing = ""  # why the compiled module cannot be used, when it cannot
_native_absent = False
_native: Core | None
try:
    import streamd._native as _loaded
except ImportError:  # built without a Rust toolchain: the plain path it is
    _native = None
    _missing = "is not installed"
    _native_absent = True
else:
    _native = _loaded
    if getattr(_native, "INTERFACE", None) != INTERFACE:
        # An editable install whose extension predates its Python sources.
        _native = None
        _missing = "was built from other sources than this streamd"

_warned = threading.Event()


def enabled() -> bool:
    """Whether builds take the compiled path. The first build that cannot
    (no compiled module) logs one warning for the life of the process."""
    if plain.asked():
        return False
    if _native is None:
        if not _warned.is_set():
            _warned.set()
            log.warning(
                "the compiled indexing core (streamd._native) %s, so indexing runs on "
                "the plain Python path, about six times slower; reinstall %s "
                "(pip install -e . in a clone) where a Rust toolchain (cargo) is available "
                "to build it",
                _missing,
                DISTRIBUTION,
            )
        return False
    return True


def quiet() -> None:
    """Never warn in this process (a worker whose parent warns for it)."""
    _warned.set()


def unavailable() -> str | None:
    """For a person at a terminal, the one plain line saying that builds will
    take the plain path because the compiled module cannot be used (then
    this process's log warning is not repeated); None when they will not
    (compiled, or ``STREAMD_NATIVE=0`` asked for the plain path)."""
    if _native is not None or plain.asked():
        return None
    quiet()
    why = (f"is not installed (cargo was not on the PATH when {DISTRIBUTION} was installed)"
           if _native_absent else _missing)
    return (f"the compiled indexing core {why}, so indexing takes the plain Python path, "
            "about six times slower; pip install -e . again in the clone (with cargo on the "
            "PATH) builds it")


def accepts(trimmed: bytes) -> bool | None:
    """Whether the compiled core reads ``trimmed`` (one trimmed, non-empty
    line) as a record; None where builds take the plain path. A fast first
    look for ``streamd check``, which asks the plain path why only when it
    says no."""
    if _native is None or not enabled():
        return None
    return _native.parse_record(trimmed) is not None


def search_core() -> Core | None:
    """The compiled core for scoring searches (``query/compiled.py``), or
    None where searches take the plain path: as for builds, without the
    module or with ``STREAMD_NATIVE=0``. Never warns (the build does)."""
    if _native is None or plain.asked():
        return None
    return _native


def project_event(row: EventRow) -> tuple[str, str, str, bytes] | None:
    """The compiled projection of one event-log row (kind, title, text,
    line), or None where it leaves the row to the plain path: for tests
    against ``recall/eventlog/project.py``. Needs the compiled core."""
    assert _native is not None
    return _native.project_event(row)


class NativeBuilder:
    """One segment in the making, built by the compiled core. It stands in
    for ``SegmentBuilder`` as an Index's open builder; unlike it, the ids it
    holds reach the Index only when it is sealed."""

    def __init__(self, base: int) -> None:
        assert _native is not None
        self.base = base
        self._b = _native.ChunkBuilder(base)

    @property
    def count(self) -> int:
        return self._b.count

    def feed(self, data: bytes, start: int, offset: int, max_records: int, max_lines: int,
             file_no: int, built_at: int) -> tuple[int, int, int, int, int | None]:
        """See ``ChunkBuilder.feed``: (next start, lines, records, failed,
        latest event time or None)."""
        return self._b.feed(data, start, offset, max_records, max_lines, file_no, built_at)

    def feed_events(self, rows: EventRows, start: int, max_records: int,
                    built_at: int) -> tuple[int, int, int, int | None, bool]:
        """See ``ChunkBuilder.feed_events``: (next, records, failed, latest
        event time or None, whether ``rows[next]`` is left to the plain path).
        ``rows`` is a list, or a page the compiled core read (``EventPage``)."""
        assert _native is not None
        held = (rows if isinstance(rows, list | _native.EventPage)
                else [rows[i] for i in range(len(rows))])
        return self._b.feed_events(held, start, max_records, built_at)

    def seal(self, kind_code: Callable[[str], int]) -> Segment:
        """The segment, its kind codes mapped onto the index's table by
        ``kind_code`` (which registers kinds it has not seen, in the order
        the records first used them, as the plain path does)."""
        d = self._b.seal()

        def lent(name: _SealedName, dtype: DTypeLike) -> np.ndarray:
            # Viewed where the seal made it (``SealedArray``), not copied.
            return np.frombuffer(memoryview(d[name]), dtype=dtype)

        columns = lent("columns", COLUMNS)
        kinds = d["kinds"]
        kind_map = np.array([kind_code(k) for k in kinds], dtype=np.int32)
        if len(kind_map) and not np.array_equal(kind_map, np.arange(len(kind_map))):
            columns = columns.copy()
            columns["kind"] = kind_map[columns["kind"]]
        return Segment(
            base=self.base,
            count=d["count"],
            term_hash=lent("term_hash", np.uint64),
            term_local=lent("term_local", np.int32),
            starts=lent("starts", np.int64),
            recs=lent("recs", np.uint32),
            meta=lent("meta", np.uint8),
            big_pos=lent("big_pos", np.int64),
            big_count=lent("big_count", np.int64),
            ident_hash=lent("ident_hash", np.uint64),
            ident_rec=lent("ident_rec", np.int64),
            columns=columns,
            ids=lent("ids", np.uint8),
        )


__all__ = ["INTERFACE", "NativeBuilder", "accepts", "enabled", "project_event", "quiet",
           "search_core", "unavailable"]
