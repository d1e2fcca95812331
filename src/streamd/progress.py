"""A progress line for long builds: records/s, MB/s and an ETA, on a terminal only."""

from __future__ import annotations

import time
from typing import Any, TextIO


class Progress:
    def __init__(self, total_bytes: int, out: TextIO, *, interval: float = 0.2) -> None:
        self.total = max(total_bytes, 1)
        self.out = out
        self.tty = out.isatty()
        self.started = time.monotonic()
        self.interval = interval
        self._last = 0.0

    def update(self, consumer: Any) -> None:
        now = time.monotonic()
        if not self.tty or consumer is None or now - self._last < self.interval:
            return
        self._last = now
        self.out.write("\r" + self.line(consumer.bytes_done, consumer.records_done, now))
        self.out.flush()

    def line(self, done: int, records: int, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else 0.0
        return (f"[{bar:<30}] {frac:6.1%}  {records:,} records  {records / elapsed:,.0f} rec/s  "
                f"{rate / 1e6:.1f} MB/s  ETA {eta:4.0f}s ")

    def done(self, consumer: Any) -> None:
        elapsed = time.monotonic() - self.started
        if self.tty:
            self.out.write("\r" + " " * 100 + "\r")
        if consumer is not None:
            self.out.write(
                f"indexed {consumer.bytes_done / 1e6:.1f} MB in {elapsed:.1f} s "
                f"({consumer.bytes_done / 1e6 / max(elapsed, 1e-9):.1f} MB/s, "
                f"{consumer.records_done / max(elapsed, 1e-9):,.0f} records/s)\n"
            )
        self.out.flush()
