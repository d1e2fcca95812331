"""The event-log source's identity and settings: its manifest, what it indexes.

Sans-I/O. The settings are this adapter's own (no reference fixes their
decoding), so they are a msgspec Struct that refuses unknown keys and wrong
types with msgspec's words. ``debug_seed`` and ``debug_stall_ms`` exist for
recording conformance cases against the real process, as the stream
adapter's ``debug_stall_ms`` does.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.store import EventRow
from streamd.recall.answers import PROTOCOL_VERSION
from streamd.recall.eventlog.project import KINDS
from streamd.recall.wire import AdapterManifest

__all__ = [
    "ADAPTER_ID",
    "INDEX_CONFIG",
    "SENSITIVITY",
    "SETTINGS_SCHEMA",
    "LogSettings",
    "manifest",
    "parse_settings",
]

ADAPTER_ID = "streamd-eventlog/1"
DISPLAY_NAME = "Agent event log"
INDEX_CONFIG = "eventlog/1 tokenizer=ident-runs scoring=term-coverage"
DEFAULT_MAX_CANDIDATES = 50
# Agent logs hold what users typed and what tools returned: more than a
# team's internal notes. A candidate may raise its source's floor, never
# lower it, so the floor is what every record is.
SENSITIVITY = "confidential"

_Names = Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(max_length=1000)]


class LogSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    apps: _Names | None = None
    users: _Names | None = None
    authors: _Names | None = None
    branch_prefixes: list[str] | None = None
    max_candidates: Annotated[int, msgspec.Meta(ge=1)] | None = None
    debug_seed: str = ""
    debug_stall_ms: Annotated[int, msgspec.Meta(ge=0)] = 0

    @property
    def limit(self) -> int:
        return self.max_candidates or DEFAULT_MAX_CANDIDATES

    @property
    def admits_all(self) -> bool:
        """No list narrows what is indexed."""
        return (self.apps is None and self.users is None and self.authors is None
                and self.branch_prefixes is None)

    def admits(self, row: EventRow) -> bool:
        """Whether the event is one this source indexes (every list given
        must name it; a branch prefix list admits a branch starting with any)."""
        if self.apps is not None and row[1] not in self.apps:
            return False
        if self.users is not None and row[2] not in self.users:
            return False
        if self.authors is not None and row[6] not in self.authors:
            return False
        if self.branch_prefixes is not None:
            return row[7].startswith(tuple(self.branch_prefixes))
        return True

    def identity(self) -> str:
        """What an index built under these settings depends on: a saved one
        built under others is rebuilt, not reused."""
        return msgspec.json.encode(
            [self.apps, self.users, self.authors, self.branch_prefixes]).decode()


SETTINGS_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "apps": {"description": "Index only these apps' events.", "items": {"type": "string"},
                 "type": "array"},
        "users": {"description": "Index only these users' events.",
                  "items": {"type": "string"}, "type": "array"},
        "authors": {"description": "Index only events by these authors.",
                    "items": {"type": "string"}, "type": "array"},
        "branch_prefixes": {
            "description": "Index only events whose branch starts with one of these "
            "(\"\" admits every branch, the session's own turns included).",
            "items": {"type": "string"}, "type": "array",
        },
        "max_candidates": {"description": "Cap on candidates returned by one search.",
                           "minimum": 1, "type": "integer"},
        "debug_seed": {
            "description": "Testing only: a JSONL file of eventlog/append params appended "
            "to the log at initialize (conformance cases build their log with it).",
            "type": "string",
        },
        "debug_stall_ms": {
            "description": "Testing only: an artificial delay before a search or refresh, "
            "for recording cancellation. Leave unset in real configuration.",
            "minimum": 0, "type": "integer",
        },
    },
    "type": "object",
}


def parse_settings(raw: dict[str, Any] | None) -> LogSettings:
    try:
        return msgspec.convert(raw or {}, LogSettings)
    except msgspec.ValidationError as exc:
        raise RpcError(INVALID_PARAMS, f"eventlog settings: {exc}") from None


def manifest() -> AdapterManifest:
    return AdapterManifest(
        protocol_version=PROTOCOL_VERSION,
        adapter_id=ADAPTER_ID,
        display_name=DISPLAY_NAME,
        record_types=list(KINDS),
        query_modes=["exact", "lexical", "temporal"],
        freshness_modes=["indexed"],
        as_of_support="filter",
        relevance_basis="lexical_span",
        capabilities=["search", "expand", "checkpoint", "context_expansion"],
        freshness_policy="indexed: caught up by seq before every search and on recall/refresh; "
        "events this process commits are indexed as they commit, other writers' by the log's "
        "change signal or at the next query at the latest; deleted events (retention, "
        "session deletes) leave the index at the next catch-up and their locators expire",
        sensitivity=SENSITIVITY,
        settings_schema=SETTINGS_SCHEMA,
    )
