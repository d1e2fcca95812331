"""Typed params of the Recall methods, mirroring ../shared/recall-schemas.

Every Struct forbids unknown fields (the schemas say additionalProperties
false), so a misspelled key is -32602, never silently ignored. Timestamps are
checked with the reference's RFC 3339 rules when decoded, and exposed as Unix
nanoseconds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from streamd.golang import gotime

# The reference decodes these into Go's int: 2**63 and beyond are its
# "cannot unmarshal number" errors, so they are -32602 here too, before any
# arithmetic could meet them.
INT64_MAX = (1 << 63) - 1
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
Version = Annotated[int, Meta(ge=1, le=INT64_MAX)]
NonEmpty = Annotated[str, Meta(min_length=1)]
# The schema's ^[^:]+:.+$ under Go's regexp: "." never matches a newline and
# "$" is the very end (Python's "$" would also match before a final newline).
Locator = Annotated[str, Meta(pattern=r"^[^:]+:[^\n]+\Z")]
Detail = Literal["summary", "excerpt", "full", "context"]


def instant(value: str, name: str) -> int:
    parsed = gotime.parse_wire(value)
    if parsed is None:
        raise ValueError(f"{name} {value!r} is not an RFC 3339 time")
    return parsed


class Params(Struct, forbid_unknown_fields=True, dict=True):
    pass


class InitializeParams(Params):
    protocol_version_min: Version
    protocol_version_max: Version
    workdir: NonEmpty
    source_id: NonEmpty
    location: str = ""
    base_dir: str = ""
    settings: dict[str, Any] | None = None


class Filters(Params):
    record_types: list[NonEmpty] | None = None
    since: str | UnsetType = UNSET
    until: str | UnsetType = UNSET
    entities: list[str] | None = None
    project: str = ""

    def __post_init__(self) -> None:
        self.since_ns = None if self.since is UNSET else instant(self.since, "since")
        self.until_ns = None if self.until is UNSET else instant(self.until, "until")


class Deadlined(Params):
    deadline: str

    def __post_init__(self) -> None:
        self.deadline_ns = instant(self.deadline, "deadline")


class SearchParams(Deadlined):
    query: str
    filters: Filters
    limit: Count
    context: list[str] | None = None
    as_of: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        super().__post_init__()
        self.as_of_ns = None if self.as_of is UNSET else instant(self.as_of, "as_of")


class ExpandParams(Deadlined):
    locator: Locator
    detail: Detail
    budget_bytes: Count


class HealthParams(Deadlined):
    pass


class RefreshParams(Deadlined):
    full: bool = False


def deadline_of(params: Any) -> int | None:
    return getattr(params, "deadline_ns", None)


