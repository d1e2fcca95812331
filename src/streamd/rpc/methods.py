"""What a service registers and what its handlers see.

A service hands the server a method table (:data:`MethodTable`, names to
:class:`Method`: params type, handler, deadline, queued or not, what end of
input does). Each handler is given the decoded params and a
:class:`Request`, and through it the peer's :class:`Connection`: a small
context (send, notify, start a connection-scoped task, run a cleanup at
close), never the nursery itself. The Trio server
(:mod:`~streamd.rpc.server`) builds both; the frame rules are
:mod:`~streamd.rpc.protocol`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import trio

from streamd.rpc.framing import MAX_FRAME_BYTES
from streamd.rpc.held import Account
from streamd.rpc.outbox import Outbox
from streamd.rpc.protocol import RequestId, encode_notification

log = logging.getLogger("streamd.rpc")


Handler = Callable[[Any, "Request"], Awaitable[Any]]
Reply = Callable[[Any], None]
"""Answers a queued request: called once with its result, or an RpcError."""
Submit = Callable[[Any, Reply], "Awaitable[None] | None"]


@dataclass(frozen=True, slots=True)
class Method:
    """A wire method: its strict params type, its handler, and its deadline.

    ``deadline`` extracts the request's wall-clock deadline (Unix ns) from the
    decoded params, or None for methods that carry none.

    ``submit`` makes the method *queued*: for a request that cannot be
    cancelled once accepted (an append, which the log's writer commits
    whatever happens to its caller), the server calls ``submit(params, reply)``
    on the reading task instead of running ``handler`` in a task of its own,
    and ``reply`` encodes the answer when the work is done. ``submit`` must
    not block: it queues the work, or returns an awaitable that the server
    runs to completion, uncancelled, when it has to wait first (the log is not
    open yet). It must answer exactly the way ``handler`` would (``handler``
    stays the reference, for callers that await). No task, cancel scope or
    event per request: on the append path those were most of the event loop's
    time. ``deadline`` does not apply to a queued method: nothing could stop it.

    ``at_eof`` is what end of input does to a request of this method still in
    flight: ``"cancel"``, the reference's rule (Recall's methods: cancelled at
    once, answered -32007), or ``"finish"`` (the event log's): end of input
    only means no more requests, so it is answered as usual if it finishes
    within the server's ``eof_grace``, and cancelled (-32007) after that.

    ``bulk``: its answer may be large (a page of events, up to the reply
    budget). A connection computes only a few bulk answers at once, each once
    the answers its peer has not read yet are within the server's bound, so a
    peer that pipelines reads and never reads the answers holds a bounded
    number of them, not one per request in flight.
    """

    name: str
    params: type
    handler: Handler
    deadline: Callable[[Any], int | None] | None = None
    submit: Submit | None = None
    at_eof: Literal["cancel", "finish"] = "cancel"
    bulk: bool = False


MethodTable = Mapping[str, Method]


class Connection:
    """One peer. Handlers reach per-connection facilities through it."""

    def __init__(
        self, nursery: trio.Nursery, outbox: Outbox, account: Account | None = None
    ) -> None:
        self._nursery = nursery
        # Charged what unwritten_bytes counts (the daemon-wide bound).
        self._account = account
        self.closing = trio.Event()
        self.unwritten_bytes = 0
        """Bytes given to :meth:`send` and not yet written (or dropped for a peer
        that is gone): what this connection holds for a slow reader. A producer
        that must stay within a byte budget (a watch) waits on :meth:`progress`."""
        self._progress = trio.Event()
        self._outbox = outbox
        self._cleanups: list[Callable[[], Awaitable[None]]] = []

    async def notify(self, method: str, params: Any) -> None:
        await self.send(encode_notification(method, params))

    async def send(self, frame: bytes) -> None:
        self._unwritten(len(frame))
        try:
            await self._outbox.put(frame)
        except BaseException as exc:
            self.done_with(len(frame))  # not queued (cancelled, or no writer)
            if isinstance(exc, trio.ClosedResourceError | trio.BrokenResourceError):
                return  # the writer is gone (the peer hung up); nobody to tell
            raise

    def send_nowait(self, frame: bytes) -> None:
        """Queue ``frame`` without waiting for room: for answers whose number
        the in-flight bound already limits. Dropped once the connection is gone."""
        if self._outbox.put_nowait(frame):
            self._unwritten(len(frame))

    def done_with(self, size: int) -> None:
        """The writer wrote (or dropped) ``size`` bytes of queued frames."""
        self.unwritten_bytes -= size
        if self._account is not None:
            self._account.discharge(size)
        self._progress.set()
        self._progress = trio.Event()

    def _unwritten(self, size: int) -> None:
        self.unwritten_bytes += size
        if self._account is not None:
            self._account.charge(size)

    async def progress(self) -> None:
        """Wait until the writer next writes or drops something."""
        await self._progress.wait()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task that ends with this connection."""
        self._nursery.start_soon(fn, *args)

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` when the connection ends, however it ends."""
        self._cleanups.append(callback)

    async def run_cleanups(self) -> None:
        for callback in reversed(self._cleanups):
            try:
                with trio.CancelScope(shield=True):
                    await callback()
            except Exception:
                log.exception("connection cleanup failed")
        self._cleanups.clear()


@dataclass(slots=True)
class Request:
    # None for a request sent with "id": null (answered with id null).
    id: RequestId | None
    method: str
    connection: Connection
    scope: trio.CancelScope
    # Set when the peer asked for cancellation, so the answer says "canceled"
    # rather than "deadline exceeded".
    canceled: bool = False
    # What end of input does to it (Method.at_eof).
    finish_at_eof: bool = False
    # Why it was cancelled, when "context canceled" alone would not say.
    reason: str | None = None
    # The server's frame limit, which the answer must fit in.
    max_frame: int = MAX_FRAME_BYTES

    async def notify(self, method: str, params: Any) -> None:
        await self.connection.notify(method, params)
