"""The log's refusals of an ADK write as the exceptions ADK callers catch.

ADK's own errors where ADK has one (``StaleSessionError``,
``SessionNotFoundError``), :class:`EventConflictError` where ADK has none:
a reused event id with other content (or in another session), which the log
refuses (``event_conflict``, -32010) and ADK's in-memory service would store as
a second event, and a
``ValueError`` for a value the log refuses to store (-32602).
"""

from __future__ import annotations

from google.adk.errors import StaleSessionError
from google.adk.errors.session_not_found_error import SessionNotFoundError

from streamd import errors
from streamd.errors import RpcError

__all__ = ["EventConflictError", "adk_error", "refuses_the_events", "stale_error"]

_STALE = (
    "The session has been modified in storage since it was loaded ({detail}). Reload it"
    " (get_session) before appending more events."
)


class EventConflictError(ValueError):
    """An event id that is already stored with other content, or in another
    session.

    Nothing was written: the log keeps one event per id, across every session,
    so a retry of the same event is safe (it is stored once) and a different
    event under a used id, or the same event appended to a second session, is
    refused. ``event_id`` is the id, ``seq`` where the stored one is. A
    ``ValueError``, as ADK's own write refusals are."""

    def __init__(self, message: str, *, event_id: str | None, seq: int | None) -> None:
        super().__init__(message)
        self.event_id = event_id
        self.seq = seq


def stale_error(detail: str) -> StaleSessionError:
    """ADK's stale-session error, saying what ADK's database service says, and
    ``detail``: what tells the copy from storage."""
    return StaleSessionError(_STALE.format(detail=detail))


# What says nothing of the events sent: the log could not store them now (a
# full disk, an I/O error, a write lock held past the busy timeout, a server
# gone: source_unavailable), or the call's outcome is unknown (the connection
# or the log closed under it; the daemon cancelled it as it stopped).
_NOT_A_REFUSAL = frozenset({errors.SOURCE_UNAVAILABLE, errors.CLOSED, errors.DEADLINE_EXCEEDED})


def refuses_the_events(exc: RpcError) -> bool:
    """Whether the answer to an append refuses what was sent: sent again, it
    would be refused again. Everything but :data:`_NOT_A_REFUSAL` is: not only
    the log's refusals (a stale copy, a session gone, an id taken, a value it
    cannot hold) but a request the client or the daemon refuses whole (a run
    over the frame limit, -32600) or an error nobody classified (-32603). Kept
    as unsendable, such a run was sent again by every drain, the session's
    later events queued behind it for ever, and every read of the service
    (which waits for the queues) raised it."""
    return exc.code not in _NOT_A_REFUSAL


def adk_error(exc: RpcError, session_id: str, expected: int | None) -> Exception:
    """The log's refusal of an append as the error ADK callers expect; any
    other error as it is."""
    data = exc.data if isinstance(exc.data, dict) else {}
    if errors.is_stale_session(exc):
        read_at = "?" if expected is None else expected
        return stale_error(f"read at seq {read_at}, storage at seq {data.get('last_seq', '?')}")
    if errors.is_session_not_found(exc):
        return SessionNotFoundError(f"Session {session_id} not found.")
    if errors.is_event_conflict(exc):
        event_id = data.get("event_id")
        # The log's answer cannot tell which: the same event appended to a
        # second session (a copied history) is refused as well, and was said
        # to have "other content" though it had the same.
        return EventConflictError(
            f"event {event_id!r} is already stored (seq {data.get('seq', '?')}), with other"
            " content or in another session: an event id names one event in the whole log,"
            " so a copy for another session needs an id of its own; nothing was written",
            event_id=event_id, seq=data.get("seq"),
        )
    if exc.code == errors.INVALID_PARAMS:
        # A value the log cannot store (an event or a state past its size
        # limit, text no database can hold): nothing was written. A
        # ValueError, as ADK's own write refusals are; it was the raw RpcError.
        return ValueError(exc.message)
    return exc
