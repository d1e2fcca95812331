"""JSON-RPC 2.0 over a byte stream, on Trio.

The rules this module owns:

* One reader task decodes frames; every request becomes its own task in the
  connection's nursery, inside a ``CancelScope`` kept in the in-flight table
  by id. ``recall/cancel`` and ``$/cancelRequest`` cancel that scope, and the
  request is still answered: -32007 ``context canceled``. A request whose
  ``deadline`` passes answers -32007 ``context deadline exceeded``.
* One writer task owns the output stream, fed by a bounded memory channel,
  so concurrent replies never interleave and a slow peer pushes back on
  whoever is producing (a watch stream, for instance) instead of growing a
  buffer without limit.
* A bad frame is answered and skipped; only a broken stream ends the
  connection. Handlers raise :class:`~streamd.errors.RpcError` and never
  build error frames themselves.
* ``recall/shutdown`` stops reading, lets in-flight work finish (long-running
  requests see ``Connection.closing`` and wrap up), then answers ``{}`` as the
  last frame. End of input cancels in-flight work, which is still answered.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from . import errors
from .errors import RpcError
from .framing import MAX_FRAME_BYTES, LineSplitter, Oversized
from .gofmt import quote

log = logging.getLogger("streamd.rpc")

RequestId = int | float | str

SHUTDOWN_METHOD = "recall/shutdown"
CANCEL_METHODS = frozenset({"recall/cancel", "$/cancelRequest"})

# How many encoded frames may wait for the writer before producers block.
OUTBOX_FRAMES = 1024
READ_CHUNK = 1 << 16


class Envelope(msgspec.Struct):
    """Any frame, decoded just far enough to route it."""

    jsonrpc: str | None = None
    id: RequestId | None = None
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw(b"null")
    # An empty Raw means the member was absent (a present null is b"null").
    result: msgspec.Raw = msgspec.Raw()
    error: msgspec.Raw = msgspec.Raw()


class CancelParams(msgspec.Struct, forbid_unknown_fields=True):
    id: RequestId


class EmptyParams(msgspec.Struct, forbid_unknown_fields=True):
    """``recall/shutdown`` takes ``{}`` (or null)."""


Handler = Callable[[Any, "Request"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Method:
    """A wire method: its strict params type, its handler, and its deadline.

    ``deadline`` extracts the request's wall-clock deadline (Unix ns) from the
    decoded params, or None for methods that carry none.
    """

    name: str
    params: type
    handler: Handler
    deadline: Callable[[Any], int | None] | None = None


_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(Envelope)


def encode_result(request_id: RequestId | None, result: Any) -> bytes:
    return b"".join(
        (b'{"jsonrpc":"2.0","id":', _encoder.encode(request_id), b',"result":',
         _encoder.encode(result), b"}\n")
    )


def encode_error(request_id: RequestId | None, err: RpcError) -> bytes:
    body: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        body["data"] = err.data
    return b"".join(
        (b'{"jsonrpc":"2.0","id":', _encoder.encode(request_id), b',"error":',
         _encoder.encode(body), b"}\n")
    )


def encode_notification(method: str, params: Any) -> bytes:
    return b"".join(
        (b'{"jsonrpc":"2.0","method":', _encoder.encode(method), b',"params":',
         _encoder.encode(params), b"}\n")
    )


def _id_key(request_id: RequestId) -> tuple[str, RequestId]:
    # 1 and "1" are different ids; 1 and 1.0 are the same number.
    return ("s", request_id) if isinstance(request_id, str) else ("n", request_id)


class Connection:
    """One peer. Handlers reach per-connection facilities through it."""

    def __init__(self, nursery: trio.Nursery, outbox: trio.MemorySendChannel[bytes]) -> None:
        self.nursery = nursery
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
        self.unwritten_bytes += len(frame)
        try:
            await self._outbox.send(frame)
        except BaseException as exc:
            self.done_with(len(frame))  # not queued (cancelled, or no writer)
            if isinstance(exc, trio.ClosedResourceError | trio.BrokenResourceError):
                return  # the writer is gone (the peer hung up); nobody to tell
            raise

    def done_with(self, size: int) -> None:
        """The writer wrote (or dropped) ``size`` bytes of queued frames."""
        self.unwritten_bytes -= size
        self._progress.set()
        self._progress = trio.Event()

    async def progress(self) -> None:
        """Wait until the writer next writes or drops something."""
        await self._progress.wait()

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
    id: RequestId
    method: str
    connection: Connection
    scope: trio.CancelScope
    # Set when the peer asked for cancellation, so the answer says "canceled"
    # rather than "deadline exceeded".
    canceled: bool = False

    async def notify(self, method: str, params: Any) -> None:
        await self.connection.notify(method, params)


MethodTable = Mapping[str, Method]


class Server:
    """Serves one connection. ``wall_ns`` is injectable so deadline tests can
    run on Trio's mock clock."""

    def __init__(
        self,
        methods: Callable[[Connection], MethodTable],
        *,
        max_frame: int = MAX_FRAME_BYTES,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._make_methods = methods
        self._max_frame = max_frame
        self._wall_ns = wall_ns

    async def serve(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        session = _Session(self, receive, send)
        await session.run()


class _Session:
    def __init__(
        self, server: Server, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream
    ) -> None:
        self.server = server
        self.receive = receive
        self.send = send
        self.inflight: dict[tuple[str, RequestId], Request] = {}
        self.idle = trio.Event()
        self.idle.set()

    async def run(self) -> None:
        outbox_send, outbox_receive = trio.open_memory_channel[bytes](OUTBOX_FRAMES)
        async with self.send, trio.open_nursery() as writer_nursery:
            writer_nursery.start_soon(self._write, outbox_receive)
            # Closing outbox_send ends the writer once it has flushed everything.
            async with outbox_send, trio.open_nursery() as nursery:
                conn = Connection(nursery, outbox_send)
                self.conn = conn
                self.methods = self.server._make_methods(conn)
                try:
                    await self._read_loop(nursery)
                finally:
                    conn.closing.set()
                    await self._drain_inflight()
                    await conn.run_cleanups()
                    # Background tasks (heartbeats, pollers) end with the connection.
                    nursery.cancel_scope.cancel()

    async def _write(self, outbox: trio.MemoryReceiveChannel[bytes]) -> None:
        broken = False
        async for frame in outbox:
            if broken:
                self.conn.done_with(len(frame))
                continue
            batch = [frame]
            # Coalesce whatever is already queued into one write.
            while True:
                try:
                    batch.append(outbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            data = b"".join(batch)
            try:
                await self.send.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.warning("output stream broke: %s", exc)
                broken = True
            self.conn.done_with(len(data))

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        splitter = LineSplitter(self.server._max_frame)
        while True:
            try:
                data = await self.receive.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.warning("input stream broke: %s", exc)
                data = b""
            frames = splitter.feed(data) if data else splitter.close()
            for frame in frames:
                if await self._on_frame(frame, nursery):
                    return
            if not data:
                self._cancel_all()
                return

    async def _on_frame(self, frame: bytes | Oversized, nursery: trio.Nursery) -> bool:
        """Handle one frame; True means stop reading (shutdown)."""
        if isinstance(frame, Oversized):
            await self._reply_error(
                None,
                RpcError(
                    errors.INVALID_REQUEST,
                    f"frame of {frame.size} bytes exceeds the {self.server._max_frame} byte limit",
                ),
            )
            return False
        if not frame.strip():
            return False
        try:
            env = _envelope_decoder.decode(frame)
        except msgspec.ValidationError as exc:
            await self._reply_error(None, RpcError(errors.INVALID_REQUEST, f"invalid frame: {exc}"))
            return False
        except msgspec.DecodeError as exc:
            await self._reply_error(None, RpcError(errors.PARSE_ERROR, f"parse error: {exc}"))
            return False
        if env.jsonrpc != "2.0":
            err = RpcError(errors.INVALID_REQUEST, 'jsonrpc must be "2.0"')
            await self._reply_error(env.id, err)
            return False
        if env.method is None:
            if env.id is not None and (env.result or env.error):
                # A response: this server issues no requests, so nothing awaits it.
                return False
            await self._reply_error(
                env.id, RpcError(errors.INVALID_REQUEST, "frame has neither a method nor an id")
            )
            return False
        if env.result or env.error:
            await self._reply_error(
                env.id, RpcError(errors.INVALID_REQUEST, "a request carries no result or error")
            )
            return False
        if env.id is None:
            self._on_notification(env)
            return False
        if env.method == SHUTDOWN_METHOD:
            return await self._shutdown(env)
        await self._dispatch(env, nursery)
        return False

    def _on_notification(self, env: Envelope) -> None:
        if env.method not in CANCEL_METHODS:
            log.info("ignoring notification %s", env.method)
            return
        try:
            params = msgspec.json.decode(env.params, type=CancelParams)
        except msgspec.DecodeError as exc:
            log.warning("ignoring malformed %s: %s", env.method, exc)
            return
        request = self.inflight.get(_id_key(params.id))
        if request is not None:
            request.canceled = True
            request.scope.cancel()

    async def _dispatch(self, env: Envelope, nursery: trio.Nursery) -> None:
        assert env.id is not None and env.method is not None
        method = self.methods.get(env.method)
        if method is None:
            await self._reply_error(
                env.id, RpcError(errors.METHOD_NOT_FOUND, f"unknown method {quote(env.method)}")
            )
            return
        try:
            params = msgspec.json.decode(env.params, type=method.params)
        except msgspec.DecodeError as exc:
            await self._reply_error(
                env.id, RpcError(errors.INVALID_PARAMS, f"{env.method} params: {exc}")
            )
            return
        except RpcError as exc:
            # Struct __post_init__ validation raises RpcError with its own words.
            await self._reply_error(env.id, exc)
            return
        key = _id_key(env.id)
        if key in self.inflight:
            await self._reply_error(
                env.id,
                RpcError(errors.INVALID_REQUEST, f"request id {env.id!r} is already in flight"),
            )
            return
        scope = trio.CancelScope(deadline=self._deadline(method, params))
        request = Request(env.id, env.method, self.conn, scope)
        self.inflight[key] = request
        self.idle = trio.Event()
        nursery.start_soon(self._run_request, request, method, params)

    def _deadline(self, method: Method, params: Any) -> float:
        if method.deadline is None:
            return math.inf
        wall = method.deadline(params)
        if wall is None:
            return math.inf
        return trio.current_time() + (wall - self.server._wall_ns()) / 1e9

    async def _run_request(self, request: Request, method: Method, params: Any) -> None:
        frame: bytes | None = None
        try:
            with request.scope:
                result = await method.handler(params, request)
                frame = encode_result(request.id, result)
            if frame is None:
                reason = "context canceled" if request.canceled else "context deadline exceeded"
                frame = encode_error(request.id, RpcError(errors.DEADLINE_EXCEEDED, reason))
        except RpcError as exc:
            frame = encode_error(request.id, exc)
        except Exception as exc:
            log.exception("%s failed", request.method)
            frame = encode_error(request.id, RpcError(errors.INTERNAL_ERROR, str(exc) or repr(exc)))
        finally:
            del self.inflight[_id_key(request.id)]
            if not self.inflight:
                self.idle.set()
        await self.conn.send(frame)

    def _cancel_all(self) -> None:
        for request in self.inflight.values():
            request.canceled = True
            request.scope.cancel()

    async def _drain_inflight(self) -> None:
        await self.idle.wait()

    async def _shutdown(self, env: Envelope) -> bool:
        try:
            msgspec.json.decode(env.params, type=EmptyParams | None)
        except msgspec.DecodeError as exc:
            await self._reply_error(
                env.id, RpcError(errors.INVALID_PARAMS, f"{SHUTDOWN_METHOD} params: {exc}")
            )
            return False
        self.conn.closing.set()
        await self._drain_inflight()
        await self.conn.run_cleanups()
        # The acknowledgement is the last frame this connection writes.
        await self.conn.send(encode_result(env.id, {}))
        return True

    async def _reply_error(self, request_id: RequestId | None, err: RpcError) -> None:
        log.warning("answering %s: %s", err.name, err.message)
        await self.conn.send(encode_error(request_id, err))
