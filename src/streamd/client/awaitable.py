"""The event-loop clients' methods, written once.

The asyncio and Trio clients differ in how they move bytes and wait; what a
method sends and how an answer cut by the reply budget is continued is the
same for both, so both inherit it from :class:`AwaitableCalls`, which needs
only their ``call``.
"""

from __future__ import annotations

import datetime as _dt
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from streamd.client import calls
from streamd.client.protocol import Call
from streamd.eventlog.model import SessionWithEvents

P = ParamSpec("P")
T = TypeVar("T")


def _bound(
    builder: Callable[P, Call[T]],
) -> Callable[Concatenate[AwaitableCalls, P], Coroutine[Any, Any, T]]:
    @functools.wraps(builder)
    async def method(self: AwaitableCalls, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.call(builder(*args, **kwargs))

    return method


class AwaitableCalls:
    async def call(self, call: Call[T]) -> T:
        raise NotImplementedError

    append = _bound(calls.append)
    append_batch = _bound(calls.append_batch)
    since = _bound(calls.since)
    latest_seq = _bound(calls.latest_seq)
    branches = _bound(calls.branches)
    create_session = _bound(calls.create_session)
    get_sessions = _bound(calls.get_sessions)
    list_sessions = _bound(calls.list_sessions)
    delete_session = _bound(calls.delete_session)
    get_state = _bound(calls.get_state)
    record_boot = _bound(calls.record_boot)
    update_boot = _bound(calls.update_boot)
    recent_boots = _bound(calls.recent_boots)
    ping = _bound(calls.ping)
    set_retention = _bound(calls.set_retention)
    retention = _bound(calls.retention)
    compact = _bound(calls.compact)

    async def get_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        after_seq: int = 0,
        recent: int | None = None,
        after_time: _dt.datetime | None = None,
        scoped_state: bool = False,
    ) -> SessionWithEvents:
        """The session with its events, whole (an answer cut by the reply
        budget is continued)."""
        call: Call[SessionWithEvents] | None = calls.get_session(
            app, user, session, after_seq=after_seq, recent=recent, after_time=after_time,
            scoped_state=scoped_state,
        )
        whole = calls.SessionAssembler(call)
        while call is not None:
            call = whole.feed(await self.call(call))
        assert whole.result is not None
        return whole.result
