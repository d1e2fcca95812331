"""The adapter driven synchronously, without Trio: ``streamd search``,
``expand`` and ``index`` for people, and tests.

The Trio service (:mod:`~streamd.recall.service`) does the same steps with
the reads off the event loop; here they simply block.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from streamd.recall.adapter import StreamAdapter
from streamd.recall.generation import Generation
from streamd.recall.index.parallel import drive
from streamd.recall.index.streamfile import read_spans
from streamd.recall.wire import (
    ExpandParams,
    Expansion,
    InitializeParams,
    SearchParams,
    SearchResult,
)


def open_adapter(
    paths: list[str], workdir: str | None, tick: Callable[[], None] | None = None,
    full: bool = False, locked_check: Callable[[], None] | None = None,
) -> tuple[StreamAdapter, Generation]:
    """An adapter over ``paths``, caught up: in memory, or resuming the durable
    index in ``workdir`` (the one ``streamd index`` builds), so repeated runs
    read only what was appended; ``full`` rebuilds it from scratch.
    ``locked_check``: see :class:`StreamAdapter`."""
    adapter = StreamAdapter(persist=workdir is not None, locked_check=locked_check)
    files = [os.path.abspath(p) for p in paths]
    adapter.initialize(
        InitializeParams(
            protocol_version_min=1, protocol_version_max=1,
            workdir=workdir or os.path.join(os.sep, "nonexistent-streamd-workdir"),
            source_id="stream", location=os.path.dirname(files[0]), settings={"files": files},
        )
    )
    return adapter, current(adapter, full=full, tick=tick)


def current(
    adapter: StreamAdapter, full: bool = False, tick: Callable[[], None] | None = None
) -> Generation:
    """Catch up as the refresh scanner does: build only when needed."""
    if adapter.needs_build(full):
        return drive(adapter.build(full), tick)
    assert adapter.generation is not None
    return adapter.generation


def search(
    adapter: StreamAdapter, generation: Generation, params: SearchParams, started: int | None = None
) -> SearchResult:
    started = time.time_ns() if started is None else started
    ranked = adapter.rank(generation, params)
    lines = read_spans(adapter.spans(generation, [hit.rec for hit in ranked.hits]))
    return adapter.search_result(generation, ranked, lines, started)


def expand(adapter: StreamAdapter, generation: Generation, params: ExpandParams) -> Expansion:
    plan = adapter.expand_plan(generation, params)
    lines = read_spans(adapter.spans(generation, [plan.rec, *plan.episode]))
    return adapter.expansion(generation, params, plan, lines)
