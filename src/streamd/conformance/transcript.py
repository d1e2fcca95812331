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

Reading a case here touches the file system (it is values in from disk), but
nothing here starts a process, waits, or imports Trio: that is
:mod:`streamd.conformance.driver`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
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

_MANIFEST_KEYS = frozenset(
    {
        "case",
        "description",
        "flow",
        "placeholders",
        "volatile",
        "responses",
        "adapter_args",
        "await_frames",
        "place_files",
    }
)
# JSON's insignificant whitespace. Deliberately not str.strip()/splitlines():
# U+2028 and friends are legal inside a frame and must not cut it.
_JSON_WS = b" \t\r\n"
_PLACEHOLDER = re.compile(r"\$\{(FIXTURE|WORKDIR)\}")
_ANY_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_BAD_TILDE = re.compile(r"~(?![01])")
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")


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
        raise CaseError(f"volatile pointer {_quote(text)} does not start with /")
    segments = []
    for raw in text[1:].split("/"):
        if _BAD_TILDE.search(raw):
            raise CaseError(f"volatile pointer {_quote(text)} has a ~ that is not ~0 or ~1")
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
        elif _ARRAY_INDEX.fullmatch(head) and int(head) < len(node):
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
    return _clip(text)


def _clip(text: str) -> str:
    return text if len(text) <= RENDER_LIMIT else text[: RENDER_LIMIT - 1] + "…"


def _quote(text: str) -> str:
    return msgspec.json.encode(text).decode()


def decode_frame(data: bytes) -> Any:
    """Decode one frame; raises ValueError (malformed JSON or invalid UTF-8)."""
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


def answers(frame: bytes, request_id: Any) -> bool:
    """Whether ``frame`` is the response to the request with ``request_id``."""
    try:
        decoded = decode_frame(frame)
    except ValueError:
        return False
    return (
        isinstance(decoded, dict)
        and "method" not in decoded
        and "id" in decoded
        and json_equal(decoded["id"], request_id)
    )


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
    limit (the adapter's output is what is judged, whole), each trimmed of JSON
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


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    case: str
    description: str
    flow: str
    volatile: tuple[str, ...]  # as written, for messages
    pointers: tuple[Pointer, ...]  # the same, parsed
    responses: int  # frames the adapter must write, in total
    adapter_args: tuple[str, ...] = ()  # appended to the command, placeholders unbound
    await_frames: tuple[tuple[int, int], ...] = ()  # (line number, frames) pairs
    place_files: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (line number, names)


def validate_manifest(data: Any, directory_name: str) -> Manifest:
    """Check a decoded manifest.json against the directory it sits in.

    Unknown keys are refused: a harness that ignored a field it does not
    understand (or a misspelt ``volatil``) could not claim a faithful replay.
    """
    if not isinstance(data, dict):
        raise CaseError("manifest.json is not a JSON object")
    unknown = sorted(set(data) - _MANIFEST_KEYS)
    if unknown:
        raise CaseError(f"manifest.json has unknown key {_quote(unknown[0])}")
    for key in ("case", "description", "flow", "volatile", "responses"):
        if key not in data:
            raise CaseError(f"manifest.json has no {_quote(key)}")

    case = data["case"]
    if not isinstance(case, str) or case != directory_name:
        # A renamed directory with a stale manifest is a defect, not an alias.
        raise CaseError(
            f"manifest names case {render(case)} but the directory is {_quote(directory_name)}"
        )
    description = data["description"]
    if not isinstance(description, str) or not description.strip():
        raise CaseError(
            "manifest has no description; a transcript nobody can read is not documentation"
        )
    flow = data["flow"]
    if flow != FLOW_LOCKSTEP:
        raise CaseError(f"flow {render(flow)} is not defined; lockstep is the only flow")
    responses = data["responses"]
    if not isinstance(responses, int) or isinstance(responses, bool) or responses < 0:
        raise CaseError(f"responses must be a whole number >= 0, not {render(responses)}")

    volatile = data["volatile"]
    if not isinstance(volatile, list):
        raise CaseError(f"volatile must be a list of JSON pointers, not {render(volatile)}")
    pointers = []
    for i, text in enumerate(volatile):
        if not isinstance(text, str):
            raise CaseError(f"volatile[{i}] is {render(text)}, not a JSON pointer string")
        pointers.append(parse_pointer(text))

    placeholders = data.get("placeholders", {})
    if not isinstance(placeholders, dict) or not all(
        isinstance(v, str) for v in placeholders.values()
    ):
        raise CaseError("placeholders must be an object of name: description strings")
    for name in placeholders:
        if name not in PLACEHOLDERS:
            # Sending an unbound ${NAME} would fail the case somewhere obscure.
            raise CaseError(
                f"placeholder {_quote(name)} cannot be bound; this harness binds "
                + " and ".join(PLACEHOLDERS)
            )

    adapter_args = data.get("adapter_args", [])
    if not isinstance(adapter_args, list) or not all(isinstance(a, str) for a in adapter_args):
        raise CaseError("adapter_args must be a list of strings")
    for arg in adapter_args:
        for name in _ANY_PLACEHOLDER.findall(arg):
            if name not in PLACEHOLDERS:
                raise CaseError(
                    f"adapter_args uses ${{{name}}}; this harness binds "
                    + " and ".join(PLACEHOLDERS)
                )

    waits = data.get("await_frames", {})
    if not isinstance(waits, dict):
        raise CaseError("await_frames must be an object of line number: frame count")
    await_frames = []
    for key, count in waits.items():
        if not _ARRAY_INDEX.fullmatch(key) or key == "0":
            raise CaseError(f"await_frames key {_quote(key)} is not a line number")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= responses:
            # More than the declared total could never arrive: the run would hang.
            raise CaseError(
                f"await_frames[{_quote(key)}] must be a whole number from 1 to "
                f"responses ({responses}), not {render(count)}"
            )
        await_frames.append((int(key), count))

    places = data.get("place_files", {})
    if not isinstance(places, dict):
        raise CaseError("place_files must be an object of line number: file names")
    place_files = []
    for key, names in places.items():
        if not _ARRAY_INDEX.fullmatch(key) or key == "0":
            raise CaseError(f"place_files key {_quote(key)} is not a line number")
        if not isinstance(names, list) or not names:
            raise CaseError(f"place_files[{_quote(key)}] must be a non-empty list of file names")
        for name in names:
            # A plain name only: the target is always directly inside WORKDIR.
            if not isinstance(name, str) or name in ("", ".", "..") or "/" in name:
                raise CaseError(
                    f"place_files[{_quote(key)}] holds {render(name)}, not a plain file name"
                )
        place_files.append((int(key), tuple(names)))

    return Manifest(
        case=case,
        description=description,
        flow=flow,
        volatile=tuple(volatile),
        pointers=tuple(pointers),
        responses=responses,
        adapter_args=tuple(adapter_args),
        await_frames=tuple(sorted(await_frames)),
        place_files=tuple(sorted(place_files)),
    )


@dataclass(frozen=True)
class Case:
    name: str
    directory: Path
    manifest: Manifest
    templates: tuple[tuple[int, str], ...]  # request.jsonl lines before substitution
    recorded: tuple[bytes, ...] | None  # response.jsonl frames; None when recording

    @property
    def fixture(self) -> str:
        return str((self.directory / "fixture").absolute())


def _read(directory: Path, name: str) -> bytes:
    try:
        return (directory / name).read_bytes()
    except FileNotFoundError:
        raise CaseError(f"{name} is missing") from None
    except OSError as exc:
        raise CaseError(f"cannot read {name}: {exc.strerror or exc}") from exc


def load_case(directory: Path, *, with_recording: bool = True) -> Case:
    """Read and validate a case. ``with_recording`` is False for the recorder,
    which replaces response.jsonl and so must not depend on it."""
    directory = Path(directory)
    try:
        manifest_data = decode_frame(_read(directory, "manifest.json"))
    except ValueError as exc:
        raise CaseError(f"manifest.json is not JSON: {exc}") from exc
    manifest = validate_manifest(manifest_data, directory.name)

    raw_requests = _read(directory, "request.jsonl")
    templates = []
    for number, line in split_file_lines(raw_requests):
        try:
            templates.append((number, line.decode("utf-8")))
        except UnicodeDecodeError:
            raise CaseError(f"request.jsonl line {number} is not UTF-8") from None
    if not templates:
        raise CaseError("request.jsonl holds no lines")
    case = Case(
        name=directory.name,
        directory=directory,
        manifest=manifest,
        templates=tuple(templates),
        recorded=None,
    )

    if any("${FIXTURE}" in t for _, t in templates) and not (directory / "fixture").is_dir():
        raise CaseError("request.jsonl uses ${FIXTURE} but the case has no fixture/ directory")
    if (
        any("${FIXTURE}" in a for a in manifest.adapter_args)
        and not (directory / "fixture").is_dir()
    ):
        raise CaseError("adapter_args uses ${FIXTURE} but the case has no fixture/ directory")
    numbers = {number for number, _ in templates}
    for number, _ in manifest.await_frames:
        if number not in numbers:
            raise CaseError(f"await_frames names line {number}, which request.jsonl does not hold")
    for number, names in manifest.place_files:
        if number not in numbers:
            raise CaseError(f"place_files names line {number}, which request.jsonl does not hold")
        for name in names:
            if not (directory / "staged" / name).is_file():
                raise CaseError(f"place_files names staged/{name}, which the case does not hold")
    # Every request is answered, so fewer declared responses than requests is a
    # manifest that no adapter can satisfy. The stand-in WORKDIR only affects
    # the bytes of a path inside a string, never how a line classifies.
    requests = sum(line.kind is LineKind.REQUEST for line in prepare_requests(case, "/"))
    if requests > manifest.responses:
        raise CaseError(
            f"request.jsonl holds {requests} requests but the manifest declares "
            f"{manifest.responses} responses; every request is answered"
        )

    if not with_recording:
        return case
    recorded = []
    for number, line in split_file_lines(_read(directory, "response.jsonl")):
        try:
            decode_frame(line)
        except ValueError as exc:
            raise CaseError(f"response.jsonl line {number} is not JSON: {exc}") from exc
        recorded.append(line)
    if len(recorded) != manifest.responses:
        raise CaseError(
            f"response.jsonl holds {len(recorded)} frames but the manifest declares "
            f"{manifest.responses}; re-record the case"
        )
    return Case(
        name=case.name,
        directory=directory,
        manifest=manifest,
        templates=case.templates,
        recorded=tuple(recorded),
    )


def adapter_command(case: Case, command: Sequence[str], workdir: str) -> list[str]:
    """The command for one run: the adapter's, then the case's bound adapter_args."""
    return [
        *command,
        *(
            substitute_arg(a, fixture=case.fixture, workdir=workdir)
            for a in case.manifest.adapter_args
        ),
    ]


def placements(case: Case, workdir: str) -> dict[int, list[tuple[str, str]]]:
    """``place_files`` bound for one run: line number to (source, target) paths."""
    staged = (case.directory / "staged").absolute()
    return {
        number: [(str(staged / name), str(Path(workdir) / name)) for name in names]
        for number, names in case.manifest.place_files
    }


def prepare_requests(case: Case, workdir: str) -> list[Line]:
    """Substitute and classify every request line for one run."""
    lines = []
    for number, template in case.templates:
        data = substitute(template, fixture=case.fixture, workdir=workdir).encode()
        kind, request_id = classify(data)
        lines.append(Line(number, data, kind, request_id))
    return lines


def compare_transcript(
    recorded: Sequence[bytes], got: Sequence[bytes], pointers: Sequence[Pointer]
) -> str | None:
    """The first difference between a recording and a run, as one sentence.

    Frames are compared in arrival order after masking; then the counts, so an
    extra frame after shutdown and a missing answer both fail.
    """
    for i, raw in enumerate(got):
        n = i + 1
        try:
            frame = decode_frame(raw)
        except ValueError:
            return f"response {n} is not JSON: {_clip(raw.decode('utf-8', 'replace'))}"
        if i >= len(recorded):
            return (
                f"response {n}: want nothing, got {render(frame)} "
                f"(the transcript holds {len(recorded)} responses)"
            )
        want = mask(decode_frame(recorded[i]), pointers)
        found = first_difference(want, mask(frame, pointers))
        if found:
            return f"response {n}{found.describe()}"
    if len(got) < len(recorded):
        n = len(got) + 1
        return (
            f"response {n}: want {render(decode_frame(recorded[n - 1]))}, got nothing "
            f"(the run produced {len(got)} responses)"
        )
    return None


def discover_cases(suite: Path) -> list[Path]:
    """Every case directory of a suite, by name. A directory without a manifest
    is still a case (an invalid one), so a lost manifest fails loudly."""
    return sorted(
        (p for p in Path(suite).iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.name,
    )
