"""The adapter-owned settings block: validation and where the files are.

Keys match case-insensitively and unknown keys are refused, in Go's
encoding/json words, because a misspelled setting that silently did nothing
would be configuration with no code path behind it. A relative file may not
climb out of the configured location: nothing above this layer would refuse
``../../.ssh/id_rsa``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.golang.quote import quote
from streamd.recall.tokenize import fold

DEFAULT_MAX_CANDIDATES = 50

SETTINGS_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "debug_stall_ms": {
            "description": "Artificial pre-scan delay, for recording the cancellation "
            "conformance case. Leave unset in real configuration.",
            "minimum": 0,
            "type": "integer",
        },
        "files": {
            "description": "Stream files, absolute or relative to the location. "
            "Empty means the location is the file.",
            "items": {"type": "string"},
            "type": "array",
        },
        "max_candidates": {
            "description": "Cap on candidates returned by one search.",
            "minimum": 1,
            "type": "integer",
        },
        "upstream": {
            "additionalProperties": {"type": "string"},
            "description": "Maps a record's `system` to the source_id owning those records. "
            "Each mapped record emits derived_from '<source_id>:<ref>'; "
            "an unmapped system emits no edge.",
            "type": "object",
        },
    },
    "type": "object",
}


@dataclass(slots=True)
class Settings:
    files: list[str] = field(default_factory=list)
    upstream: dict[str, str] = field(default_factory=dict)
    max_candidates: int = 0
    debug_stall_ms: int = 0

    @property
    def limit(self) -> int:
        return self.max_candidates if self.max_candidates > 0 else DEFAULT_MAX_CANDIDATES


_GO_TYPES = {"files": "[]string", "upstream": "map[string]string",
             "max_candidates": "int", "debug_stall_ms": "int"}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {json.dumps(value)}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _settings_error(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, f"stream settings: {message}")


def _type_error(value: Any, name: str, go_type: str) -> RpcError:
    return _settings_error(
        f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
        f"Settings.{name} of type {go_type}"
    )


# Go's int: a number outside it is an unmarshal error, as for a fraction.
_GO_INT = range(-(1 << 63), 1 << 63)


def _go_int(value: Any, name: str) -> int:
    # Settings arrive as generic JSON, so 2.0 is the number 2 while 2.5 is not an int.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(value, name, "int")
    if isinstance(value, float) and (not value.is_integer() or abs(value) >= 1e21):
        raise _type_error(value, name, "int")
    if int(value) not in _GO_INT:
        raise _type_error(value, name, "int")
    return int(value)


def parse_settings(raw: dict[str, Any] | None) -> Settings:
    """Validate the adapter-owned settings block. Keys match case-insensitively,
    unknown keys are refused, null leaves a setting at its default."""
    s = Settings()
    for key, value in (raw or {}).items():
        name = fold(key)
        if name not in _GO_TYPES:
            raise _settings_error(f"json: unknown field {quote(key)}")
        if value is None:
            continue
        if name == "files":
            if not isinstance(value, list):
                raise _type_error(value, name, "[]string")
            for item in value:
                if item is not None and not isinstance(item, str):
                    raise _type_error(item, name, "string")
            s.files = [item or "" for item in value]
        elif name == "upstream":
            if not isinstance(value, dict):
                raise _type_error(value, name, "map[string]string")
            for item in value.values():
                if item is not None and not isinstance(item, str):
                    raise _type_error(item, name, "string")
            s.upstream = {k: v or "" for k, v in value.items()}
        elif name == "max_candidates":
            s.max_candidates = _go_int(value, name)
        else:
            s.debug_stall_ms = _go_int(value, name)
    for system in sorted(s.upstream):
        source_id = s.upstream[system]
        if not system or not source_id or ":" in source_id:
            # A source_id holding the locator separator would name another source.
            raise _settings_error(f"upstream {quote(system)} maps to an unusable source_id")
    if s.max_candidates < 0 or s.debug_stall_ms < 0:
        raise _settings_error("max_candidates and debug_stall_ms cannot be negative")
    return s


def resolve_files(location: str, names: list[str]) -> list[str]:
    """Configured names -> absolute paths. A relative name may not climb out
    of the location: settings are the adapter's own, and nothing above this
    layer would refuse ``../../.ssh/id_rsa``."""
    location = location.strip()
    if not location:
        raise RpcError(
            INVALID_PARAMS, "stream: this source has no location, so there is no stream to read"
        )
    base = os.path.normpath(location)
    if not names:
        return [base]
    if os.path.exists(base) and not os.path.isdir(base):
        base = os.path.dirname(base)
    out = []
    for name in names:
        if os.path.isabs(name):
            out.append(os.path.normpath(name))
            continue
        full = os.path.normpath(os.path.join(base, name))
        rel = os.path.relpath(full, base)
        if rel == ".." or rel.startswith(".." + os.sep):
            raise RpcError(
                INVALID_PARAMS,
                f"stream settings: file {quote(name)} resolves outside the configured location",
            )
        out.append(full)
    return out


