"""A connection made on a worker thread for a caller that may stop waiting.

A driver's connect cannot be interrupted, and a server that accepts a
connection and never answers it holds the connect for the whole connect
timeout (psycopg's 130 s, or for ever with MySQL's client, when the address
says ``connect_timeout=0``). A caller that waited for it (a close, a Ctrl-C,
a client's cancel) waited as long. :func:`made_on_thread` lets the caller
leave at once: the connect goes on on its thread, and what it makes is closed
there when it is made, since nobody is left to take it. Whichever of the two
comes second, the connect's end or the caller's leaving, closes it: a
connection is never left open, and never closed while its thread still uses
it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

__all__ = ["made_on_thread"]

_C = TypeVar("_C")


async def made_on_thread(make: Callable[[], _C], close: Callable[[_C], None]) -> _C:
    """``make()`` on a worker thread; cancelled (or interrupted), the caller
    returns at once and ``close`` is called on what ``make`` returns, when it
    does. ``make``'s error is the caller's, if it still waits."""
    handoff = _Handoff(make, close)
    try:
        return await trio.to_thread.run_sync(handoff.make, abandon_on_cancel=True)
    except BaseException:
        handoff.leave()
        raise


class _Handoff(Generic[_C]):
    def __init__(self, make: Callable[[], _C], close: Callable[[_C], None]) -> None:
        self._make, self._close = make, close
        self._lock = threading.Lock()
        self._made: list[_C] = []  # made, and not yet taken by the caller
        self._left = False

    def make(self) -> _C:
        """On the thread: the value, closed here if the caller has left."""
        made = self._make()
        with self._lock:
            if not self._left:
                self._made.append(made)
                return made
        self._close(made)
        return made

    def leave(self) -> None:
        """The caller stops waiting: a value already made is closed here."""
        with self._lock:
            self._left = True
            made, self._made = self._made, []
        for value in made:
            self._close(value)
