"""The Trio layer of JSON-RPC: it moves bytes and owns tasks.

The rules this module owns (what a frame *is* is :mod:`~streamd.rpc.protocol`'s):

* One reader task feeds the :class:`~streamd.rpc.protocol.FrameReader`; every
  call becomes its own task in the connection's nursery, inside a
  ``CancelScope`` kept in the in-flight table by id. ``recall/cancel`` and
  ``$/cancelRequest`` cancel that scope, and the request is still answered:
  -32007 ``context canceled``. A request whose ``deadline`` passes answers
  -32007 ``context deadline exceeded``.
* A *queued* method (``Method.submit``: ``eventlog/append`` and
  ``eventlog/append_batch``) is a request that cannot be cancelled once
  accepted, since the log's writer commits it whatever happens to its caller.
  It gets no task and no scope: the reader decodes its params once, calls
  ``submit(params, reply)`` and goes on reading; ``reply``, called on the
  event loop when the work is done (after the commit), encodes the answer
  and queues it for the writer. A cancel notification for a queued request
  changes nothing: it is answered with its real outcome (written, or the
  error that kept it out), never -32007, since a "canceled" answer for an
  event that was committed would make the peer believe a lie. A queued
  request still counts against the in-flight bound until its reply, and end
  of input, shutdown and :meth:`Server.stop` wait for it like any request;
  if the peer is gone by then, its reply is dropped silently.
* One writer task owns the output stream, fed by the connection's outbox, so
  concurrent replies never interleave and a slow peer pushes back on whoever
  is producing (a watch stream, for instance) instead of growing a buffer
  without limit; the writer takes everything queued and writes it in one
  send, so the replies of one commit leave together. On a socket, a step
  that answers many connections at once (the event log's writer after a
  commit, :func:`~streamd.rpc.outbox.gathered`) writes each idle
  connection's frames itself, in one non-blocking write, and leaves the rest
  to the writer task: never while that task has frames or is writing. So is
  the answer of a connection's only request in flight (a client that waits
  for each answer); answers of pipelined requests go through the writer task.
* How many connections are served at once is :mod:`~streamd.rpc.limit`'s
  (``max_connections``); one past it is refused before a session starts.
* Work in flight is bounded per connection, in requests (``max_inflight``)
  and in bytes (``max_inflight_bytes``): what their params are estimated to
  take once decoded (:mod:`~streamd.rpc.footprint`), 24 times its frame for
  a frame of empty objects. A request counts from its dispatch until its
  answer is queued for the writer; while the connection is at a bound the
  reader stops reading (backpressure, not an error), and a request waits for
  room before its params are decoded, so a peer that pipelines faster than
  it is served, or does not read its answers, costs a bounded amount of
  memory. Params estimated past ``max_decoded`` are refused undecoded. Answers count too, errors
  included: while more than ``max_unwritten_bytes`` of them wait for a peer
  that does not read, no new request is dispatched or answered. The price:
  a cancel sent behind a full window waits for a slot like everything else,
  and a client must read its answers while it sends: one that writes all its
  requests before reading any stalls for good once 16 MiB of answers (about
  250,000 appends) wait for it, as it would on any socket whose peer stops
  reading. All connections together are held to ``max_held_bytes``
  (:mod:`~streamd.rpc.held`), where a connection past its share waits at the
  same points and one within it does not. A request of a *bulk*
  method (``Method.bulk``: a read whose answer can be megabytes) also waits,
  inside its cancel scope, for one of ``max_bulk`` slots of its connection
  and for the unwritten answers to be within that bound before it computes,
  and holds the slot until its answer is queued: without that, the requests
  already in flight (256) each computed their answer for a peer that read
  none of them (a gigabyte of pages of events).
* A bad frame is answered and skipped; only a broken stream ends the
  connection. Nothing a peer sends may end the connection or the process:
  a frame that fails in an unexpected way is answered -32603 (and logged),
  like a handler that does. Handlers raise :class:`~streamd.errors.RpcError`
  and never build error frames themselves.
* Handlers see a :class:`~streamd.rpc.methods.Request` and, through it, their
  :class:`~streamd.rpc.methods.Connection`:
  a small context (send, notify, start a connection-scoped task, run a
  cleanup at close), never the nursery itself.
* ``recall/shutdown`` stops reading, lets in-flight work finish (long-running
  requests see ``Connection.closing`` and wrap up), then answers ``{}`` as the
  last frame.
* End of input (EOF on stdin, or a socket peer's half-close) is decided per
  method (``Method.at_eof``). The reference cancels everything in flight, and
  Recall's methods keep that: cancelled at once, answered -32007. The event
  log's departs from it on purpose: end of input means "no more requests",
  not "forget the ones I sent", so ``echo REQUEST | streamd`` answers the
  request. Those requests are answered as usual if they finish within
  ``eof_grace`` (:data:`EOF_GRACE`, 10 s), long-running ones see
  ``Connection.closing`` and wrap up (a watch answers ``{last_seq}``), and
  whatever is still running after the grace is cancelled, answered -32007.
  Then the connection flushes and closes.
* :meth:`Server.stop` (a signal) stops reading on every connection and
  cancels Recall's requests in flight at once (-32007); the event log's get
  ``STOP_GRACE`` to wrap up as at a shutdown (a watch answers ``{last_seq}``).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from streamd import errors
from streamd.errors import RpcError
from streamd.rpc.bounds import (
    BULK_ANSWER_BYTES,
    MAX_BULK,
    MAX_INFLIGHT,
    MAX_INFLIGHT_BYTES,
    MAX_UNWRITTEN_BYTES,
)
from streamd.rpc.footprint import MAX_DECODED_BYTES
from streamd.rpc.framing import MAX_DEPTH, MAX_FRAME_BYTES, Oversized
from streamd.rpc.held import DEFAULT_MAX_HELD_BYTES, HeldBudget
from streamd.rpc.inflight import InFlight
from streamd.rpc.limit import MAX_CONNECTIONS, ConnectionLimit
from streamd.rpc.methods import Connection, Method, MethodTable, Request, Submit
from streamd.rpc.outbox import Outbox, gathered, socket_write_now
from streamd.rpc.protocol import (
    Call,
    Cancel,
    Fault,
    FrameReader,
    Ignored,
    RequestId,
    Shutdown,
    bind,
    encode_error,
    encode_result,
    error_frame,
    id_key,
    result_frame,
)
from streamd.rpc.queued import Queued, internal_error

log = logging.getLogger("streamd.rpc")

# How many encoded frames may wait for the writer before producers block.
OUTBOX_FRAMES = 1024
READ_CHUNK = 1 << 16
# After end of input: how long requests of methods that finish at EOF (the
# event log's) have to answer before they are cancelled too. Long enough for
# any ordinary request on a loaded machine (an append waits for one fsync),
# short enough that a forgotten pipe does not keep a process for long.
EOF_GRACE = 10.0
# At a stop (a signal): how long those requests have to wrap up.
STOP_GRACE = 0.5


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
        max_decoded: int = MAX_DECODED_BYTES,
        max_unwritten_bytes: int = MAX_UNWRITTEN_BYTES,
        max_bulk: int = MAX_BULK,
        max_connections: int = MAX_CONNECTIONS,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
        eof_grace: float = EOF_GRACE,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.make_methods = methods
        self.max_bulk = max_bulk
        self.limit: ConnectionLimit[_Session] = ConnectionLimit(max_connections)
        self.held = HeldBudget(max_held_bytes)
        self.max_frame = max_frame
        self.max_depth = max_depth
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes
        self.max_decoded = max_decoded
        self.max_unwritten_bytes = max_unwritten_bytes
        self.eof_grace = eof_grace
        self.wall_ns = wall_ns
        self._sessions: set[_Session] = set()
        self._stopping = False
        self._stopped = trio.Event()

    async def serve(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        session = _Session(self, receive, send)
        try:
            if not await self.limit.admit(session):
                await self.limit.refuse(send)
                return
            self._sessions.add(session)
            if self._stopping:
                session.stop()
            try:
                await session.run()
            finally:
                self.limit.left(session)
                self._sessions.discard(session)
                if self._stopping and not self._sessions:
                    self._stopped.set()
        finally:
            # However it ends, a wait for a slot cancelled included: an
            # account left open is a share taken from every other connection.
            session.account.close()

    def stop(self) -> None:
        """End every connection: stop reading, end the requests in flight
        (``_Session._stop_requests``), flush, close. New connections end the
        same way at once."""
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
        # Requests in flight, by id (a null id gets a key of its own): tasks,
        # which a cancel cancels, and queued requests, which it does not.
        self.inflight: dict[tuple[str, Any], Request | Queued] = {}
        self._null_ids = itertools.count()
        # Requests dispatched and not yet answered: the bound the reader waits on.
        self.account = server.held.open()
        self.in_flight = InFlight(server.max_inflight, server.max_inflight_bytes, self.account)
        self._bulk = trio.Semaphore(server.max_bulk)
        # Cancelled by stop(): the reader ends, and so does the grace that end
        # of input gives (a signal after end of input cuts it short), or a
        # shutdown's wait for the requests in flight.
        self._reading = trio.CancelScope()
        self._grace = trio.CancelScope()
        # What a gathered step writes directly counts as the writer's would.
        self.outbox = Outbox(
            OUTBOX_FRAMES, socket_write_now(send, lambda n: self.conn.done_with(n))
        )

    def stop(self) -> None:
        self._reading.cancel()
        self._grace.cancel()

    async def run(self) -> None:
        outbox = self.outbox
        async with self.send, trio.open_nursery() as writer_nursery:
            writer_nursery.start_soon(self._write, outbox)
            try:
                async with trio.open_nursery() as nursery:
                    conn = Connection(nursery, outbox, self.account)
                    self.conn = conn
                    self.methods = self.server.make_methods(conn)
                    try:
                        await self._read_loop(nursery)
                    finally:
                        conn.closing.set()
                        await self._drain_inflight()
                        await conn.run_cleanups()
                        # Background tasks (heartbeats, pollers) end with the connection.
                        nursery.cancel_scope.cancel()
            finally:
                # Ends the writer once it has flushed everything.
                outbox.close()

    async def _write(self, outbox: Outbox) -> None:
        broken = False
        while frames := await outbox.take():
            # Whatever is queued goes out in one write: the replies of one
            # commit, produced in one step of the event loop, in one send. A
            # lone frame (a watch's whole batch) goes as it is, uncopied.
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            del frames
            if broken:
                self.conn.done_with(len(data))
                continue
            try:
                await self.send.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("output stream broke: %s", exc)
                broken = True
            self.conn.done_with(len(data))
            del data

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        shutdown = None
        try:
            with self._reading:
                shutdown = await self._read_frames(nursery)
        finally:
            self.server.limit.input_ended(self)
        if shutdown is not None:
            # Outside the reading scope: a stop during it must not leave the
            # shutdown unanswered, as it did when the wait was inside.
            await self._shutdown(shutdown.id)
            return
        if self._reading.cancel_called:  # stop()
            await self._stop_requests()
        else:
            await self._end_of_input()

    async def _end_of_input(self) -> None:
        """No more requests: cancel those whose method says so, let the others
        finish within the grace, then cancel what is left."""
        grace = self.server.eof_grace
        self._grace.deadline = min(self._grace.deadline, trio.current_time() + grace)
        if not await self._wind_down(self._grace):
            stopped = self._reading.cancel_called  # a signal cut the grace short
            self._cancel_all(
                reason=None if stopped else "context canceled: end of input, and it did"
                f" not finish within the {grace:g} s grace"
            )

    async def _read_frames(self, nursery: trio.Nursery) -> Shutdown | None:
        """Read and handle frames until end of input (None) or a shutdown."""
        server = self.server
        reader = FrameReader(server.max_frame, server.max_depth, server.max_decoded)
        pending = 0  # the reader's unfinished frame, charged (an 8 MiB one grows a read at a time)
        while True:
            await self.account.wait_room(1)  # past its share, back-pressure (rpc/held)
            try:
                data = await self.receive.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("input stream broke: %s", exc)
                data = b""
            frames = reader.feed(data) if data else reader.close()
            self.account.charge(reader.pending - pending)
            pending = reader.pending
            # Popped one by one, so no finished frame stays referenced here
            # while the reader waits for room or for input.
            frames.reverse()
            while frames:
                shutdown = await self._on_frame_guarded(reader, frames.pop(), nursery)
                if shutdown is not None:
                    return shutdown
            if not data:
                return None

    async def _on_frame_guarded(
        self, reader: FrameReader, frame: bytes | Oversized, nursery: trio.Nursery
    ) -> Shutdown | None:
        """Handle one frame; a shutdown, to stop reading and answer, is returned."""
        try:
            event = reader.event(frame)
            del frame
            match event:
                case Call():
                    await self._dispatch(event, nursery)
                case Cancel(id=request_id):
                    self._cancel(request_id)
                case Shutdown():
                    return event
                case Fault(id=request_id, error=err):
                    await self._reply_error(request_id, err)
                case Ignored(why=why):
                    log.debug("ignoring %s", why)
        except Exception:
            log.exception("unexpected failure handling a frame")
            await self._reply_error(
                None, RpcError(errors.INTERNAL_ERROR, "internal error while handling a frame")
            )
        return None

    def _cancel(self, request_id: RequestId) -> None:
        request = self.inflight.get(id_key(request_id))
        # A queued request cannot be cancelled: it is answered with its outcome.
        if isinstance(request, Request):
            request.canceled = True
            request.scope.cancel()

    async def _dispatch(self, call: Call, nursery: trio.Nursery) -> None:
        # Room first: a request waiting for it holds its frame, not the
        # decoded params that may be 24 times larger.
        await self.in_flight.wait_room(call.held)
        await self._answers_read(call.held)
        try:
            method, params = bind(call, self.methods)
        except RpcError as exc:
            await self._reply_error(call.id, exc)
            return
        except Exception as exc:
            # Not the peer's doing (the first eventlog/* call imports the log's
            # methods, which fails with EMFILE while connections hold every
            # descriptor), but its id was read: answered here, not by the
            # frame's guard with id null, which left its client waiting.
            log.exception("looking up %.256s failed", call.method)  # a name may be 8 MiB
            await self._reply_error(call.id, internal_error(exc))
            return
        self.in_flight.admit(call.held)
        key = ("null", next(self._null_ids)) if call.id is None else id_key(call.id)
        if key in self.inflight:
            self.in_flight.release(call.held)
            await self._reply_error(
                call.id,
                RpcError(errors.INVALID_REQUEST, f"request id {call.id!r} is already in flight"),
            )
            return
        if method.submit is not None:
            queued = Queued(self, call.id, key, method.name, call.held, self.server.max_frame)
            self._submit(method.submit, params, queued)
            return
        scope = trio.CancelScope(deadline=self._deadline(method, params))
        request = Request(call.id, method.name, self.conn, scope,
                          finish_at_eof=method.at_eof == "finish", max_frame=self.server.max_frame)
        self.inflight[key] = request
        nursery.start_soon(self._run_request, request, key, method, params, call.held)

    def _deadline(self, method: Method, params: Any) -> float:
        if method.deadline is None:
            return math.inf
        wall = method.deadline(params)
        if wall is None:
            return math.inf
        return trio.current_time() + (wall - self.server.wall_ns()) / 1e9

    async def _run_request(
        self, request: Request, key: tuple[str, Any], method: Method, params: Any, size: int
    ) -> None:
        reserved = 0  # a bulk slot's, when it has one
        try:
            frame: bytes | None = None
            try:
                with request.scope:
                    if method.bulk:
                        reserved = await self._bulk_slot()
                    frame = result_frame(
                        request.id, await method.handler(params, request), self.server.max_frame
                    )
                if frame is None:
                    reason = request.reason or (
                        "context canceled" if request.canceled else "context deadline exceeded"
                    )
                    frame = encode_error(request.id, RpcError(errors.DEADLINE_EXCEEDED, reason))
            except RpcError as exc:
                frame = error_frame(request.id, exc, self.server.max_frame)
            except Exception as exc:
                log.exception("%s failed", request.method)
                frame = error_frame(request.id, internal_error(exc), self.server.max_frame)
            finally:
                del self.inflight[key]
            # The answer may wait for the writer; the request's params (and the
            # frame bytes a Raw member holds) need not wait with it.
            del params
            if self.in_flight.requests == 1 and self.outbox.writes_now:
                # The only request in flight: a client that waits for each
                # answer (ADK's session service, a Recall core through
                # attach), and the writer task idle: the answer leaves at
                # once, sparing the task's wake-up and its turns of the loop.
                # With more in flight they go through the writer task, which
                # joins what one step answered into one write (see Outbox),
                # and a busy writer task keeps the outbox's bound.
                with gathered():
                    self.conn.send_nowait(frame)
            else:
                await self.conn.send(frame)
        finally:
            if reserved:
                self._bulk.release()
                self.account.discharge(reserved)
            self.in_flight.release(size)

    async def _bulk_slot(self) -> int:
        """A slot to compute a bulk answer in, once the peer has read enough of
        the answers before it (see the module docstring), and the bytes reserved
        for the answer (at most a share: one holding nothing goes at once)."""
        try:  # a free slot costs no checkpoint: a deadline already past still lets
            self._bulk.acquire_nowait()  # a search answer "skipped" before it, as the reference
        except trio.WouldBlock:
            await self._bulk.acquire()
        reserve = max(1, min(BULK_ANSWER_BYTES, self.account.share()))
        try:
            await self._answers_read(reserve)
        except BaseException:
            self._bulk.release()
            raise
        self.account.charge(reserve)
        return reserve

    async def _answers_read(self, size: int = 0) -> None:
        """Once the answers the peer has not read are within the bound, and
        ``size`` bytes more are within the daemon-wide one (:mod:`~streamd.rpc.held`)."""
        while True:
            if self.conn.unwritten_bytes > self.server.max_unwritten_bytes:
                await self.conn.progress()  # the peer is not reading its answers
            elif not self.account.fits(size):
                await self.account.wait_room(size)
            else:
                return

    def _submit(self, submit: Submit, params: Any, reply: Queued) -> None:
        """Hand a queued request to its method, which answers through ``reply``."""
        self.inflight[reply.key] = reply
        try:
            later = submit(params, reply)
        except RpcError as exc:
            reply(exc)
            return
        except Exception as exc:
            log.exception("%s failed", reply.method)
            reply(internal_error(exc))
            return
        if later is not None:
            self.conn.start_soon(self._submit_later, later, reply)

    async def _submit_later(self, later: Awaitable[None], reply: Queued) -> None:
        """Finish a submit that had to wait before it could queue (the log was
        not open yet). Only a cancellation of the whole connection reaches it,
        and then nothing was queued."""
        try:
            await later
        except RpcError as exc:
            reply(exc)
        except Exception as exc:
            log.exception("%s failed", reply.method)
            reply(internal_error(exc))
        except BaseException:
            reply(RpcError(errors.DEADLINE_EXCEEDED, "context canceled"))
            raise

    async def _stop_requests(self) -> None:
        """A stop (a signal): the event log's requests wrap up as at a shutdown,
        within ``STOP_GRACE`` (a watch answers the last seq its client resumes
        from, not a cancel it could take for its own); the rest get -32007."""
        await self._wind_down(trio.move_on_after(STOP_GRACE))
        self._cancel_all()

    async def _wind_down(self, scope: trio.CancelScope) -> bool:
        """Cancel what does not finish at end of input; whether the rest did in ``scope``."""
        self._cancel_all(finishing=False)
        self.conn.closing.set()
        with scope:
            await self.in_flight.idle.wait()
        return self.in_flight.idle.is_set()

    def _cancel_all(self, *, finishing: bool = True, reason: str | None = None) -> None:
        """Cancel the requests in flight (with ``finishing=False``, only those
        whose method does not finish at end of input)."""
        for request in self.inflight.values():
            if not isinstance(request, Request) or request.scope.cancel_called:
                continue  # queued (never cancelled), or already on its way out
            if finishing or not request.finish_at_eof:
                request.canceled = True
                request.reason = reason
                request.scope.cancel()

    async def _drain_inflight(self) -> None:
        await self.in_flight.idle.wait()

    async def _shutdown(self, request_id: RequestId | None) -> None:
        self.conn.closing.set()
        with self._grace:  # a stop cuts the wait short, as at end of input
            await self._drain_inflight()
        if not self.in_flight.idle.is_set():
            await self._stop_requests()
            await self._drain_inflight()
        await self.conn.run_cleanups()
        # The acknowledgement is the last frame this connection writes.
        await self.conn.send(encode_result(request_id, {}))

    async def _reply_error(self, request_id: RequestId | None, err: RpcError) -> None:
        # A peer's mistake is routine for a server, not a warning: at the
        # default level a misbehaving client must not fill the log.
        log.debug("answering %s: %s", err.name, err.message)
        # An error counts against the unwritten bound like any answer: one can
        # echo most of its frame (msgspec names an unknown field, key and all),
        # and the outbox's bound is in frames, so a peer sending 8 MiB keys and
        # reading nothing held 1,024 such answers: 8 GiB.
        await self._answers_read()
        await self.conn.send(error_frame(request_id, err, self.server.max_frame))

