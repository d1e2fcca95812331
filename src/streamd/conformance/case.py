"""Conformance cases: the manifest and its validation, loading a case from its
directory, the requests and placements prepared for one run, and the
comparison of a run with its recording.

The case format and the manifest keys are described in
:mod:`streamd.conformance.transcript`, which holds the rules underneath
(pointers and masking, structural comparison, placeholders, line
classification, the lockstep plan). Reading a case touches the file system
(values in from disk); nothing here starts a process, waits, or imports Trio.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamd import regular_files
from streamd.conformance.transcript import (
    ABSENT,
    ARRAY_INDEX,
    FLOW_LOCKSTEP,
    PLACEHOLDERS,
    BadFrame,
    CaseError,
    Difference,
    Line,
    LineKind,
    Pointer,
    classify,
    decode_frame,
    first_difference,
    mask,
    message,
    parse_pointer,
    quoted,
    render,
    split_file_lines,
    substitute,
    substitute_arg,
)

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
_ANY_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
#: The most a case's manifest, requests or recording may hold; a transcript
#: is kilobytes.
CASE_FILE_LIMIT = 64 << 20


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
        raise CaseError(f"manifest.json has unknown key {quoted(unknown[0])}")
    for key in ("case", "description", "flow", "volatile", "responses"):
        if key not in data:
            raise CaseError(f"manifest.json has no {quoted(key)}")

    case = data["case"]
    if not isinstance(case, str) or case != directory_name:
        # A renamed directory with a stale manifest is a defect, not an alias.
        raise CaseError(
            f"manifest names case {render(case)} but the directory is {quoted(directory_name)}"
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
                f"placeholder {quoted(name)} cannot be bound; this harness binds "
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
        if not ARRAY_INDEX.fullmatch(key) or key == "0":
            raise CaseError(f"await_frames key {quoted(key)} is not a line number")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= responses:
            # More than the declared total could never arrive: the run would hang.
            raise CaseError(
                f"await_frames[{quoted(key)}] must be a whole number from 1 to "
                f"responses ({responses}), not {render(count)}"
            )
        await_frames.append((int(key), count))

    places = data.get("place_files", {})
    if not isinstance(places, dict):
        raise CaseError("place_files must be an object of line number: file names")
    place_files = []
    for key, names in places.items():
        if not ARRAY_INDEX.fullmatch(key) or key == "0":
            raise CaseError(f"place_files key {quoted(key)} is not a line number")
        if not isinstance(names, list) or not names:
            raise CaseError(f"place_files[{quoted(key)}] must be a non-empty list of file names")
        for name in names:
            # A plain name only: the target is always directly inside WORKDIR.
            if not isinstance(name, str) or name in ("", ".", "..") or "/" in name:
                raise CaseError(
                    f"place_files[{quoted(key)}] holds {render(name)}, not a plain file name"
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
    """A case file's bytes. A case directory is anyone's: a FIFO at one of its
    names would block a plain open for good (no case timeout runs yet), and a
    link to ``/dev/zero`` would be read without end, so only a regular file of
    at most ``CASE_FILE_LIMIT`` bytes is read."""

    def small_enough(st: os.stat_result) -> None:
        if st.st_size > CASE_FILE_LIMIT:
            raise CaseError(
                f"{name} is {st.st_size} bytes, over the {CASE_FILE_LIMIT} a case file may hold"
            )

    try:
        fd = regular_files.open_fd(str(directory / name), os.O_RDONLY, check=small_enough)
        with os.fdopen(fd, "rb") as file:
            return file.read(CASE_FILE_LIMIT + 1)
    except FileNotFoundError:
        raise CaseError(f"{name} is missing") from None
    except regular_files.NotRegularFile as exc:
        raise CaseError(f"cannot read {name}: {exc}") from None
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
    extra frame after shutdown and a missing answer both fail. A frame that
    can be no JSON-RPC message fails as that, named, whatever was recorded.
    """
    for i, raw in enumerate(got):
        n = i + 1
        try:
            frame = message(raw)
        except BadFrame as exc:
            return f"response {n} {exc.about(raw)}"
        if i >= len(recorded):
            return (
                f"response {n}: want nothing, got {render(frame)} "
                f"(the transcript holds {len(recorded)} responses)"
            )
        want = mask(decode_frame(recorded[i]), pointers)
        found = first_difference(want, mask(frame, pointers))
        if found:
            return f"response {n}{found.describe()}{_other_outcome(found, frame)}"
    if len(got) < len(recorded):
        n = len(got) + 1
        return (
            f"response {n}: want {render(decode_frame(recorded[n - 1]))}, got nothing "
            f"(the run produced {len(got)} responses)"
        )
    return None


def _other_outcome(found: Difference, frame: Any) -> str:
    """What the run answered instead, when it answered an error where a result
    was recorded (or the other way round): "got nothing" at ``/result`` alone
    hides the refusal that says why, such as a suite replayed against the
    wrong adapter."""
    if found.got is not ABSENT or not isinstance(frame, dict):
        return ""
    other = {"/result": "error", "/error": "result"}.get(found.pointer)
    if other is None or other not in frame:
        return ""
    return f": it answered the {other} {render(frame[other])}"


def discover_cases(suite: Path) -> list[Path]:
    """Every case directory of a suite, by name. A directory without a manifest
    is still a case (an invalid one), so a lost manifest fails loudly."""
    return sorted(
        (p for p in Path(suite).iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.name,
    )
