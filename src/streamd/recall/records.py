"""One JSONL line -> one stream record, decoded the way the reference decodes it.

The reference reads records with Go's encoding/json, and its quirks are the
contract (RECALL-ADAPTER-NOTES, "Edge behaviour"): keys match
case-insensitively, the last duplicate wins, ``null`` leaves a field unset,
invalid UTF-8 becomes U+FFFD and the line is kept, a number where a string
belongs (or a non-integer schema) fails the line, raw control characters
inside strings fail it.

The fast path is one msgspec decode into a dict. Anything it cannot decide
exactly (invalid UTF-8, a lone surrogate escape, two keys that fold to the
same field) takes the slow path through the standard library's decoder with
pairs preserved in order.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from streamd.golang import gotime
from streamd.recall.tokenize import GO_SPACE, fold, tokenize

MIN_SCHEMA = 1
MAX_SCHEMA = 2
MAX_LINE_BYTES = 1 << 20

# Field weights: a token keeps the strongest field it appears in.
TITLE_WEIGHT = 1.0
FIELD_WEIGHT = 0.5
TEXT_WEIGHT = 0.4

_STRING_FIELDS = (
    "id", "kind", "system", "ref", "correlation", "title", "body", "text", "actor", "revision",
)
_TIME_FIELDS = ("event_time", "observed_at")
_KNOWN = frozenset((*_STRING_FIELDS, *_TIME_FIELDS, "schema"))
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _per_byte_replace(err: UnicodeError) -> tuple[str, int]:
    # Go substitutes one U+FFFD per invalid byte; Python's "replace" would
    # merge a truncated sequence into one. Registered for decoding only.
    if not isinstance(err, UnicodeDecodeError):
        raise err
    return "\ufffd" * (err.end - err.start), err.end


codecs.register_error("streamd-go-replace", _per_byte_replace)

_SURROGATE = re.compile("[\ud800-\udfff]")
_GO_SPACE_BYTES = tuple(ch.encode() for ch in GO_SPACE)


class LineError(ValueError):
    """The line is not a record; it counts as failed and never fails a scan."""


@dataclass(slots=True)
class Record:
    schema: int
    id: str
    kind: str
    event_time: int
    observed_at: int | None
    system: str
    ref: str
    correlation: str
    title: str
    text: str
    actor: str
    revision: str

    @property
    def local(self) -> str:
        return f"v{self.schema}/{self.id}"


def trim_space(line: bytes) -> bytes:
    """Go's ``bytes.TrimSpace``: Unicode white space, not just ASCII."""
    line = line.strip(b" \t\n\v\f\r")
    if not line or (line[0] < 0x80 and line[-1] < 0x80):
        # Every non-ASCII space starts with a byte >= 0x80.
        return line
    while True:
        for sp in _GO_SPACE_BYTES:
            if line.startswith(sp):
                line = line[len(sp):]
                break
            if line.endswith(sp):
                line = line[: -len(sp)]
                break
        else:
            return line


def _reject_constant(name: str) -> Any:
    raise LineError(f"{name} is not JSON")


# Go's scanner refuses to nest arrays and objects deeper than this.
MAX_DEPTH = 10_000
_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+"')
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_DECODER = json.JSONDecoder(object_pairs_hook=list, parse_constant=_reject_constant)
_NESTED = object()  # a value too deeply nested to build; only known to be valid


def _ws_end(text: str, i: int = 0) -> int:
    """Past the white space at ``i``."""
    m = _WS.match(text, i)
    assert m is not None  # the pattern matches the empty string
    return m.end()


def _member_key(text: str, i: int) -> int:
    """Past ``"key" :`` at ``i`` (and the white space after it)."""
    m = _STRING.match(text, i)
    if m is None:
        raise LineError("not JSON: an object key was expected")
    i = _ws_end(text, m.end())
    if not text.startswith(":", i):
        raise LineError("not JSON: a colon was expected")
    return _ws_end(text, i + 1)


def _skip_nested(text: str, i: int, outer: int) -> int:
    """The end of the array or object at ``i``, checked the way Go's scanner
    checks it (at most MAX_DEPTH levels, counting ``outer`` enclosing ones),
    without recursion: it only runs when the standard decoder ran out of stack."""
    closers: list[str] = []
    while True:
        if text.startswith(("[", "{"), i):
            closers.append("]" if text[i] == "[" else "}")
            if outer + len(closers) > MAX_DEPTH:
                raise LineError("not JSON: nested too deep")
            i = _ws_end(text, i + 1)
            if not text.startswith(closers[-1], i):
                if closers[-1] == "}":
                    i = _member_key(text, i)
                continue  # at the container's first value
            i += 1
            closers.pop()
        else:
            m = _STRING.match(text, i) or _SCALAR.match(text, i)
            if m is None:
                raise LineError("not JSON: a value was expected")
            i = m.end()
        while True:  # after a value: close containers until a comma
            if not closers:
                return i
            i = _ws_end(text, i)
            if text.startswith(",", i):
                i = _ws_end(text, i + 1)
                if closers[-1] == "}":
                    i = _member_key(text, i)
                break
            if not text.startswith(closers[-1], i):
                raise LineError("not JSON: a comma or a closing bracket was expected")
            i += 1
            closers.pop()


def _value(text: str, i: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, i)
    except RecursionError:
        # Deeper than Python's stack allows, not necessarily deeper than Go's limit.
        return _NESTED, _skip_nested(text, i, 1)
    except ValueError as exc:
        raise LineError(f"not JSON: {_why(exc, text)}") from None


def _why(exc: ValueError, text: str) -> str:
    """The decoder's reason in people's words: the column in the line (the
    decoder's own "line 1 ... (char N)" counts from nowhere a reader sees),
    and a raw control character named with the escape JSON writes it as."""
    if not isinstance(exc, json.JSONDecodeError):
        return str(exc)
    where = f"column {exc.colno}"
    if exc.msg.startswith("Invalid control character") and exc.pos < len(text):
        code = ord(text[exc.pos])
        return (f"a raw control character U+{code:04X} in a string at {where}"
                f" (JSON writes it as \\u{code:04x})")
    return f"{exc.msg.removesuffix(' at').lower()} at {where}"


def _pairs_slow(line: bytes) -> list[tuple[str, Any, bool]]:
    """The top-level members as Go's decoder sees them, in order: (key,
    value, whether the raw value holds an escape). Exact for every line,
    just slower than msgspec."""
    text = line.decode("utf-8", "streamd-go-replace")
    i = _ws_end(text)
    if text.startswith("null", i) and _ws_end(text, i + 4) == len(text):
        return []  # Go leaves the record as it was: empty
    if not text.startswith("{", i):
        raise LineError(_not_an_object(text, decoded=False))
    out: list[tuple[str, Any, bool]] = []
    i = _ws_end(text, i + 1)
    if text.startswith("}", i):
        i += 1
    else:
        while True:
            m = _STRING.match(text, i)
            if m is None:
                raise LineError("not JSON: an object key was expected")
            key = json.loads(m.group())
            i = _member_key(text, i)
            value, end = _value(text, i)
            out.append((key, _clean(value), text[i] == '"' and "\\" in text[i:end]))
            i = _ws_end(text, end)
            if text.startswith(",", i):
                i = _ws_end(text, i + 1)
            elif text.startswith("}", i):
                i += 1
                break
            else:
                raise LineError("not JSON: a comma or a closing brace was expected")
    if _ws_end(text, i) != len(text):
        raise LineError("not JSON: data after the object")
    return out


_KINDS = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
          (list, "an array"))


def _not_an_object(line: Any, *, decoded: bool) -> str:
    """What a line that is not a record's object is instead: ``line`` is its
    value, or (not ``decoded``) its text. For people: a failed line's reason
    is only ever shown, never compared."""
    if not decoded:
        try:
            line = json.loads(line)
        except (ValueError, RecursionError):
            return "not JSON"
    kind = next((said for t, said in _KINDS if isinstance(line, t)), "a JSON value")
    return f"{kind}, not a JSON object"


def _clean(value: Any) -> Any:
    if isinstance(value, str) and _SURROGATE.search(value):
        return _SURROGATE.sub("\ufffd", value)
    return value


# An escape that could spell a known key's letter (a-z, A-Z, _, and the two
# runes that fold into ASCII letters, U+017F and U+212A): two spellings of
# one key then decode alike and msgspec keeps only the last.
_KEYISH_ESCAPE = re.compile(rb"\\u(?:00[4-7][0-9a-fA-F]|017[fF]|212[aA])")


def _may_escape_a_key(line: bytes) -> bool:
    return b"\\" in line and _KEYISH_ESCAPE.search(line) is not None


def _pairs(line: bytes) -> tuple[list[tuple[str, Any, bool]] | dict[str, Any], bool]:
    """The object's members, and whether every key is already canonical."""
    if _may_escape_a_key(line):
        return _pairs_slow(line), False
    try:
        value = msgspec.json.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return _pairs_slow(line), False
    if value is None:
        return [], True
    if not isinstance(value, dict):
        raise LineError(_not_an_object(value, decoded=True))
    canonical = value.keys() <= _KNOWN
    known = list(value) if canonical else [k for k in value if fold(k) in _KNOWN]
    if (not canonical and len({fold(k) for k in known}) != len(known)) or any(
        line.count(b'"' + k.encode() + b'"') > 1 for k in known
    ):
        # A field spelled twice: only the ordered pairs say what Go ends with.
        # (A value that merely contains the key's text also lands here; the
        # slow path is exact, just slower.)
        return _pairs_slow(line), False
    return value, canonical


_JSON_SPACE = b" \t\r\n"


def _raw_time_ok(line: bytes, key: str, value: str) -> bool:
    """Go parses a time from the raw bytes between the quotes, without
    unescaping: an escaped time is not a time to it. So the member must be
    spelled ``"key": "value"`` byte for byte."""
    needle = b'"' + key.encode() + b'"'
    want = b'"' + value.encode() + b'"'
    i = line.find(needle)
    while i >= 0:
        j = i + len(needle)
        while j < len(line) and line[j] in _JSON_SPACE:
            j += 1
        if line[j : j + 1] == b":":
            j += 1
            while j < len(line) and line[j] in _JSON_SPACE:
                j += 1
            if line.startswith(want, j):
                return True
        i = line.find(needle, i + 1)
    return False


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    """Every known field, canonically spelled, and no other key: a line that
    decodes into it needs no folding. null is the same as absent (for
    observed_at, a null pointer), so every field is optional."""

    schema: int | None = None
    id: str | None = None
    kind: str | None = None
    event_time: str | None = None
    observed_at: str | None = None
    system: str | None = None
    ref: str | None = None
    correlation: str | None = None
    title: str | None = None
    body: str | None = None
    text: str | None = None
    actor: str | None = None
    revision: str | None = None


_STRICT = msgspec.json.Decoder(_Strict)
_QUOTED_KEYS = tuple((k, b'"' + k.encode() + b'"') for k in sorted(_KNOWN))


def _strict_fields(line: bytes) -> dict[str, Any] | None:
    """Fields of the commonest line in one typed decode, or None when the
    line needs the general path (other keys, a repeated key, bad types...)."""
    if _may_escape_a_key(line):
        return None
    try:
        f = _STRICT.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    fields: dict[str, Any] = {}
    for key, quoted in _QUOTED_KEYS:
        if line.count(quoted) > 1:
            return None  # possibly a repeated key: only the ordered pairs can tell
        value = getattr(f, key)
        if value is not None:
            fields[key] = value
    return _checked(line, fields)


def _checked(line: bytes, fields: dict[str, Any]) -> dict[str, Any]:
    schema = fields.get("schema")
    if schema is not None and not _INT64[0] <= schema <= _INT64[1]:
        raise LineError("schema is not an int64")
    for name in _TIME_FIELDS:
        raw = fields.get(name)
        if raw is not None:
            parsed = gotime.parse(raw)
            # Without a backslash in the line nothing was escaped, so the
            # decoded time is the raw one.
            if parsed is None or (b"\\" in line and not _raw_time_ok(line, name, raw)):
                raise LineError(f"{name} is not an RFC 3339 time")
            fields[name] = parsed
    return fields


def _gather(line: bytes) -> dict[str, Any]:
    """Known fields after Go's decoding rules: pairs in order, null is a
    no-op except for the observed_at pointer (which it clears), and the first
    type error fails the line even if a later duplicate is fine."""
    pairs, canonical = _pairs(line)
    fields: dict[str, Any] = {}
    error: str | None = None
    members = ((k, v, None) for k, v in pairs.items()) if isinstance(pairs, dict) else pairs
    for key, value, escaped in members:
        name = key if canonical else fold(key)
        if name not in _KNOWN:
            continue
        if value is None:
            if name == "observed_at":
                fields.pop(name, None)
            continue
        if name == "schema":
            ok = type(value) is int and _INT64[0] <= value <= _INT64[1]
        elif name in _TIME_FIELDS:
            parsed = gotime.parse(value) if isinstance(value, str) else None
            if escaped is None:  # from msgspec: find the raw value in the line
                escaped = not _raw_time_ok(line, key, value) if parsed is not None else False
            ok = parsed is not None and not escaped
            value = parsed
        else:
            ok = isinstance(value, str)
        if ok:
            fields[name] = value
        elif error is None:
            error = f"{name} has the wrong type or form"
    if error is not None:
        raise LineError(error)
    return fields


def parse_line(line: bytes) -> Record:
    """Parse one trimmed, non-empty line. Raises LineError for a failed record."""
    fields = _strict_fields(line)
    if fields is None:
        fields = _gather(line)
    schema = fields.get("schema", 0)
    if not MIN_SCHEMA <= schema <= MAX_SCHEMA:
        # The reasons are for people (``streamd check``); the wire only counts.
        if "schema" not in fields:
            raise LineError('record needs a "schema" (1 or 2)')
        raise LineError(f"schema {schema} is not read (only schemas 1 and 2 are)")
    event_time = fields.get("event_time", gotime.ZERO_TIME)
    record_id = fields.get("id", "")
    if not record_id or event_time == gotime.ZERO_TIME:
        raise LineError(_lacking(record_id, fields))
    if not gotime.printable(event_time):
        # Deliberate difference: the reference indexes it and then fails
        # every search that would return it.
        raise LineError("event_time cannot be written as RFC 3339")
    observed = fields.get("observed_at")
    if observed == gotime.ZERO_TIME:
        observed = None  # Go's zero time is no time: the build's is stamped, as for none
    if observed is not None and not gotime.printable(observed):
        raise LineError("observed_at cannot be written as RFC 3339")
    v2 = schema == 2
    return Record(
        schema=schema,
        id=record_id,
        kind=fields.get("kind") or "event",
        event_time=event_time,
        observed_at=observed,
        system=fields.get("system", ""),
        ref=fields.get("ref", ""),
        correlation=fields.get("correlation", ""),
        title=fields.get("title", ""),
        text=fields.get("text", "") if v2 else fields.get("body", ""),
        actor=fields.get("actor", "") if v2 else "",
        revision=fields.get("revision", ""),
    )


def _lacking(record_id: str, fields: dict[str, Any]) -> str:
    """Which of a record's two required fields a line lacks, said of it."""
    lacks = []
    if not record_id:
        lacks.append("an id" if "id" not in fields else 'an id (its "id" is empty)')
    if fields.get("event_time", gotime.ZERO_TIME) == gotime.ZERO_TIME:
        # Go's zero time is how the reference tells an unset time: given, it is unset.
        lacks.append("an event_time" if "event_time" not in fields
                     else "an event_time (0001-01-01T00:00:00Z counts as none)")
    return f"record needs {' and '.join(lacks)}"


def field_tokens(rec: Record) -> tuple[list[str], list[str], list[str]]:
    """A record's tokens by weight class: text (0.4), the short fields kind,
    system, actor and ref (0.5), title (1.0)."""
    text = tokenize(rec.text) if rec.text else []
    title = tokenize(rec.title) if rec.title else []
    # One pass over the four short fields: the space keeps their tokens apart.
    fields = tokenize(f"{rec.kind} {rec.system} {rec.actor} {rec.ref}")
    return text, fields, title


__all__ = ["MAX_LINE_BYTES", "LineError", "Record", "field_tokens", "parse_line", "trim_space"]
