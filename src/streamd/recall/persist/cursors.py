"""A cursor as JSON, the one spelling ``cursor.json`` and the manifest share."""

from __future__ import annotations

from typing import Any

from streamd.recall.index.streamfile import Cursor


def encode(c: Cursor, **extra: Any) -> dict[str, Any]:
    return {"path": c.path, "offset": c.offset, "records": c.records, "failed": c.failed,
            "missing": c.missing, **extra}


# A Go int (64 bits): what the reference's fields hold.
_GO_INT_MIN, _GO_INT_MAX = -(2**63), 2**63 - 1


def typed(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """``body[key]`` as Go's decoder takes it into a field of ``kind``: absent
    or null, the default; any other JSON type fails the whole body
    (TypeError). ``int()`` and ``str()`` let ``7.5``, ``"7"``, ``1e3`` or
    ``true`` through, where the reference takes such a checkpoint for none
    and starts again at gen-1."""
    value = body.get(key)
    if value is None:
        return default
    if type(value) is not kind:  # exactly: a bool is no int here
        raise TypeError(f"{key} is not a JSON {kind.__name__}")
    if isinstance(value, int) and not _GO_INT_MIN <= value <= _GO_INT_MAX:
        # Go fails such a number as it fails another type (the field is no
        # home for it): the whole checkpoint is none there too.
        raise TypeError(f"{key} does not fit a Go int")
    return value


def decode(body: dict[str, Any]) -> Cursor:
    """Raises KeyError (no path) or TypeError (a field of another JSON type)
    for a body that is not a cursor; absent counts are zero (older
    checkpoints left them out)."""
    if "path" not in body:
        raise KeyError("path")
    return Cursor(
        typed(body, "path", str, ""), typed(body, "offset", int, 0),
        typed(body, "records", int, 0), typed(body, "failed", int, 0),
        typed(body, "missing", bool, False),
    )
