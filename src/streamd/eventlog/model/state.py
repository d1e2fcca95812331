"""The state a session sees (app, user and session keys), as of any seq.

No I/O here, and no trio.
"""

from __future__ import annotations

from typing import Any

from streamd.eventlog.model.base import NonEmpty, Params, Result, Seq


class StateGetParams(Params, kw_only=True):
    """``user`` adds the user's state, ``session`` (which needs ``user``) the
    session's; ``as_of_seq`` reads the state as it was when that seq was the
    newest in the log (every write up to it, none after)."""

    app: NonEmpty
    user: NonEmpty | None = None
    session: NonEmpty | None = None
    as_of_seq: Seq | None = None

    def __post_init__(self) -> None:
        if self.session is not None and self.user is None:
            raise ValueError("state.get of a session needs its user")


class StateSnapshot(Result, kw_only=True):
    """The state of each scope asked for (null for a scope not asked for), and
    ``seq``: the newest seq the state reflects (the request's ``as_of_seq``, or
    the newest seq in the log when read if that is older)."""

    seq: int
    app: dict[str, Any]
    user: dict[str, Any] | None
    session: dict[str, Any] | None
