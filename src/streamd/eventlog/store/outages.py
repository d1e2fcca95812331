"""What a database server's fault says to a client, for every server backend:
one ``source_unavailable`` error per kind of fault, each naming the database by
its description (never its password) and, for a write that may have been in
flight, that retrying an append with the same event id is safe. ``data`` is the
backend's own detail (its driver's error code), under a key of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from streamd.errors import SOURCE_UNAVAILABLE, RpcError

__all__ = [
    "RETRY_IS_SAFE", "cannot_connect", "cannot_set_up", "connection_lost", "database_error",
    "scrub", "unresponsive",
]

RETRY_IS_SAFE = (
    "If the call was a write, it may or may not have committed; retrying an append"
    " with the same event id is safe (it answers duplicate if it had)"
)


def scrub(message: str, secrets: Sequence[str]) -> str:
    """``message`` with every secret replaced (drivers do not quote passwords,
    but a message built from a malformed address could), on one line: libpq
    adds a tab-indented hint line, and a CLI error or a log entry is one line."""
    for s in secrets:
        if s:
            message = message.replace(s, "***")
    return re.sub(r"\s*\n\s*", " ", message.strip())


def unresponsive(where: str, data: dict[str, Any]) -> RpcError:
    """The server stopped answering (not even a cancel request), so the
    connection was cut with a call in flight."""
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"the event log's {where} did not answer (not even a request to cancel), so its"
        f" connection was cut. {RETRY_IS_SAFE}",
        data,
    )


def connection_lost(where: str, detail: str, data: dict[str, Any]) -> RpcError:
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"lost the connection to the event log's {where}: {detail}. {RETRY_IS_SAFE}",
        data,
    )


def cannot_connect(where: str, detail: str, data: dict[str, Any]) -> RpcError:
    return RpcError(
        SOURCE_UNAVAILABLE, f"cannot connect to the event log's {where}: {detail}", data
    )


def cannot_set_up(where: str, detail: str, data: dict[str, Any]) -> RpcError:
    """The server took the connection and then refused the open's own work
    (reading the schema's version, creating or migrating it): said so, since
    "cannot connect" sends an operator to the network and the credentials
    rather than to the grant the first writer needs (``CREATE``)."""
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"connected to the event log's {where}, but could not check or set up its"
        f" schema: {detail}",
        data,
    )


def database_error(detail: str, data: dict[str, Any]) -> RpcError:
    return RpcError(SOURCE_UNAVAILABLE, f"event log database error: {detail}", data)
