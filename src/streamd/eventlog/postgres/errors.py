"""What a PostgreSQL fault says to a client: one ``source_unavailable`` error per
kind of fault, each naming the database by its scrubbed description (never its
password) and, for a write that may have been in flight, that retrying an append
with the same event id is safe.

Which kind a driver error is needs the connection's state, so the decision stays
with :class:`~streamd.eventlog.postgres.store.PostgresStore`; the words live here.
"""

from __future__ import annotations

from streamd.errors import SOURCE_UNAVAILABLE, RpcError

__all__ = ["cannot_connect", "connection_lost", "database_error", "unresponsive"]

_RETRY_IS_SAFE = (
    "A write in flight may or may not have committed; retrying an append with the"
    " same event id is safe (it answers duplicate if it had)"
)


def unresponsive(where: str) -> RpcError:
    """The server stopped answering (not even a cancel request), so the
    connection was cut with a call in flight."""
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"the event log's {where} did not answer (not even a request to cancel), so its"
        f" connection was cut. {_RETRY_IS_SAFE}",
        {"postgres_error": "unresponsive"},
    )


def connection_lost(where: str, detail: str, state: str) -> RpcError:
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"lost the connection to the event log's {where}: {detail}. {_RETRY_IS_SAFE}",
        {"postgres_error": state},
    )


def cannot_connect(where: str, detail: str, state: str) -> RpcError:
    return RpcError(
        SOURCE_UNAVAILABLE,
        f"cannot connect to the event log's {where}: {detail}",
        {"postgres_error": state},
    )


def database_error(detail: str, state: str) -> RpcError:
    return RpcError(
        SOURCE_UNAVAILABLE, f"event log database error: {detail}", {"postgres_error": state}
    )
