"""Watching a Recall build fail."""

from __future__ import annotations

import json
import time


def record(i: int) -> bytes:
    words = " ".join(("amber", "birch", "cedar", "delta", "ember")[(i * k) % 5] for k in range(7))
    return json.dumps({"schema": 2, "id": f"r{i:07d}", "event_time": "2026-05-02T10:00:00Z",
                       "title": f"event {i % 97}", "text": words, "ref": f"t-{i}"}).encode() + b"\n"


def poll(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (result := condition()):
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)
    return result

