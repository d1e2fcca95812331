"""docs/wire.md's method tables name the params each ``eventlog/*`` method
takes: a name there that the method's params Struct does not have is a request
a reader would write and the daemon would refuse (-32602, unknown field)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from streamd.eventlog import EventLog
from streamd.eventlog.service import eventlog_methods

REPO = Path(__file__).resolve().parents[1]


def _no_log() -> EventLog:
    raise AssertionError("the table is read for its params types; no request is served")


METHODS = {m.name: m for m in eventlog_methods(_no_log)}


def _methods(cell: str) -> list[str]:
    """``eventlog/retention.set` / `retention.get``, or ``eventlog/boot.record/update``:
    each method's full name."""
    names = []
    for part in re.findall(r"`([^`]+)`", cell):
        head, _, tail = part.removeprefix("eventlog/").partition(".")
        stems = [f"{head}.{t}" for t in tail.split("/")] if tail else [head]
        names += [f"eventlog/{stem}" for stem in stems]
    return names


def _param_names(cell: str) -> set[str]:
    """The top-level names of one method's params cell: nested ``{...}``, ``[...]`` and
    asides ``(...)`` dropped, ``?`` (optional) stripped."""
    flat = cell
    while True:
        shorter = re.sub(r"\{[^{}]*\}|\([^()]*\)|\[[^\[\]]*\]", "", flat)
        if shorter == flat:
            break
        flat = shorter
    return {w.strip().rstrip("?").strip() for w in flat.split(",")} - {"", "..."}


def documented_params() -> list[tuple[str, set[str]]]:
    """(method, names) for every table row of wire.md that gives one params
    cell per method it names."""
    rows = []
    for line in (REPO / "docs" / "wire.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) < 3 or not cells[0].startswith("`eventlog/"):
            continue
        methods, params = _methods(cells[0]), cells[1].split(" / ")
        if len(methods) == len(params):
            rows += [(m, _param_names(p)) for m, p in zip(methods, params, strict=True)]
    return rows


def test_the_tables_are_read_for_most_eventlog_methods():
    assert {m for m, _ in documented_params()} >= {
        "eventlog/append", "eventlog/since", "eventlog/retention.set", "eventlog/compact",
        "eventlog/state.get", "eventlog/lock.acquire", "eventlog/boot.recent",
    }


def test_every_param_wire_md_names_is_a_field_of_the_methods_params():
    wrong = []
    for method, names in documented_params():
        fields = {f.encode_name for f in msgspec.structs.fields(METHODS[method].params)}
        wrong += [f"{method}: {name}" for name in sorted(names - fields)]
    assert wrong == []
