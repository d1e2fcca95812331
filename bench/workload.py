"""The append every event-log bench sends, so their rows compare (no imports:
the load bench's writer processes import it and nothing heavier)."""

from __future__ import annotations

from typing import Any

CONTENT = {
    "role": "model",
    "parts": [
        {
            "text": "The planner chose the search tool and asked for three results "
            "about durable logs, group commit and SQLite WAL checkpoints."
        }
    ],
}


def append_params(tag: str, i: int, sessions: int = 8) -> dict[str, Any]:
    """The params of append ``i`` of a run tagged ``tag`` (event ids unique per tag)."""
    return {
        "app": "bench",
        "user": "u",
        "session": f"s{i % sessions}",
        "event": {
            "id": f"{tag}-{i}",
            "author": "agent",
            "branch": "root.plan",
            "invocation_id": f"inv-{i // 10}",
            "content": CONTENT,
        },
        "metadata": {"caller": "bench"},
    }
