"""The adapter-owned settings block: validation and where the files are.

Keys match case-insensitively and unknown keys are refused, in Go's
encoding/json words, because a misspelled setting that silently did nothing
would be configuration with no code path behind it. A relative file may not
climb out of the configured location: nothing above this layer would refuse
``../../.ssh/id_rsa``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from decimal import Decimal
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


def _json_kind(value: Any, into_int: bool) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        # Go quotes a number's digits only when they failed to be an int.
        return f"number {_go_number(value)}" if into_int else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _settings_error(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, f"stream settings: {message}")


def _type_error(value: Any, path: str, go_type: str, element: bool = False) -> RpcError:
    """Go's words for ``value`` at ``path`` (``files``, ``upstream.jira``;
    ``files.1``, an ``element`` of a list, which Go names without "Go
    struct field") that is no ``go_type``."""
    where = "" if element else "Go struct field "
    return _settings_error(
        f"json: cannot unmarshal {_json_kind(value, go_type == 'int')} into {where}"
        f"Settings.{path} of type {go_type}"
    )


# Go's int: a number outside it is an unmarshal error, as for a fraction.
_GO_INT = range(-(1 << 63), 1 << 63)


def _go_number(value: int | float) -> str:
    """``value`` as the reference's settings decoder sees it: the block
    arrives as generic JSON, so every number became a float64, and is
    encoded again (Go's shortest form: ``2``, ``4611686018427388000``,
    ``1e+21``, ``1e-7``) before it is decoded into the settings struct. So
    2.0 is the int 2, 2**63 - 1 is 9223372036854775808 (past Go's int), and
    the digits an error quotes are these, not the ones sent."""
    try:
        f = float(value)
    except OverflowError:  # past any float64: the reference's decoder refuses it too
        return str(value)
    if f != 0 and (abs(f) < 1e-6 or abs(f) >= 1e21):
        text = repr(f)  # shortest digits, an exponent of two digits or more, as Go's 'e'
        mantissa, _, exponent = text.partition("e")
        sign, digits = exponent[0], exponent[1:].lstrip("0")
        return f"{mantissa}e{sign}{digits.zfill(1 if sign == '-' else 2)}"
    return format(Decimal(repr(f)).normalize(), "f")


def _go_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(value, name, "int")
    text = _go_number(value)
    if not text.lstrip("-").isdigit() or int(text) not in _GO_INT:
        raise _type_error(value, name, "int")
    return int(text)


def parse_settings(raw: dict[str, Any] | None) -> Settings:
    """Validate the adapter-owned settings block. Keys match case-insensitively,
    unknown keys are refused; null empties `files` or `upstream` and leaves a
    number as it was (nothing given is the default)."""
    s = Settings()
    # The reference encodes the block again before decoding it, which sorts
    # its keys: the first error in that order is the one it names (by the key
    # as given), and of a setting given twice (``files`` and ``FILES``) the
    # later one wins.
    for key, value in sorted((raw or {}).items()):
        name = fold(key)
        if name not in _GO_TYPES:
            raise _settings_error(f"json: unknown field {quote(key)}")
        if value is None:
            # Go's null empties a list or a map (one given before under
            # another case), and leaves a number as it was.
            if name == "files":
                s.files = []
            elif name == "upstream":
                s.upstream = {}
            continue
        if name == "files":
            if not isinstance(value, list):
                raise _type_error(value, key, "[]string")
            for i, item in enumerate(value):
                if item is not None and not isinstance(item, str):
                    raise _type_error(item, f"{key}.{i}", "string", element=True)
            s.files = [item or "" for item in value]
        elif name == "upstream":
            if not isinstance(value, dict):
                raise _type_error(value, key, "map[string]string")
            for system, item in sorted(value.items()):
                if item is not None and not isinstance(item, str):
                    raise _type_error(item, f"{key}.{system}", "string")
            s.upstream = {k: v or "" for k, v in value.items()}
        elif name == "max_candidates":
            s.max_candidates = _go_int(value, key)
        else:
            s.debug_stall_ms = _go_int(value, key)
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


