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
* Work in flight is bounded per connection, in requests (``max_inflight``)
  and in bytes of their frames (``max_inflight_bytes``). A request counts
  from its dispatch until its answer is queued for the writer; while the
  connection is at a bound the reader stops reading (backpressure, not an
  error), so a peer that pipelines faster than it is served, or does not read
  its answers, costs a bounded amount of memory. The price: a cancel sent
  behind a full window waits for a slot like everything else.
* A bad frame is answered and skipped; only a broken stream ends the
  connection. Nothing a peer sends may end the connection or the process:
  a frame that fails in an unexpected way is answered -32603 (and logged),
  like a handler that does. Handlers raise :class:`~streamd.errors.RpcError`
  and never build error frames themselves.
* What counts as a request: a JSON object with a ``method``; with an ``id``
  (of any JSON-RPC type, null included: that request is answered with id null
  and cannot be cancelled) it is answered, without one it is a notification.
  A batch (a JSON array) is refused with one -32600, id null.
* ``recall/shutdown`` stops reading, lets in-flight work finish (long-running
  requests see ``Connection.closing`` and wrap up), then answers ``{}`` as the
  last frame. End of input cancels in-flight work, which is still answered;
  :meth:`Server.stop` (a signal) does the same to every connection.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import trio
from msgspec import UNSET, UnsetType

from . import errors
from .errors import RpcError
from .framing import MAX_DEPTH, MAX_FRAME_BYTES, LineSplitter, Oversized, nests_deeper_than
from .gofmt import quote

log = logging.getLogger("streamd.rpc")

RequestId = int | float | str

SHUTDOWN_METHOD = "recall/shutdown"
CANCEL_METHODS = frozenset({"recall/cancel", "$/cancelRequest"})

# How many encoded frames may wait for the writer before producers block.
OUTBOX_FRAMES = 1024
READ_CHUNK = 1 << 16
# Per connection: requests dispatched and not yet answered, and the bytes of
# their frames. 64 MiB is eight frames of the largest size.
MAX_INFLIGHT = 256
MAX_INFLIGHT_BYTES = 64 << 20
# Integer ids must fit the 64-bit integers peers decode them into (Go's int,
# most JSON-RPC clients), or the answer could not be matched to its request.
_INT64 = range(-(1 << 63), 1 << 63)
# A method name is echoed in the error; a megabyte of it need not be.
_QUOTED_METHOD_CHARS = 256


class Envelope(msgspec.Struct):
    """Any frame, decoded just far enough to route it."""

    jsonrpc: str | None = None
    # UNSET: the member was absent (a notification); None: a present null.
    id: RequestId | UnsetType | None = UNSET
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
_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_well_formed = msgspec.json.Decoder(msgspec.Raw)

# A \uD800-\uDBFF escape (preceded by an even run of backslashes, so it is an
# escape) not followed by a \uDC00-\uDFFF one. msgspec calls some of these
# "Input data was truncated", which sends the peer looking for a short write.
_LONE_HIGH_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


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


def _error_frame(request_id: RequestId | None, err: RpcError) -> bytes:
    try:
        return encode_error(request_id, err)
    except Exception:
        # A handler's error data (or a message holding a lone surrogate) that
        # JSON cannot carry must still produce an answer.
        log.exception("cannot encode %r", err)
        message = f"{err.name}: the error could not be encoded"
        return encode_error(request_id, RpcError(errors.INTERNAL_ERROR, message))


def _parse_error(frame: bytes, exc: Exception) -> RpcError:
    if isinstance(exc, UnicodeDecodeError):
        message = "a string is not valid UTF-8"
    else:
        message = str(exc)
        if message == "Input data was truncated" and _LONE_HIGH_SURROGATE.search(frame):
            message = (
                "a \\u escape of a high surrogate (D800-DBFF) is not followed by "
                "a \\u escape of a low surrogate (DC00-DFFF)"
            )
    return RpcError(errors.PARSE_ERROR, f"parse error: {message}")


def _invalid_frame(frame: bytes, exc: msgspec.ValidationError) -> RpcError:
    """The envelope did not fit; say whether it was JSON at all, or a batch."""
    # msgspec stops at the first member of the wrong type; JSON-RPC wants a
    # parse error for any frame that is not JSON, wherever the fault is.
    try:
        _well_formed.decode(frame)
        frame.decode("utf-8")
    except (msgspec.DecodeError, UnicodeDecodeError) as fault:
        return _parse_error(frame, fault)
    if frame.lstrip()[:1] == b"[":
        if not _batch_decoder.decode(frame):
            return RpcError(errors.INVALID_REQUEST, "invalid request: an empty batch")
        return RpcError(
            errors.INVALID_REQUEST,
            "batch requests are not supported: send each request as its own line",
        )
    return RpcError(errors.INVALID_REQUEST, f"invalid frame: {exc}")


def _decode_params(method: str, raw: msgspec.Raw, params_type: Any) -> Any:
    try:
        return msgspec.json.decode(raw, type=params_type)
    except msgspec.DecodeError as exc:
        raise RpcError(errors.INVALID_PARAMS, f"{method} params: {exc}") from None
    except UnicodeDecodeError:
        raise RpcError(
            errors.INVALID_PARAMS, f"{method} params: a string is not valid UTF-8"
        ) from None


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
    # None for a request sent with "id": null (answered with id null).
    id: RequestId | None
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
    """Serves connections, each with its own method table. ``wall_ns`` is
    injectable so deadline tests can run on Trio's mock clock."""

    def __init__(
        self,
        methods: Callable[[Connection], MethodTable],
        *,
        max_frame: int = MAX_FRAME_BYTES,
        max_depth: int = MAX_DEPTH,
        max_inflight: int = MAX_INFLIGHT,
        max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._make_methods = methods
        self._max_frame = max_frame
        self._max_depth = max_depth
        self._max_inflight = max_inflight
        self._max_inflight_bytes = max_inflight_bytes
        self._wall_ns = wall_ns
        self._sessions: set[_Session] = set()
        self._stopping = False
        self._stopped = trio.Event()

    async def serve(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        session = _Session(self, receive, send)
        self._sessions.add(session)
        if self._stopping:
            session.stop()
        try:
            await session.run()
        finally:
            self._sessions.discard(session)
            if self._stopping and not self._sessions:
                self._stopped.set()

    def stop(self) -> None:
        """End every connection as end of input would: stop reading, cancel the
        requests in flight (each still answered -32007), flush, close. New
        connections end the same way at once."""
        self._stopping = True
        for session in list(self._sessions):
            session.stop()
        if not self._sessions:
            self._stopped.set()

    async def wait_stopped(self) -> None:
        """Return once :meth:`stop` was called and every connection has ended."""
        await self._stopped.wait()


class _Session:
    def __init__(
        self, server: Server, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream
    ) -> None:
        self.server = server
        self.receive = receive
        self.send = send
        # Requests that can be cancelled, by id (a null id gets a key of its own).
        self.inflight: dict[tuple[str, Any], Request] = {}
        self._null_ids = itertools.count()
        # Requests dispatched and not yet answered, and their frames' bytes:
        # the bounds the reader waits on.
        self.pending = 0
        self.pending_bytes = 0
        self.idle = trio.Event()
        self.idle.set()
        self._room = trio.Event()
        # Cancelled by stop(): the reader ends as at end of input.
        self._reading = trio.CancelScope()

    def stop(self) -> None:
        self._reading.cancel()

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
            del batch, frame
            try:
                await self.send.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("output stream broke: %s", exc)
                broken = True
            self.conn.done_with(len(data))
            del data

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        with self._reading:
            if await self._read_frames(nursery):
                return  # shutdown: in-flight work already finished
        self._cancel_all()

    async def _read_frames(self, nursery: trio.Nursery) -> bool:
        """Read and handle frames until end of input (False) or shutdown (True)."""
        splitter = LineSplitter(self.server._max_frame)
        while True:
            try:
                data = await self.receive.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("input stream broke: %s", exc)
                data = b""
            frames = splitter.feed(data) if data else splitter.close()
            # Popped one by one, so no finished frame stays referenced here
            # while the reader waits for room or for input.
            frames.reverse()
            while frames:
                if await self._on_frame_guarded(frames.pop(), nursery):
                    return True
            if not data:
                return False

    async def _on_frame_guarded(self, frame: bytes | Oversized, nursery: trio.Nursery) -> bool:
        try:
            return await self._on_frame(frame, nursery)
        except Exception:
            log.exception("unexpected failure handling a frame")
            await self._reply_error(
                None, RpcError(errors.INTERNAL_ERROR, "internal error while handling a frame")
            )
            return False

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
        size = len(frame)
        env = self._decode_envelope(frame)
        if isinstance(env, RpcError):
            await self._reply_error(None, env)
            return False
        reply_id = None if env.id is UNSET else env.id
        if env.jsonrpc != "2.0":
            err = RpcError(errors.INVALID_REQUEST, 'jsonrpc must be "2.0"')
            await self._reply_error(reply_id, err)
            return False
        if env.method is None:
            if env.result or env.error:
                # A response: this server issues no requests, so nothing awaits
                # it; and answering it could start an endless exchange of errors.
                return False
            await self._reply_error(
                reply_id, RpcError(errors.INVALID_REQUEST, "frame has neither a method nor an id")
            )
            return False
        if env.result or env.error:
            await self._reply_error(
                reply_id, RpcError(errors.INVALID_REQUEST, "a request carries no result or error")
            )
            return False
        if env.id is UNSET:
            self._on_notification(env)
            return False
        if env.method == SHUTDOWN_METHOD:
            return await self._shutdown(env, reply_id)
        await self._dispatch(env, reply_id, size, nursery)
        return False

    def _decode_envelope(self, frame: bytes) -> Envelope | RpcError:
        if nests_deeper_than(frame, self.server._max_depth):
            return RpcError(
                errors.INVALID_REQUEST,
                f"frame nests arrays and objects more than {self.server._max_depth} levels deep",
            )
        try:
            env = _envelope_decoder.decode(frame)
        except msgspec.ValidationError as exc:
            return _invalid_frame(frame, exc)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            return _parse_error(frame, exc)
        if isinstance(env.id, int) and env.id not in _INT64:
            return RpcError(
                errors.INVALID_REQUEST, "invalid frame: an integer id must fit in 64 bits"
            )
        return env

    def _on_notification(self, env: Envelope) -> None:
        if env.method not in CANCEL_METHODS:
            log.debug("ignoring notification %s", env.method)
            return
        try:
            params = _decode_params(env.method, env.params, CancelParams)
        except RpcError as exc:
            log.debug("ignoring malformed %s: %s", env.method, exc.message)
            return
        request = self.inflight.get(_id_key(params.id))
        if request is not None:
            request.canceled = True
            request.scope.cancel()

    async def _dispatch(
        self, env: Envelope, request_id: RequestId | None, size: int, nursery: trio.Nursery
    ) -> None:
        assert env.method is not None
        method = self.methods.get(env.method)
        if method is None:
            name = env.method
            if len(name) > _QUOTED_METHOD_CHARS:
                name = name[:_QUOTED_METHOD_CHARS] + "..."
            await self._reply_error(
                request_id, RpcError(errors.METHOD_NOT_FOUND, f"unknown method {quote(name)}")
            )
            return
        try:
            # Struct __post_init__ validation raises RpcError with its own words.
            params = _decode_params(env.method, env.params, method.params)
        except RpcError as exc:
            await self._reply_error(request_id, exc)
            return
        await self._admit(size)
        key = ("null", next(self._null_ids)) if request_id is None else _id_key(request_id)
        if key in self.inflight:
            self._release(size)
            await self._reply_error(
                request_id,
                RpcError(errors.INVALID_REQUEST, f"request id {request_id!r} is already in flight"),
            )
            return
        scope = trio.CancelScope(deadline=self._deadline(method, params))
        request = Request(request_id, method.name, self.conn, scope)
        self.inflight[key] = request
        nursery.start_soon(self._run_request, request, key, method, params, size)

    async def _admit(self, size: int) -> None:
        """Wait (not reading meanwhile) until a request of ``size`` bytes fits."""
        server = self.server
        while self.pending and (
            self.pending >= server._max_inflight
            or self.pending_bytes + size > server._max_inflight_bytes
        ):
            self._room = trio.Event()
            await self._room.wait()
        self.pending += 1
        self.pending_bytes += size
        if self.idle.is_set():
            self.idle = trio.Event()

    def _release(self, size: int) -> None:
        self.pending -= 1
        self.pending_bytes -= size
        self._room.set()
        if not self.pending:
            self.idle.set()

    def _deadline(self, method: Method, params: Any) -> float:
        if method.deadline is None:
            return math.inf
        wall = method.deadline(params)
        if wall is None:
            return math.inf
        return trio.current_time() + (wall - self.server._wall_ns()) / 1e9

    async def _run_request(
        self, request: Request, key: tuple[str, Any], method: Method, params: Any, size: int
    ) -> None:
        try:
            frame: bytes | None = None
            try:
                with request.scope:
                    frame = encode_result(request.id, await method.handler(params, request))
                if frame is None:
                    reason = "context canceled" if request.canceled else "context deadline exceeded"
                    frame = encode_error(request.id, RpcError(errors.DEADLINE_EXCEEDED, reason))
            except RpcError as exc:
                frame = _error_frame(request.id, exc)
            except Exception as exc:
                log.exception("%s failed", request.method)
                frame = _error_frame(
                    request.id, RpcError(errors.INTERNAL_ERROR, str(exc) or repr(exc))
                )
            finally:
                del self.inflight[key]
            # The answer may wait for the writer; the request's params (and the
            # frame bytes a Raw member holds) need not wait with it.
            del params
            await self.conn.send(frame)
        finally:
            self._release(size)

    def _cancel_all(self) -> None:
        for request in self.inflight.values():
            request.canceled = True
            request.scope.cancel()

    async def _drain_inflight(self) -> None:
        await self.idle.wait()

    async def _shutdown(self, env: Envelope, request_id: RequestId | None) -> bool:
        try:
            _decode_params(SHUTDOWN_METHOD, env.params, EmptyParams | None)
        except RpcError as exc:
            await self._reply_error(request_id, exc)
            return False
        self.conn.closing.set()
        await self._drain_inflight()
        await self.conn.run_cleanups()
        # The acknowledgement is the last frame this connection writes.
        await self.conn.send(encode_result(request_id, {}))
        return True

    async def _reply_error(self, request_id: RequestId | None, err: RpcError) -> None:
        # A peer's mistake is routine for a server, not a warning: at the
        # default level a misbehaving client must not fill the log.
        log.debug("answering %s: %s", err.name, err.message)
        await self.conn.send(_error_frame(request_id, err))
