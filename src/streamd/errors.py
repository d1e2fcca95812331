"""The one exception that crosses the wire.

Handlers raise :class:`RpcError`; the RPC layer is the only place that turns an
exception into an error frame. Each code carries its contract name so logs and
predicates speak the same vocabulary as the specs.
"""

from __future__ import annotations

# Not `from typing import ...`: this module is on the path of `streamd attach`,
# which must start in milliseconds, and typing costs ~8 ms to import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Recall's codes.
SOURCE_UNAVAILABLE = -32000
SOURCE_DENIED = -32001
LOCATOR_UNKNOWN = -32002
LOCATOR_EXPIRED = -32003
SOURCE_NOT_CONFIGURED = -32004
AS_OF_UNSUPPORTED = -32005
BUDGET_EXCEEDED = -32006
DEADLINE_EXCEEDED = -32007

# The event log's codes.
EVENT_CONFLICT = -32010
SESSION_LOCKED = -32011
SESSION_NOT_FOUND = -32012
CLOSED = -32013
STALE_SESSION = -32014

# ``data.reason`` of the one error (-32000, id null) a daemon at its
# connection limit sends a new connection before it closes it.
TOO_MANY_CONNECTIONS = "too_many_connections"
# ``data.reason`` of the budget_exceeded (-32006) that refuses a watch past the
# most one connection may have open.
TOO_MANY_WATCHES = "too_many_watches"
# ``data.reason`` of the budget_exceeded (-32006) that refuses a lease past
# the most a connection, or the log, may hold.
TOO_MANY_LEASES = "too_many_leases"
# ``data.reason`` of a client's (or an in-process log's) refusal to serve a
# process forked from the one that opened it.
FORKED = "forked"

CODE_NAMES: dict[int, str] = {
    PARSE_ERROR: "parse_error",
    INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "method_not_found",
    INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal_error",
    SOURCE_UNAVAILABLE: "source_unavailable",
    SOURCE_DENIED: "source_denied",
    LOCATOR_UNKNOWN: "locator_unknown",
    LOCATOR_EXPIRED: "locator_expired",
    SOURCE_NOT_CONFIGURED: "source_not_configured",
    AS_OF_UNSUPPORTED: "as_of_unsupported",
    BUDGET_EXCEEDED: "budget_exceeded",
    DEADLINE_EXCEEDED: "deadline_exceeded",
    EVENT_CONFLICT: "event_conflict",
    SESSION_LOCKED: "session_locked",
    SESSION_NOT_FOUND: "session_not_found",
    CLOSED: "closed",
    STALE_SESSION: "stale_session",
}


class RpcError(Exception):
    """A failure with a wire code. ``data`` must be JSON-encodable."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @property
    def name(self) -> str:
        return CODE_NAMES.get(self.code, f"code({self.code})")

    def __repr__(self) -> str:
        return f"RpcError({self.name}, {self.message!r})"


def invalid_params(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, message)


def is_session_not_found(exc: BaseException) -> bool:
    """True only for a session that was never written, never for a database fault."""
    return isinstance(exc, RpcError) and exc.code == SESSION_NOT_FOUND


def is_session_locked(exc: BaseException) -> bool:
    return isinstance(exc, RpcError) and exc.code == SESSION_LOCKED


def is_event_conflict(exc: BaseException) -> bool:
    return isinstance(exc, RpcError) and exc.code == EVENT_CONFLICT


def is_stale_session(exc: BaseException) -> bool:
    """An append whose ``expected_seq`` is no longer the session's last seq."""
    return isinstance(exc, RpcError) and exc.code == STALE_SESSION


def is_closed(exc: BaseException) -> bool:
    return isinstance(exc, RpcError) and exc.code == CLOSED
