"""The sans-I/O core of the conformance harness: values in, values out, no Trio.

A suite is a directory of cases. A case is ``manifest.json`` (what it proves and
how to replay it), ``request.jsonl`` (lines to send, with ``${FIXTURE}`` and
``${WORKDIR}`` tokens), ``response.jsonl`` (frames a real run produced) and
``fixture/``. The rules this module holds, and why:

- Lockstep: a request waits for its own response before the next request goes
  out; a notification goes out at once. Cancellation is only recordable because
  of the second half: the cancel must reach a request that is still running.
  :func:`lockstep_steps` turns that rule into a plan; the driver only follows it.
- Volatile fields are masked with the same constant on both sides, by pointers
  from the frame root; a pointer that matches nothing is not an error because
  one declaration list serves responses of different shapes.

Two optional manifest keys extend the Recall format for streamd's own suites
(a harness that does not know them refuses the case, as it should):

- ``adapter_args``: strings appended to the adapter command line, with
  ``${WORKDIR}`` and ``${FIXTURE}`` bound as in request lines (raw, not JSON
  escaped). The event log suite passes ``["--db", "${WORKDIR}/events.db"]``:
  each run gets a fresh database in its fresh WORKDIR, and nothing depends on
  the environment the replayer runs in (it sets none).
- ``await_frames``: ``{"<request.jsonl line number>": N}``; that line is sent
  only once N frames have arrived in all. Lockstep alone cannot record a
  stream that a later notification ends: a watch's entry notifications and a
  cancel sent at once race, and which entries precede the -32007 depends on
  scheduling. Waiting for the frames first is what a real client does (it
  cancels after it has seen what it wanted), and makes the transcript exact.
- ``place_files``: ``{"<request.jsonl line number>": ["name", ...]}``; just
  before that line is sent (after the lockstep wait for the request before
  it), each ``staged/<name>`` of the case is copied to ``${WORKDIR}/<name>``.
  A stream file that appears while the adapter runs can only be shown this
  way: the fixture is read-only, and a request cannot create a file.

Loading and checking a case (the manifest, its files) is
:mod:`streamd.conformance.case`'s, on these rules. Nothing here touches the
file system, starts a process, waits, or imports Trio: that is
:mod:`streamd.conformance.driver`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec

from streamd.rpc import framing

#: What a volatile value becomes on both sides of a comparison, and in a
#: recorded transcript, so the recording machine's clock is never committed.
VOLATILE = "<volatile>"

FLOW_LOCKSTEP = "lockstep"
PLACEHOLDERS = ("FIXTURE", "WORKDIR")

#: Longest rendering of a value in a failure line; a whole search result on one
#: line would bury the difference it is meant to show.
RENDER_LIMIT = 200

# JSON's insignificant whitespace. Deliberately not str.strip()/splitlines():
# U+2028 and friends are legal inside a frame and must not cut it.
_JSON_WS = b" \t\r\n"
_PLACEHOLDER = re.compile(r"\$\{(FIXTURE|WORKDIR)\}")
_BAD_TILDE = re.compile(r"~(?![01])")
ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")


class CaseError(Exception):
    """The case itself is defective: no adapter could pass it or record it."""


# --------------------------------------------------------------------------
# JSON pointers and masking
# --------------------------------------------------------------------------

Pointer = tuple[str, ...]


def parse_pointer(text: str) -> Pointer:
    """Split an RFC 6901 pointer into unescaped segments.

    The empty pointer is refused: it would mask a whole frame, which is a case
    that compares nothing and still reports a pass.
    """
    if text == "":
        raise CaseError('volatile pointer "" would mask the whole frame')
    if not text.startswith("/"):
        raise CaseError(f"volatile pointer {quoted(text)} does not start with /")
    segments = []
    for raw in text[1:].split("/"):
        if _BAD_TILDE.search(raw):
            raise CaseError(f"volatile pointer {quoted(text)} has a ~ that is not ~0 or ~1")
        # RFC 6901 order: ~1 first, so "~01" is the key "~1", not "/".
        segments.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(segments)


def format_pointer(segments: Sequence[str]) -> str:
    return "".join("/" + s.replace("~", "~0").replace("/", "~1") for s in segments)


def mask(value: Any, pointers: Sequence[Pointer], constant: Any = VOLATILE) -> Any:
    """Replace every value a pointer reaches with ``constant``.

    Mutates the decoded containers in place and returns the (possibly new)
    root. ``*`` matches every array element and every object member; a
    numeric segment indexes an array. Paths that lead nowhere are ignored.
    """
    for pointer in pointers:
        value = _mask_one(value, pointer, constant)
    return value


def _mask_one(node: Any, segments: Pointer, constant: Any) -> Any:
    if not segments:
        return constant
    head, rest = segments[0], segments[1:]
    if isinstance(node, dict):
        keys = list(node) if head == "*" else ([head] if head in node else [])
        for key in keys:
            node[key] = _mask_one(node[key], rest, constant)
    elif isinstance(node, list):
        if head == "*":
            indexes: Sequence[int] = range(len(node))
        elif ARRAY_INDEX.fullmatch(head) and int(head) < len(node):
            indexes = [int(head)]
        else:
            indexes = []
        for i in indexes:
            node[i] = _mask_one(node[i], rest, constant)
    return node


# --------------------------------------------------------------------------
# Structural comparison
# --------------------------------------------------------------------------


class _Absent:
    """Stands for a key, element or frame that one side does not have."""

    def __repr__(self) -> str:
        return "nothing"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Difference:
    pointer: str  # RFC 6901, "" for the root
    want: Any  # ABSENT when the recording lacks it
    got: Any  # ABSENT when the run lacks it

    def describe(self) -> str:
        where = f" at {self.pointer}" if self.pointer else ""
        return f"{where}: want {render(self.want)}, got {render(self.got)}"


def first_difference(want: Any, got: Any) -> Difference | None:
    """The first place two decoded JSON values differ, or None if they are equal.

    Equality is JSON's, not Python's: key order is irrelevant, numbers compare
    by value (1 == 1.0), but ``true`` is not ``1`` and ``null`` is not absent.
    "First" follows the recorded side's key order, then keys only the run has,
    so the report points where a reader of response.jsonl would look.
    """
    return _diff(want, got, [])


def json_equal(a: Any, b: Any) -> bool:
    return _diff(a, b, []) is None


def _diff(want: Any, got: Any, path: list[str]) -> Difference | None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key, w in want.items():
            if key not in got:
                return Difference(format_pointer([*path, key]), w, ABSENT)
            found = _diff(w, got[key], [*path, key])
            if found:
                return found
        for key, g in got.items():
            if key not in want:
                return Difference(format_pointer([*path, key]), ABSENT, g)
        return None
    if isinstance(want, list) and isinstance(got, list):
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            found = _diff(w, g, [*path, str(i)])
            if found:
                return found
        if len(want) != len(got):
            i = min(len(want), len(got))
            return Difference(
                format_pointer([*path, str(i)]),
                want[i] if i < len(want) else ABSENT,
                got[i] if i < len(got) else ABSENT,
            )
        return None
    if _scalar_equal(want, got):
        return None
    return Difference(format_pointer(path), want, got)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _scalar_equal(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    # Python says True == 1; JSON does not. Same type or not equal.
    return type(a) is type(b) and bool(a == b)


def render(value: Any) -> str:
    """Compact JSON for a failure line, clipped so one value cannot flood it."""
    if value is ABSENT:
        return "nothing"
    text = msgspec.json.encode(value).decode()
    return clip(text)


def clip(text: str) -> str:
    """``text`` cut to ``RENDER_LIMIT`` characters, for a failure line."""
    return text if len(text) <= RENDER_LIMIT else text[: RENDER_LIMIT - 1] + "…"


def quoted(text: str) -> str:
    """``text`` as a JSON string, for an error that names it."""
    return msgspec.json.encode(text).decode()


class BadFrame(ValueError):
    """A frame no JSON-RPC message can be. Its text ends a sentence about the
    frame ("response 2 is not JSON"); :meth:`about` adds the frame itself."""

    def about(self, frame: bytes) -> str:
        """The reason, then the frame, clipped: what a failure line says."""
        return f"{self}: {clip(frame.decode('utf-8', 'replace'))}"


class FrameTooDeep(BadFrame):
    """A frame whose arrays and objects nest deeper than a decoder may follow."""


def decode_frame(data: bytes) -> Any:
    """Decode one frame; raises ValueError (malformed JSON or invalid UTF-8,
    or :class:`FrameTooDeep`).

    The frames judged are the adapter's, and the case's files are anyone's:
    msgspec raises RecursionError (not a ValueError) near Python's recursion
    limit, and the comparison recurses once a level too. So a frame nesting
    deeper than the RPC framing's limit is refused before it is decoded.
    """
    if framing.nests_deeper_than(data):
        raise FrameTooDeep(f"nests arrays and objects more than {framing.MAX_DEPTH} levels deep")
    return msgspec.json.decode(data)


# --------------------------------------------------------------------------
# Placeholders and line classification
# --------------------------------------------------------------------------


def json_string_body(text: str) -> str:
    """``text`` escaped as the inside of a JSON string (no surrounding quotes).

    Substitution is textual and happens before parsing, so a path containing a
    quote or a backslash would otherwise break the line or change its meaning.
    """
    try:
        encoded = msgspec.json.encode(text)
    except UnicodeEncodeError as exc:
        raise CaseError(f"path {text!r} cannot be written as JSON text") from exc
    return encoded[1:-1].decode()


def substitute_arg(template: str, *, fixture: str, workdir: str) -> str:
    """Bind the placeholders in one adapter argument: raw text, one pass."""
    bound = {"FIXTURE": fixture, "WORKDIR": workdir}
    return _PLACEHOLDER.sub(lambda m: bound[m.group(1)], template)


def substitute(template: str, *, fixture: str, workdir: str) -> str:
    """Bind ``${FIXTURE}`` and ``${WORKDIR}`` in one pass.

    One pass, so a WORKDIR whose name happens to contain ``${FIXTURE}`` is
    not substituted a second time.
    """
    bound = {"FIXTURE": json_string_body(fixture), "WORKDIR": json_string_body(workdir)}
    return _PLACEHOLDER.sub(lambda m: bound[m.group(1)], template)


class LineKind(Enum):
    REQUEST = "request"  # method and a non-null id: answered, so awaited
    NOTIFICATION = "notification"  # method, id absent or null: never answered
    # Not JSON, or no method. Sent without waiting: whether such a line is
    # answered (-32700/-32600 with id null) or skipped is the adapter's
    # contract under test, and the frame count settles it either way.
    OTHER = "other"


@dataclass(frozen=True)
class Line:
    number: int  # physical line in request.jsonl, for messages
    data: bytes  # after substitution, without the newline
    kind: LineKind
    id: Any = None  # the request id, only for REQUEST


def classify(data: bytes) -> tuple[LineKind, Any]:
    try:
        frame = decode_frame(data)
    except ValueError:
        return LineKind.OTHER, None
    if not isinstance(frame, dict) or not isinstance(frame.get("method"), str):
        return LineKind.OTHER, None
    if frame.get("id") is None:
        return LineKind.NOTIFICATION, None
    return LineKind.REQUEST, frame["id"]


def message(frame: bytes) -> dict[str, Any]:
    """``frame`` decoded as a JSON-RPC message, or :class:`BadFrame` when it
    can be none: not JSON, nested too deep to judge, or JSON that is neither
    an object with a ``method`` (a request or a notification) nor one with an
    ``id`` (a response). No more than that: a response missing its
    ``result`` is still an answer, and the comparison says what is wrong
    with it."""
    try:
        decoded = decode_frame(frame)
    except BadFrame:
        raise
    except ValueError as exc:
        raise BadFrame("is not JSON") from exc
    if not isinstance(decoded, dict) or ("method" not in decoded and "id" not in decoded):
        raise BadFrame("is no JSON-RPC message (an object with a method or an id)")
    return decoded


def answers(frame: bytes, request_id: Any) -> bool:
    """Whether ``frame`` is the response to the request with ``request_id``.

    :class:`BadFrame` propagates: such a frame answers nothing, and nothing
    says the answer will still come; waiting on for it ended only at the
    case's timeout, which then blamed a hang for the bad frame.
    """
    decoded = message(frame)
    return "method" not in decoded and "id" in decoded and json_equal(decoded["id"], request_id)


@dataclass(frozen=True)
class Send:
    line: Line


@dataclass(frozen=True)
class Await:
    line: Line  # the request whose response must arrive first


@dataclass(frozen=True)
class AwaitFrames:
    line: Line  # the line that waits
    frames: int  # how many frames must have arrived, in all, before it is sent


@dataclass(frozen=True)
class Place:
    line: Line  # the line that is sent right after
    files: tuple[tuple[str, str], ...]  # (source, target) absolute paths


Step = Send | Await | AwaitFrames | Place


def lockstep_steps(
    lines: Sequence[Line],
    await_frames: Mapping[int, int] | None = None,
    place_files: Mapping[int, Sequence[tuple[str, str]]] | None = None,
) -> list[Step]:
    """The lockstep flow as a plan: sends, and the waits between them.

    A request's wait is placed just before the next request (or at the end),
    not right after it, so notifications that follow it go out while it is
    still in flight. A line named in ``await_frames`` (by line number) also
    waits, after that, for the frame count it names; a line named in
    ``place_files`` has its files placed after every wait, just before it is
    sent, so the adapter has answered everything before the file appears.
    """
    counts = await_frames or {}
    placed = place_files or {}
    steps: list[Step] = []
    pending: Line | None = None
    for line in lines:
        if line.kind is LineKind.REQUEST and pending is not None:
            steps.append(Await(pending))
            pending = None
        if line.number in placed:
            steps.append(Place(line, tuple(placed[line.number])))
        if line.number in counts:
            steps.append(AwaitFrames(line, counts[line.number]))
        steps.append(Send(line))
        if line.kind is LineKind.REQUEST:
            pending = line
    if pending is not None:
        steps.append(Await(pending))
    return steps


class FrameLines:
    """Cuts a byte stream into transcript frames: the lines of
    :class:`streamd.rpc.framing.LineSplitter` (the one splitter), with no size
    limit of a line (the adapter's output is what is judged, whole; the drivers
    bound a run's output as a whole, ``OUTPUT_LIMIT``), each trimmed of JSON
    whitespace. Blank lines are not frames. A last line without a newline is
    still a frame (the adapter wrote it, so it counts); ``close`` returns it.
    """

    def __init__(self) -> None:
        self._splitter = framing.LineSplitter(sys.maxsize)

    def feed(self, chunk: bytes | bytearray) -> list[bytes]:
        return _trimmed(self._splitter.feed(chunk))

    def close(self) -> list[bytes]:
        return _trimmed(self._splitter.close())


def _trimmed(frames: list[framing.Frame]) -> list[bytes]:
    out = []
    for frame in frames:
        assert isinstance(frame, bytes)  # nothing is over an unbounded limit
        line = frame.strip(_JSON_WS)
        if line:
            out.append(line)
    return out


def split_file_lines(data: bytes) -> list[tuple[int, bytes]]:
    """(line number, trimmed content) of every non-blank line of a .jsonl file."""
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        line = raw.strip(_JSON_WS)
        if line:
            out.append((number, line))
    return out
