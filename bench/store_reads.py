"""The SQLite store's reads in process, no daemon: what the shared storage rules
cost per call, for comparing two trees (run each with its own PYTHONPATH).

* ``since``: 22,000 events of 8 sessions read from seq 0 in pages of 10,000,
  plain Structs and encoded for the wire (best of 7);
* ``get_session``: a session of 2,000 events, whole (best of 15) and its newest
  20 (best of 50).

    PYTHONPATH=src python bench/store_reads.py
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamd.eventlog.model import AppendParams, Event, SessionGetParams, SinceParams
from streamd.eventlog.store import DECODED, ReadShape

try:
    from streamd.eventlog.sqlite import SqliteStore
except ImportError:  # a tree from before the backend folders, for an A/B run
    from streamd.eventlog.store.sqlite import SqliteStore  # type: ignore[no-redef]

NOW_US = 1_700_000_000_000_000


def best(runs: int, call: Callable[[], Any]) -> float:
    fastest = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        call()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def fill(store: SqliteStore, n: int, sessions: int, prefix: str) -> None:
    for first in range(0, n, 1000):
        store.append_batch(
            [
                AppendParams(
                    app="a",
                    user="u",
                    session=f"{prefix}{i % sessions}",
                    event=Event(
                        id=f"{prefix}-e{i}",
                        author="agent",
                        content={"text": "hello world " * 5, "i": i},
                    ),
                )
                for i in range(first, min(n, first + 1000))
            ],
            NOW_US,
        )


def read_all(store: SqliteStore, shape: ReadShape = DECODED) -> None:
    after = 0
    while True:
        page = store.since(SinceParams(from_seq=after, limit=10_000), shape)
        if len(page.entries) < 10_000:
            return
        after += len(page.entries)


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        store = SqliteStore.open(str(Path(work) / "events.db"))
        fill(store, 22_000, 8, "s")
        fill(store, 2_000, 1, "one")
        got = {
            "since_plain_ms": best(7, lambda: read_all(store)) * 1e3,
            "since_encoded_ms": best(7, lambda: read_all(store, ReadShape("encoded", 16 << 20)))
            * 1e3,
            "get_session_2000_ms": best(
                15, lambda: store.get_session(SessionGetParams(app="a", user="u", session="one0"))
            )
            * 1e3,
            "get_session_recent_20_us": best(
                50,
                lambda: store.get_session(
                    SessionGetParams(app="a", user="u", session="one0", recent=20)
                ),
            )
            * 1e6,
        }
        store.close()
    print(json.dumps({k: round(v, 2) for k, v in got.items()}))


if __name__ == "__main__":
    main()
