"""The commit-order check of the server backends: writers on several
connections append batches as fast as they can while a reader pages with
``since()``, and the reader must never see a seq before every lower one is
visible. With numbers handed out at insert time (a sequence, an
AUTO_INCREMENT), a batch that got lower seqs but committed later would show as
a gap the reader skips forever; a counter row locked by each append makes
commit order seq order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from streamd.errors import RpcError
from streamd.eventlog.model import AppendParams, SinceParams
from streamd.eventlog.store import Backend

__all__ = ["race_writers_and_a_reader"]


def race_writers_and_a_reader(
    stores: Sequence[Backend],
    reader: Backend,
    append: Callable[[str, str], AppendParams],
    now_us: int,
    batches: int = 40,
    per_batch: int = 8,
) -> int:
    """Run the race (``append(event_id, session)`` makes each append); assert
    what the module docstring says; the number of reads the reader made."""
    writers = len(stores)
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            start.wait()
            for b in range(batches):
                got = stores[w].append_batch(
                    [append(f"w{w}-b{b}-{i}", f"s{w}") for i in range(per_batch)], now_us
                )
                assert all(not isinstance(r, RpcError) for r in got), got
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    start.wait()
    total = writers * batches * per_batch
    seen: list[int] = []
    cursor, reads = 0, 0
    deadline = time.monotonic() + 120
    while len(seen) < total and time.monotonic() < deadline and not errors:
        page = reader.since(SinceParams(from_seq=cursor, limit=1000))
        reads += 1
        for e in page.entries:
            # The next entry a reader sees is always the next seq: nothing
            # lower can still appear behind it.
            assert e.seq == cursor + 1, f"saw seq {e.seq} while {cursor + 1} was not visible"
            cursor = e.seq
            seen.append(e.seq)
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen == list(range(1, total + 1))
    return reads
