"""The log's opens of connections, each a task of the log's nursery.

Opening a connection can take long: a server that accepts and never answers
holds a connect for its whole connect timeout (for ever with
``connect_timeout=0``). An open ran in the task of the call that needed it,
shielded (a connection half opened when its caller was cancelled would be one
nobody closes), so that call could not be cancelled, nor could the stop
waiting for it; and the close waited for the open, so a daemon's stop and a
Ctrl-C of ``streamd log`` waited for the connect. Here an open is a task of its
own (:class:`Opens`), still shielded and never left half done: the callers
that need it wait for it, and one cancelled leaves at once while the open
goes on. :class:`Shared` is one such open shared by everyone who needs it
(the log's first connections, the scans' connection): one attempt, and its
outcome is every waiter's.

A close does not wait out a connect: it tells the opener to give up first
(:meth:`~streamd.eventlog.opener.Opener.abandon`: a server backend's connect
is left to its thread, which closes what it makes), then waits for the opens
to end (:meth:`Opens.ended`). Each open checks, once it has its connection,
whether the log closed meanwhile, and closes that connection if it did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import trio

from streamd.eventlog.store import closed_error

__all__ = ["Opens", "Shared"]

_T = TypeVar("_T")


class Opens:
    """The opens running now, as tasks of the log's nursery."""

    def __init__(self) -> None:
        self._running = 0
        self._none = trio.Event()
        self._none.set()

    def start(self, nursery: trio.Nursery, open_: Callable[[], Awaitable[None]]) -> None:
        """Run ``open_`` (which raises nothing) as a task of ``nursery``,
        shielded: only the opener's own abandonment ends it early."""
        if self._none.is_set():
            self._none = trio.Event()
        self._running += 1
        nursery.start_soon(self._run, open_)

    async def _run(self, open_: Callable[[], Awaitable[None]]) -> None:
        try:
            with trio.CancelScope(shield=True):
                await open_()
        finally:
            self._running -= 1
            if self._running == 0:
                self._none.set()

    async def ended(self) -> None:
        """Until no open runs (for a close, which starts none)."""
        while not self._none.is_set():
            await self._none.wait()


class Shared(Generic[_T]):
    """One open at a time of one thing, whose outcome is every waiter's.

    ``open_`` opens and keeps what it opened (or closes it, the log being
    closed), then returns it. Calls that come while it runs wait for it, not
    for an attempt of their own: a failed attempt fails them all, and the next
    call makes the next attempt."""

    def __init__(self, opens: Opens, open_: Callable[[], Awaitable[_T]]) -> None:
        self._opens = opens
        self._open = open_
        self._attempt: _Attempt[_T] | None = None

    async def get(self, nursery: trio.Nursery) -> _T:
        """What the attempt under way opens (one started in ``nursery`` if
        none is); its error is raised. Cancelled, it returns at once."""
        attempt = self._attempt
        if attempt is None:
            attempt = self._attempt = _Attempt()
            self._opens.start(nursery, lambda: self._run(attempt))
        await attempt.done.wait()
        if attempt.error is not None:
            raise attempt.error
        if attempt.value is None:
            raise closed_error()  # the open was interrupted, as only a dying log's is
        return attempt.value[0]

    async def _run(self, attempt: _Attempt[_T]) -> None:
        try:
            attempt.value = (await self._open(),)
        except Exception as exc:  # the waiters' to raise
            attempt.error = exc
        finally:
            self._attempt = None
            attempt.done.set()


class _Attempt(Generic[_T]):
    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: tuple[_T] | None = None
        self.error: Exception | None = None
