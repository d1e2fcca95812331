"""The Recall methods' wire types, mirroring ../shared/recall-schemas.

Params: every Struct forbids unknown fields (the schemas say
additionalProperties false), so a misspelled key is -32602, never silently
ignored. Timestamps are checked with the reference's RFC 3339 rules when
decoded, and exposed as Unix nanoseconds.

Results: fields are declared in the order the reference writes them, so the
encoded bytes are its bytes (the conformance suites compare them). A member
the reference leaves out when empty (Go's ``omitempty``) is ``UNSET`` until
set; every other member is always written.
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


def deadline_of(params: Deadlined) -> int | None:
    return params.deadline_ns


# --- results ----------------------------------------------------------------


# kw_only: members are declared in wire order, optional ones among the rest.


class AdapterManifest(Struct, kw_only=True):
    """``recall/initialize``: who we are and what we offer."""

    protocol_version: int
    adapter_id: str
    display_name: str
    record_types: list[str]
    query_modes: list[str]
    freshness_modes: list[str]
    as_of_support: str
    relevance_basis: str
    capabilities: list[str]
    freshness_policy: str
    sensitivity: str
    settings_schema: dict[str, Any]


class CandidateMetadata(Struct, kw_only=True):
    actor: str | UnsetType = UNSET
    byte_offset: int
    file: str
    ref: str | UnsetType = UNSET
    schema: int
    system: str | UnsetType = UNSET
    upstream_revision: str | UnsetType = UNSET


class LogCandidateMetadata(Struct, kw_only=True):
    """A candidate of the event-log source: where its event lives in the log."""

    actor: str | UnsetType = UNSET
    app: str
    branch: str | UnsetType = UNSET
    invocation: str | UnsetType = UNSET
    seq: int
    session: str
    user: str


class Candidate(Struct, kw_only=True):
    candidate_id: str
    source_uid: str = ""
    source_id: str = ""
    source_record_id: str
    locator: str
    derived_from: list[str] | UnsetType = UNSET
    record_type: str
    title: str
    excerpt: str | UnsetType = UNSET
    local_rank: int
    local_score: float | int
    relevance: float | int
    match_signals: list[str]
    observed_at: str
    confirmed_at: str
    event_time: str
    source_revision: str
    sensitivity: str
    metadata: CandidateMetadata | LogCandidateMetadata


class Indexing(Struct, kw_only=True):
    """A build still running behind a partial answer: how far it has come.
    streamd's own member (the reference fails such requests instead)."""

    consumed_bytes: int
    total_bytes: int


class SearchDiagnostics(Struct, kw_only=True):
    coverage: str
    elapsed_ms: int
    failed_records: int
    generation: str
    indexed: int
    indexing: Indexing | UnsetType = UNSET
    matched: int
    missing_files: list[str] | UnsetType = UNSET
    query_mode: str
    terms: int


class SkipDiagnostics(Struct, kw_only=True):
    unsupported_filters: list[str]


class SearchResult(Struct, kw_only=True):
    candidates: list[Candidate]
    diagnostics: SearchDiagnostics | SkipDiagnostics
    source_watermark: str | UnsetType = UNSET
    outcome: str
    reason: str | UnsetType = UNSET


class HealthDiagnostics(Struct, kw_only=True):
    checkpoint_unwritable: bool | UnsetType = UNSET
    files: int
    indexing: Indexing | UnsetType = UNSET
    missing_files: list[str] | UnsetType = UNSET
    stream_rewritten: bool | UnsetType = UNSET


class LogHealthDiagnostics(Struct, kw_only=True):
    """The event-log source's probe: how far the index has read the log."""

    behind: int | UnsetType = UNSET
    checkpoint_unwritable: bool | UnsetType = UNSET
    removed: int | UnsetType = UNSET
    seq: int


class FailureDiagnostics(Struct, kw_only=True):
    reason: str


class Health(Struct, kw_only=True):
    status: str
    checked_at: str
    last_success_at: str | UnsetType = UNSET
    source_watermark: str | UnsetType = UNSET
    index_watermark: str | UnsetType = UNSET
    index_generation: str | UnsetType = UNSET
    index_config: str | UnsetType = UNSET
    record_count: int | UnsetType = UNSET
    indexed_count: int | UnsetType = UNSET
    failed_count: int | UnsetType = UNSET
    coverage: str
    diagnostics: HealthDiagnostics | LogHealthDiagnostics | FailureDiagnostics


class Expansion(Struct, kw_only=True):
    content: str
    source_revision: str
    truncated: bool
    truncation_boundary: str | UnsetType = UNSET
    provenance: str
