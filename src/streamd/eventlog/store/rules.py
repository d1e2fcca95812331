"""The storage rules every backend states the same way: refusals and checks.

Values in, errors out; no connection. A backend keeps its SQL; what a refusal
says, and which values are refused before any SQL runs, lives here once, so
SQLite and PostgreSQL cannot drift apart in what a client reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamd.errors import (
    EVENT_CONFLICT,
    SESSION_LOCKED,
    SESSION_NOT_FOUND,
    SOURCE_UNAVAILABLE,
    STALE_SESSION,
    RpcError,
    invalid_params,
)
from streamd.eventlog.filters import Dialect
from streamd.eventlog.model import AppendParams, AppendResult
from streamd.eventlog.store import rows
from streamd.eventlog.store.backend import AppendGroup

__all__ = [
    "check_held",
    "check_limit",
    "check_recent",
    "locked",
    "not_found",
    "parsed_for_merge",
    "prepare_all",
    "prepare_group",
    "refused_in_group",
    "retried",
    "stale",
]


def check_limit(limit: int) -> None:
    if limit < 1:
        raise invalid_params(f"limit must be at least 1, not {limit}")


def check_recent(recent: int | None) -> None:
    if recent is not None and recent < 0:
        raise invalid_params(f"recent must not be negative, not {recent}")


def check_held(dialect: Dialect, what: str, texts: Sequence[tuple[str, str]]) -> None:
    """Refuse ``what`` (a lease, a policy) when one of its ``(name, text)``
    is text the database cannot store, as an event holding it is refused
    (-32602), before anything is sent: sent, the server refuses the
    parameter, and the write failed as if the database were down."""
    for name, text in texts:
        if dialect.cannot_hold(text):
            raise invalid_params(
                f"{what} rejected by the database: {name} contains U+0000, which its text"
                " cannot store"
            )


def locked(session: str, holder: str, age_ms: int, how: str) -> RpcError:
    return RpcError(
        SESSION_LOCKED,
        f"session {session!r} {how} (holder {holder}, heartbeat {age_ms} ms ago)",
        {"holder": holder, "heartbeat_age_ms": age_ms},
    )


def not_found(app: str, user: str, session: str) -> RpcError:
    return RpcError(
        SESSION_NOT_FOUND,
        f"session {session!r} not found",
        {"app": app, "user": user, "session": session},
    )


def stale(session: str, expected: int, found: int) -> RpcError:
    """Optimistic concurrency refused: the append was computed at ``expected``
    and the session has moved on to ``found``."""
    return RpcError(
        STALE_SESSION,
        f"session {session!r} has moved on: its last seq is {found}, the append was"
        f" computed at seq {expected}; nothing was written, read the session again",
        {"expected_seq": expected, "last_seq": found},
    )


def prepare_group(group: AppendGroup, now_us: int) -> list[rows.Prepared]:
    """Every append of a group prepared, or the first refusal, naming its index."""
    out = []
    for i, p in enumerate(group.appends):
        try:
            out.append(rows.prepare(p, now_us))
        except RpcError as exc:
            raise refused_in_group(exc, i) from None
    return out


def prepare_all(
    batch: Sequence[AppendParams | AppendGroup], now_us: int
) -> list[rows.Prepared | list[rows.Prepared] | RpcError]:
    """Each append (or group) of a batch prepared, or its refusal in its place."""
    out: list[rows.Prepared | list[rows.Prepared] | RpcError] = []
    for p in batch:
        try:
            out.append(prepare_group(p, now_us) if isinstance(p, AppendGroup)
                       else rows.prepare(p, now_us))
        except RpcError as exc:
            out.append(exc)
    return out


def retried(item: rows.Prepared, seq: int, stored_digest: bytes) -> AppendResult:
    """An append whose event id is stored already (at ``seq``): a retry of the
    same request is its duplicate; different content is ``event_conflict``."""
    if stored_digest == item.digest:
        return AppendResult(seq=seq, duplicate=True)
    event_id = item.params.event.id
    raise RpcError(
        EVENT_CONFLICT,
        f"event {event_id!r} was already appended with different content (seq {seq})",
        {"event_id": event_id, "seq": seq},
    )


def refused_in_group(exc: RpcError, index: int) -> RpcError:
    data = dict(exc.data) if isinstance(exc.data, dict) else {"error": exc.data}
    data["index"] = index
    return RpcError(
        exc.code, f"append {index} of the batch: {exc.message}; nothing of the batch was written",
        data,
    )


def parsed_for_merge(text: str, what: str) -> dict[str, Any]:
    """Stored state to merge a delta into. State that does not parse (damaged by
    hand) is refused rather than replaced: merging into ``{}`` would silently
    drop every other key."""
    try:
        return rows.decode_state(text)
    except ValueError:
        raise RpcError(
            SOURCE_UNAVAILABLE,
            f"the stored state of {what} cannot be parsed; nothing was written",
        ) from None
