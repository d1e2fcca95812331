#!/usr/bin/env python3
"""What a restart's checks of a saved index cost, in process.

    python bench/adoption_cost.py WORKDIR

WORKDIR holds an index `streamd index FILE... --workdir WORKDIR` built (with
the tree being measured: each tree reads only the files it writes). Prints
the CPU (``process_time``), best and median, of: opening every segment (its
header read and checked) and the whole adoption (the manifest, fingerprints
of the files, every array's checksum, the tables' checks).
Run it from the tree to measure, with ``PYTHONPATH=src``; ``STREAMD_NATIVE=0``
measures the plain path.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from streamd.recall import adapter
from streamd.recall.index import segment as seg
from streamd.recall.persist.manifest import MANIFEST, DurableIndex


def cpu_ms(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """Best and median CPU of ``n`` calls of ``fn``, in ms."""
    spent = []
    for _ in range(n):
        t = time.process_time()
        fn()
        spent.append(time.process_time() - t)
    spent.sort()
    return spent[0] * 1e3, spent[len(spent) // 2] * 1e3


def main(argv: list[str]) -> int:
    (work,) = argv
    durable = DurableIndex(work, adapter.DURABLE_CONFIG)
    with open(os.path.join(work, "index", MANIFEST), "rb") as f:
        saved = json.loads(f.read())
    paths = [c["path"] for c in saved["files"]]
    segments = [os.path.join(work, "index", name) for name in saved["segments"]]

    def open_segments() -> None:
        for path in segments:
            seg.read(path)

    def load() -> None:
        loaded, _ = durable.load(paths)
        assert loaded is not None, "the index is not adopted"

    for label, fn, n in (("open every segment", open_segments, 50),
                         ("the whole adoption", load, 10)):
        best, median = cpu_ms(fn, n)
        print(f"{label}: {best:.3f} ms CPU best, {median:.3f} median ({n} runs)")
    print(f"{len(segments)} segments")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
