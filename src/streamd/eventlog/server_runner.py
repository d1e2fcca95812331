"""A server backend's store as the Trio layer drives it: one worker thread per
call, one call at a time per connection, and a cancel that reaches the server.

PostgreSQL's and MySQL's stores are synchronous (their drivers' blocking APIs:
see :mod:`~streamd.eventlog.postgres.runner` for why), so each call runs on a
worker thread while Trio waits. A call cancelled by Trio is not abandoned: its
statement is cancelled on the server (:meth:`ServerStore.cancel_running`) and
the call returns, so the next one never meets a connection still busy with the
last. A server that does not answer at all (its backend stopped, the network
partitioned) is not waited out either: a cancelled or interrupted call still
running ``grace_s`` after the cancel request was sent has its connection cut
(:meth:`ServerStore.sever`), so it returns at once with an error saying a write
in flight may or may not have committed, and close never hangs on the database.
The cancel request has a thread of the cancels' own, never one of Trio's
default limiter, which the rest of the process shares
(:mod:`~streamd.eventlog.cancels`).

A call cancelled while it is inside the driver's connect (reconnecting; a
server that accepts and never answers holds it for the whole connect timeout)
has no statement to cancel and no connection to cut: it is cut there at once
(:meth:`ServerStore.cut_if_connecting`: the connection the connect makes is
closed unused, so nothing the call was to write is written, see
:mod:`~streamd.eventlog.store.reconnecting`) and the cancel is answered
without waiting for it. So is a call that a cut has not ended within another
grace. Such a call's thread runs on to its end meanwhile, and the connection
stays taken until it does: the next call waits for it as for any call before it.
Close does not wait for a call left in a connect beyond the grace (a connect with
no timeout may never return); it closes the store under it.

A close has one deadline, one grace after it began (or after a stop said it
was coming, :meth:`ServerRunner.expect_close`), and every wait of it keeps to
that deadline: the cut of a cancelled call, the cut after the close's
interrupt, the close waiting for the connection. A server that stops
answering keeps every connection busy at once; each wait giving it a grace of
its own had a stop take one grace per busy connection, one after the other
(a stopped daemon with a read and an append in flight took 5 s; now 2 s).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import outcome
import trio

from streamd.eventlog import cancels
from streamd.eventlog.store.reconnecting import Backoff

__all__ = ["ServerRunner", "ServerStore"]

_T = TypeVar("_T")


class ServerStore(Protocol):
    """What the runner needs of a server backend's store (a
    :class:`~streamd.eventlog.store.backend.Backend` besides)."""

    def cancel_running(self) -> None:
        """Ask the server to cancel the statement running now, if any; blocks
        until the request was delivered."""
        ...

    def sever(self) -> None:
        """Cut the connection under the call using it; never blocks. A call
        still connecting is cut when its connect returns."""
        ...

    def cut_if_connecting(self) -> bool:
        """If the call running now is in the driver's connect, cut it there
        (it then writes nothing) and return True; else do nothing."""
        ...

    def interrupt(self) -> None:
        """For close: every later call fails with ``closed``; never blocks (the
        statement running, if any, is the runner's to cancel)."""
        ...

    def close(self) -> None: ...

    @property
    def attempts(self) -> Backoff:
        """Its connection's attempts: the last one's error while the server
        cannot be reached, and when attempts last failed and succeeded."""
        ...


class ServerRunner:
    """A server backend's store opened for the Trio layer (a
    :class:`~streamd.eventlog.store.backend.Runner`)."""

    def __init__(self, store: ServerStore, grace_s: float, where: str = "database server") -> None:
        self._store = store
        self._where = where  # the database in words, never its password
        self._limiter = trio.CapacityLimiter(1)
        self._grace = grace_s
        self._idle = threading.Event()  # no call on the worker thread now
        self._idle.set()
        self._cut_at: float | None = None
        """The close's deadline (Trio's clock), once a close is coming."""
        self._on_free: list[Callable[[], object]] = []

    @property
    def store(self) -> ServerStore:
        return self._store

    @property
    def busy(self) -> bool:
        """Whether a call holds the connection now: one its caller has left
        may (its thread runs on to its end, see the module docstring)."""
        return self._limiter.borrowed_tokens > 0

    def on_free(self, wake: Callable[[], object]) -> None:
        """Have ``wake`` called (on the Trio thread) each time a call gives
        the connection back: one its caller left does so when its thread
        ends, with nobody waiting for it."""
        self._on_free.append(wake)

    async def run(self, op: Callable[[Any], _T]) -> _T:
        """``op(store)`` on a worker thread. Cancelled while it runs, the
        statement is cancelled on the server, the call is waited for (it
        returns promptly then), and Cancelled is raised. A server that has not
        answered within the grace (``unresponsive_s``) has the connection cut
        under the call, which then returns at once."""
        # The connection is taken until both the call's thread and this task
        # are done with it: the thread can outlast run() (a cancelled call
        # left to end, see the module docstring), and a cancel request this
        # task sends must never reach the next call's statement.
        call = object()
        await self._limiter.acquire_on_behalf_of(call)
        holders = 2
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome[_T]] = []

        def let_go() -> None:  # on the Trio thread only
            nonlocal holders
            holders -= 1
            if holders == 0:
                self._limiter.release_on_behalf_of(call)
                for wake in self._on_free:
                    wake()

        def finish() -> None:
            done.set()
            let_go()

        def deliver(result: outcome.Outcome[_T]) -> None:
            box.append(result)
            self._idle.set()
            try:
                token.run_sync_soon(finish)
            except trio.RunFinishedError:
                pass  # a call left to end outlived the run: nobody waits for it

        self._idle.clear()
        try:
            trio.lowlevel.start_thread_soon(lambda: op(self._store), deliver)
        except BaseException:
            self._idle.set()
            self._limiter.release_on_behalf_of(call)
            raise
        try:
            return await self._wait(done, box)
        finally:
            let_go()

    async def _wait(self, done: trio.Event, box: list[outcome.Outcome[_T]]) -> _T:
        """The call's answer; a cancel reaches it as the module docstring says."""
        try:
            await done.wait()
        except trio.Cancelled:
            if self._store.cut_if_connecting():
                # Nothing to cancel on the server, and nothing it could write:
                # the connection its connect makes is closed unused.
                raise
            with trio.CancelScope(shield=True):
                settled = False  # True once no cancel request is on its way
                with trio.move_on_at(self._cut_by()):
                    # Sent, or not at all while too many earlier ones wait
                    # for a server that does not answer (see cancels).
                    await cancels.send(self._store.cancel_running, self._where)
                    settled = True
                    await done.wait()
                if not done.is_set() or not settled:
                    # No answer, or a cancel request still on its way (it
                    # could hit the next statement): this connection is done.
                    self._store.sever()
                    with trio.move_on_at(self._cut_by()):
                        await done.wait()
            raise
        return box[0].unwrap()

    def _cut_by(self) -> float:
        """When a cancelled call that has not ended is cut: one grace from
        now, or at the close's deadline if that comes first."""
        soon = trio.current_time() + self._grace
        return soon if self._cut_at is None else min(soon, self._cut_at)

    def expect_close(self) -> float:
        """A close is coming (a stop began): its deadline, one grace from now
        (from the first time it was said, by a stop or the close itself).
        Nothing is cancelled or refused yet; a call cancelled meanwhile is cut
        by that deadline at the latest, as is one the close interrupts."""
        if self._cut_at is None:
            self._cut_at = trio.current_time() + self._grace
        return self._cut_at

    def interrupt(self) -> None:
        """For close (on the Trio thread): every later call fails with
        ``closed``, and the running statement (if any) is cancelled, from a
        thread nobody waits for, so the event loop never waits on the network
        (:func:`~streamd.eventlog.cancels.send_unwaited`); a call still
        running at the close's deadline has its connection cut
        (:meth:`ServerStore.sever`)."""
        left = max(0.0, self.expect_close() - trio.current_time())
        self._store.interrupt()
        if not self._idle.is_set():
            cancels.send_unwaited(self._store.cancel_running, self._where)
            threading.Thread(target=self._sever_unless_idle, args=(left,),
                             name="streamd-pg-sever", daemon=True).start()

    def _sever_unless_idle(self, wait_s: float) -> None:
        if not self._idle.wait(wait_s):
            self._store.sever()

    async def aclose(self) -> None:
        """Close the store once no call uses its connection. A call left
        inside the driver's connect is not waited for beyond the close's
        deadline: with no connect timeout (``connect_timeout=0``) its connect
        may never return, and closing needs nothing of it (what the connect
        makes is closed unused once it finds the store closed). A call running
        a statement is waited for: :meth:`interrupt` and the cut end it."""
        acquired = False
        with trio.move_on_at(self.expect_close()):
            await self._limiter.acquire()
            acquired = True
        if not acquired and not self._store.cut_if_connecting():
            await self._limiter.acquire()
            acquired = True
        try:
            await trio.to_thread.run_sync(self._store.close)
        finally:
            if acquired:
                self._limiter.release()
