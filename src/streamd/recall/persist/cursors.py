"""A cursor as JSON, the one spelling ``cursor.json`` and the manifest share."""

from __future__ import annotations

from typing import Any

from streamd.recall.index.streamfile import Cursor


def encode(c: Cursor, **extra: Any) -> dict[str, Any]:
    return {"path": c.path, "offset": c.offset, "records": c.records, "failed": c.failed,
            "missing": c.missing, **extra}


def decode(body: dict[str, Any]) -> Cursor:
    """Raises KeyError, TypeError, ValueError or OverflowError (a count of
    ``1e400``, read as infinity) for a body that is not a cursor;
    absent counts are zero (older checkpoints left them out)."""
    return Cursor(
        str(body["path"]), int(body.get("offset", 0)), int(body.get("records", 0)),
        int(body.get("failed", 0)), bool(body.get("missing", False)),
    )
