"""The ADK service's clients: the one it was given, or one per event loop.

ADK calls a session service from more than one event loop: ``Runner.run``
runs each turn on a loop of its own, in a thread. A client belongs to the
loop that opened it, so the service opens one per loop, at the loop's first
call: the daemon's (:class:`~streamd.client.AsyncClient`, the resident daemon
started if none answers) or, given a database, the log in this process
(:class:`~streamd.client.local.LocalClient`). The clients of loops that have
ended are dropped as the next one opens.

A daemon outlives no upgrade and may be stopped or restarted under an agent
that runs for days, so a daemon client this module opened whose connection has
ended is replaced at the next call (starting the daemon again if none answers),
and :meth:`LoopClients.lost` tells the service when a call failed for that
reason and may be made again. A client the caller gave is the caller's: it is
never replaced.

Closed (:meth:`LoopClients.close`, the service's close), every loop's client
is closed, each on its own loop, and none is opened again: a call that found
its client closed under it used to connect anew, and held that connection
(or the file) open past the close.

A child forked from the process starts with none of the parent's clients
(each would refuse it, ``forked``) and opens its own as the parent would; the
parent's are kept aside, never closed there (:mod:`streamd.forks`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Sequence

from streamd import errors, forks
from streamd.adk.lifetime import service_closed
from streamd.client.asyncio_client import AsyncClient
from streamd.client.local import LocalClient
from streamd.errors import RpcError
from streamd.eventlog.store.backend import Synchronous

__all__ = ["Client", "LoopClients"]

log = logging.getLogger("streamd.adk")

Client = AsyncClient | LocalClient
"""The daemon's client, or the log in this process (the same methods)."""


class LoopClients:
    """The client of each event loop a service is used on (see the module
    docstring), or the one client it was given. Thread-safe: each loop runs in
    a thread of its own."""

    def __init__(
        self,
        given: Client | None,
        *,
        database: str | os.PathLike[str] | None,
        synchronous: Synchronous,
        runtime_dir: str | None,
        start_daemon: bool,
        daemon_args: Sequence[str],
        start_timeout: float,
    ) -> None:
        self._given = given
        self._database = database
        self._synchronous: Synchronous = synchronous
        self._runtime_dir = runtime_dir
        self._start_daemon = start_daemon
        self._daemon_args = daemon_args
        self._start_timeout = start_timeout
        self._owned: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._closed = False  # for good: nothing opens after
        self._parents: list[object] = []
        """In a forked child: what was the parent's, kept from its finalizers."""
        forks.in_child(self, LoopClients._forked)

    async def get(self) -> Client:
        """The running loop's client, opened at its first call; refused
        once closed."""
        if self._closed:
            raise service_closed()
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._owned.get(loop)
            if client is not None and not _ended(client):
                return client
            opening = self._opening.setdefault(loop, asyncio.Lock())
        async with opening:
            with self._lock:
                client = self._owned.get(loop)
                if client is not None and _ended(client):
                    del self._owned[loop]
                    ended, client = client, None
                else:
                    ended = None
            if ended is not None:
                await ended.aclose()
            if client is None:
                self._forget_ended_loops()
                client = await self._open()
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._owned[loop] = client
                if closed:  # while it opened (a close on another loop)
                    await client.aclose()
                    raise service_closed()
        return client

    async def lost(self, client: Client, exc: RpcError) -> bool:
        """Whether ``exc``, raised by a call on ``client``, says the daemon's
        connection ended under the call (the daemon stopped or restarted), on
        a client this module opened: then it is dropped, and the next
        :meth:`get` connects anew. The call's outcome is unknown; only a call
        that is safe to make twice may be made again."""
        if exc.code != errors.CLOSED or self._given is not None or self._closed:
            return False
        if not isinstance(client, AsyncClient):
            return False  # the log in this process does not go away under it
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._owned.get(loop) is client:
                del self._owned[loop]
        await client.aclose()
        return True

    async def close(self, grace: float) -> None:
        """Close every client this module opened, for good (one given is
        the caller's to close), and open none after. Each closes on its own
        loop: the running loop's here, a running one's there (waited for at
        most ``grace`` seconds), an idle one's when it runs again, its
        daemon connection hung up at once from here (an in-process log's let
        go of at once: no thread runs that loop); those of loops
        that have ended let go as they would at the next open."""
        here = asyncio.get_running_loop()
        with self._lock:
            self._closed = True
            owned = list(self._owned.items())
            self._owned.clear()
            self._opening.clear()
        closing: list[asyncio.Future[None]] = []
        for loop, client in owned:
            if loop is here:
                closing.append(asyncio.ensure_future(client.aclose()))
            elif isinstance(client, LocalClient) and not loop.is_running():
                client.abandon()  # its loop has ended, or no thread runs it
            elif not loop.is_closed():
                if isinstance(client, AsyncClient) and not loop.is_running():
                    # Idle (run turn by turn): its connection ends now; the
                    # close queued below lets go of the rest when it runs.
                    client.hang_up()
                try:
                    there = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                except RuntimeError:
                    continue  # closed meanwhile: its transport goes with it
                if loop.is_running():
                    closing.append(asyncio.wrap_future(there))
            # A daemon client of an ended loop: its socket closes with its
            # transport, collected (nothing can run on that loop).
        if closing:
            await asyncio.wait(closing, timeout=grace)
        for each in closing:
            # Read, or asyncio reports it unread: a client whose close failed
            # (its connection broke under it) is let go of all the same, and
            # the service is closed; one still closing is read when it ends.
            if each.done():
                _close_failed(each)
            else:
                each.add_done_callback(_close_failed)

    def _forked(self) -> None:
        """In a forked child (see the module docstring). Kept, not dropped:
        dropping the last reference to a client would run its finalizer
        inside the fork."""
        self._lock = threading.Lock()
        self._parents.append((self._owned, self._opening))
        self._owned = weakref.WeakKeyDictionary()
        self._opening = weakref.WeakKeyDictionary()

    async def _open(self) -> Client:
        if self._database is not None:
            return await LocalClient.open(self._database, synchronous=self._synchronous)
        return await AsyncClient.connect(
            self._runtime_dir,
            start_daemon=self._start_daemon,
            daemon_args=self._daemon_args,
            start_timeout=self._start_timeout,
        )

    def _forget_ended_loops(self) -> None:
        """Drop the clients of event loops that have ended: a client holding
        its loop (the daemon's, through its transport) would keep both, and
        their socket or file, for ever. A local client lets go of its file here
        (closed with the last of that loop's clients of it); a daemon client's
        socket closes with its transport, collected."""
        with self._lock:
            ended = [loop for loop in self._owned if loop.is_closed()]
            gone = [self._owned.pop(loop) for loop in ended]
            for loop in ended:
                self._opening.pop(loop, None)
        for client in gone:
            if isinstance(client, LocalClient):
                client.abandon()


def _close_failed(closed: asyncio.Future[None]) -> None:
    if not closed.cancelled() and (exc := closed.exception()) is not None:
        log.warning("closing a StreamdSessionService's client failed (let go of): %s", exc)


def _ended(client: Client) -> bool:
    """A daemon client whose connection has ended (see the module docstring)."""
    return isinstance(client, AsyncClient) and client.closed
