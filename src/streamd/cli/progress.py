"""The progress line of ``streamd index``: how far, how fast, how long to go.

It reads the build's :class:`~streamd.recall.index.build.Consumer` (the
adapter's ``building``) as the build fills it in: ``bytes_start`` were
indexed before this pass (a workdir caught up, an index adopted),
``bytes_done`` since, out of ``bytes_total``. How often ``bytes_done`` moves
is the build's business (line by line in process; per absorbed chunk on a
parallel pass, whose first chunks are small); this line only never claims
more than it was told.

The rate and the ETA count this run's bytes only, so a catch-up of a big,
mostly indexed stream does not look fast. Until a byte has been consumed the
rate is unknown, and the ETA says ``--`` rather than a number it cannot
know. The line is drawn on a terminal only; the summary line is always
written.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

WIDTH = 30
# Seconds between two redraws.
INTERVAL = 0.2


class Progress:
    def __init__(self, total_bytes: int, out: TextIO, *, interval: float | None = None) -> None:
        # The files' size as the command saw them; the build's own count
        # (bytes_total) wins once it has one.
        self.total = max(total_bytes, 0)
        self.out = out
        self.tty = out.isatty()
        self.started = time.monotonic()
        self.interval = INTERVAL if interval is None else interval
        self._last = 0.0
        self._drawn = 0

    def update(self, consumer: Any) -> None:
        now = time.monotonic()
        if not self.tty or now - self._last < self.interval:
            return
        self._last = now
        done, start, total, records = _counts(consumer, self.total)
        line = self.line(done, records, now, start=start, total=total)
        self.out.write("\r" + line.ljust(self._drawn))
        self._drawn = len(line)
        self.out.flush()

    def line(self, done: int, records: int, now: float, *, start: int = 0,
             total: int | None = None) -> str:
        total = self.total if total is None else total
        elapsed = max(now - self.started, 1e-9)
        have = start + done
        frac = min(have / total, 1.0) if total > 0 else 0.0
        bar = "#" * int(frac * WIDTH)
        rate = done / elapsed
        # Unknown until this run has consumed a byte: "--", never a made-up 0.
        eta = f"{max(total - have, 0) / rate:4.0f}s" if done > 0 else "  --"
        return (f"[{bar:<{WIDTH}}] {frac:6.1%}  {have / 1e6:,.1f} of {total / 1e6:,.1f} MB  "
                f"{records:,} records  {records / elapsed:,.0f} rec/s  "
                f"{rate / 1e6:.1f} MB/s  ETA {eta}")

    def fraction(self, consumer: Any) -> float:
        """How much of the stream is indexed, 0 to 1, as the line would draw it."""
        done, start, total, _ = _counts(consumer, self.total)
        return min((start + done) / total, 1.0) if total > 0 else 0.0

    def clear(self) -> None:
        """Erase the line, so what is written next (an error) starts a clean line."""
        if self.tty and self._drawn:
            self.out.write("\r" + " " * self._drawn + "\r")
            self.out.flush()
        self._drawn = 0

    def done(self, consumer: Any) -> None:
        elapsed = time.monotonic() - self.started
        self.clear()
        if consumer is not None:
            done, start, _, records = _counts(consumer, self.total)
            already = f" ({start / 1e6:.1f} MB were indexed before)" if start else ""
            self.out.write(
                f"indexed {done / 1e6:.1f} MB in {elapsed:.1f} s "
                f"({done / 1e6 / max(elapsed, 1e-9):.1f} MB/s, "
                f"{records / max(elapsed, 1e-9):,.0f} records/s){already}\n"
            )
        self.out.flush()


def _counts(consumer: Any, fallback_total: int) -> tuple[int, int, int, int]:
    """(done, start, total, records) of a build, zeros before it has begun."""
    if consumer is None:
        return 0, 0, fallback_total, 0
    total = getattr(consumer, "bytes_total", 0) or fallback_total
    return (consumer.bytes_done, getattr(consumer, "bytes_start", 0), total,
            consumer.records_done)
