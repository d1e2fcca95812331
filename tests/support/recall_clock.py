"""Time as the long-build tests count it."""

from __future__ import annotations

import time

from streamd.golang import gotime


def in_seconds(s: float) -> str:
    """An RFC 3339 deadline ``s`` seconds from now, on the wall clock."""
    return gotime.format_nano(time.time_ns() + int(s * gotime.NS))

