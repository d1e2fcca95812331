"""A queued request (``Method.submit``) in its connection's in-flight table,
and the ``reply`` its method calls when the work is done.

It answers once, however often it is called (a method that replies twice
must not answer twice), and only then frees the request's slot in the
connection's bounds: the reply is queued for the writer without waiting
(:meth:`~streamd.rpc.methods.Connection.send_nowait`), since it is called on
the event loop by code that cannot wait (the log's writer, after a commit).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from streamd import errors
from streamd.errors import RpcError
from streamd.rpc.inflight import InFlight
from streamd.rpc.methods import Connection
from streamd.rpc.protocol import RequestId, error_frame, result_frame

__all__ = ["Queued", "internal_error"]

log = logging.getLogger("streamd.rpc")


def internal_error(exc: Exception) -> RpcError:
    """A failure of ours (not the peer's) as the -32603 that answers its request."""
    return RpcError(errors.INTERNAL_ERROR, str(exc) or repr(exc))


class Session(Protocol):
    """What a queued request needs of its connection's session."""

    inflight: dict[tuple[str, Any], Any]
    conn: Connection
    in_flight: InFlight


class Queued:
    """A queued request in the in-flight table, and the ``reply`` its method's
    ``submit`` calls: it answers once, and frees the request's slot."""

    __slots__ = ("answered", "id", "key", "max_frame", "method", "session", "size")

    def __init__(
        self, session: Session, request_id: RequestId | None, key: Any, method: str, size: int,
        max_frame: int,
    ) -> None:
        self.session = session
        self.id = request_id
        self.key = key
        self.method = method
        self.size = size
        self.max_frame = max_frame
        self.answered = False

    def __call__(self, outcome: Any) -> None:
        if self.answered:
            return
        self.answered = True
        session = self.session
        del session.inflight[self.key]
        if isinstance(outcome, RpcError):
            frame = error_frame(self.id, outcome, self.max_frame)
        else:
            try:
                frame = result_frame(self.id, outcome, self.max_frame)
            except Exception as exc:
                log.exception("%s failed", self.method)
                frame = error_frame(self.id, internal_error(exc), self.max_frame)
        session.conn.send_nowait(frame)
        session.in_flight.release(self.size)
