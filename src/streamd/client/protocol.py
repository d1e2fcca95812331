"""The protocol core every client shares: bytes in, events out, no I/O.

A :class:`ClientProtocol` is one connection's JSON-RPC state as a client sees it:
which requests are in flight and what each answer decodes to, the watches and the
entries they have buffered, and how each frame that arrives is classified. The
clients (:mod:`.sync`, and :mod:`.asyncio_client` and :mod:`.trio_client`
on the shell of :mod:`.awaitable`) move bytes and wake
waiters; every rule lives here, tested without an event loop
(``tests/client/test_protocol.py``). Its rules:

* **A call is typed at the start.** :meth:`ClientProtocol.start` takes a
  :class:`Call` (method, params Struct, result type) and returns the request's
  id and frame; the answer is decoded into that type when it arrives, and a
  result that does not fit the type is a failure of that call, never of the
  connection.
* **Cancelling is telling the daemon.** :meth:`ClientProtocol.cancel` returns
  the ``$/cancelRequest`` frame and marks the call abandoned: its answer
  (-32007, or the result if the daemon finished first) is read and dropped.
  The request counts as :attr:`ClientProtocol.in_flight` until that answer
  arrives, so a client can tell the daemon has let go.
* **A watch is bounded in bytes.** Entries arrive as ``eventlog/entry``
  notifications and wait in the watch's buffer until taken; a consumer that
  leaves more than ``budget`` bytes there ends its watch with
  ``budget_exceeded`` naming the seq to resume from (the last entry it took),
  the watch is cancelled on the daemon, and nothing follows the error. The
  buffer never grows past the budget by more than the one entry that broke it,
  and reading never blocks on a slow consumer, so a watch can never deadlock
  the calls that share its connection.
* **Leases signal loss.** ``eventlog/lock_lost`` names a lease the daemon lost;
  so does the end of the connection, because the daemon releases a connection's
  leases when it closes.
* **Nothing waits on a frame too large to read.** A frame over the limit is
  dropped unread, but its first bytes name the call it answers (that call
  fails, -32603) or the watch whose entry it carries (the watch ends there,
  naming the seq to resume from).
* **The end fails everything.** End of input (or a broken frame stream) fails
  every call in flight and every watch with ``closed``: no waiter is left
  waiting for an answer that cannot come.

Frames are split by :class:`streamd.rpc.framing.LineSplitter` (an oversized
frame is skipped without being held) and routed through
:class:`streamd.rpc.protocol.Envelope`, the daemon's own reader types.
"""

from __future__ import annotations

import itertools
import logging
import re
import typing
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from streamd import collector, errors
from streamd.errors import RpcError
from streamd.eventlog.model import (
    Entry,
    LockLostNotification,
    WatchParams,
    WatchResult,
)
from streamd.rpc.framing import MAX_FRAME_BYTES, LineSplitter, Oversized
from streamd.rpc.protocol import Envelope, encode_notification

__all__ = [
    "DEFAULT_WATCH_BUDGET",
    "Call",
    "ClientProtocol",
    "Event",
    "Garbled",
    "LockLost",
    "Reply",
    "WatchUpdated",
    "decode_result",
    "encode_params",
]

log = logging.getLogger("streamd.client")

T = TypeVar("T")

DEFAULT_WATCH_BUDGET = 16 << 20
"""Bytes of entries one watch may hold for a consumer that does not take them:
four times the daemon's own per-watch budget, so a consumer that keeps up at
all never meets it."""

ENTRY_NOTIFICATION = "eventlog/entry"
LOCK_LOST_NOTIFICATION = "eventlog/lock_lost"
CANCEL_METHOD = "$/cancelRequest"

_encoder = msgspec.json.Encoder()
_envelope = msgspec.json.Decoder(Envelope)


class _ErrorBody(msgspec.Struct):
    code: int
    message: str
    data: Any = None


class _EntryNote(msgspec.Struct):
    watch: int | str
    entry: Entry


# What names the call, or the watch, of a frame too large to read: the
# daemon writes the envelope's keys first (see streamd.rpc.protocol).
_ANSWER_HEAD = re.compile(rb'\{"jsonrpc":"2\.0","id":(\d{1,18}),')
_ENTRY_HEAD = re.compile(
    rb'\{"jsonrpc":"2\.0","method":"eventlog/entry","params":\{"watch":(\d{1,18}),')
_LARGE = 64 << 10  # bytes of a result decoded with the cyclic collector paused
_error_body = msgspec.json.Decoder(_ErrorBody)
_entry_note = msgspec.json.Decoder(_EntryNote)
_lock_lost = msgspec.json.Decoder(LockLostNotification)
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    found = _decoders.get(kind)
    if found is None:
        found = _decoders[kind] = msgspec.json.Decoder(kind)
    return found


def encode_params(call: Call[Any]) -> bytes:
    """``call``'s params as JSON. A text holding a surrogate code point (no
    UTF-8 encodes one) is refused -32602 naming its field, as the daemon and
    the store refuse it, never the encoder's ``UnicodeEncodeError``."""
    try:
        return _encoder.encode(call.params)
    except UnicodeEncodeError as exc:
        # Imported only here: the storage rules are no part of a thin client's start.
        from streamd.eventlog.store.storable import refusal_of

        if (refusal := refusal_of(exc, call.params)) is None:
            raise
        raise RpcError(refusal.code, f"{call.method} params: {refusal.message}") from None


def decode_result(data: bytes | msgspec.Raw, kind: type[T]) -> T:
    """An answer's result, decoded into ``kind``. A large one (a session's
    events) is thousands of objects, none garbage: decoded with the cyclic
    collector paused, which would otherwise walk the heap again and again
    (a 2,000-event session's decode triggered a collection of every
    generation, the oldest one load in four: 50 ms in a process that has
    imported ADK). Asked for as ``msgspec.Raw``, it is handed over as it is:
    it was read as JSON already (by the envelope's decode, or made by an
    encoder), and a decode into Raw would read all of it again (0.8 ms for
    a 2,000-event session). Raises ``msgspec.DecodeError``."""
    if kind is msgspec.Raw:
        return typing.cast("T", data if isinstance(data, msgspec.Raw) else msgspec.Raw(data))
    decoder = _decoder(kind)
    if len(data) < _LARGE:
        return decoder.decode(data)
    with collector.paused():
        return decoder.decode(data)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request: its method, its params (a Struct, or anything msgspec
    encodes) and the type its result decodes to."""

    method: str
    params: Any
    result: type[T]


# --- events ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to call ``id``: ``value`` decoded to the call's result type,
    or ``error``."""

    id: int
    value: Any = None
    error: RpcError | None = None


@dataclass(frozen=True, slots=True)
class WatchUpdated:
    """Watch ``id`` has something new to take: entries, or its end."""

    id: int


@dataclass(frozen=True, slots=True)
class LockLost:
    lock: str
    holder: str


@dataclass(frozen=True, slots=True)
class Garbled:
    """A frame that made no sense (logged and skipped)."""

    why: str


Event = Reply | WatchUpdated | LockLost | Garbled


# --- state ------------------------------------------------------------------------


@dataclass(slots=True)
class _Watch:
    budget: int
    last_seq: int
    """The seq of the last entry taken: where a resumed watch starts."""
    entries: deque[tuple[Entry, int]] = field(default_factory=deque)
    held: int = 0
    ended: RpcError | WatchResult | None = None
    cancelled: bool = False


def _closed(why: str) -> RpcError:
    return RpcError(errors.CLOSED, f"connection to the streamd daemon closed: {why}")


class ClientProtocol:
    """One connection's client-side state; see the module docstring."""

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._splitter = LineSplitter(max_frame)
        self._max_request = max_frame
        self._ids = itertools.count(1)
        self._pending: dict[int, Call[Any]] = {}
        self._abandoned: set[int] = set()
        self._watches: dict[int, _Watch] = {}
        self._leases: set[str] = set()
        self._closed: RpcError | None = None
        # Why the daemon is about to close the connection (it refused it:
        # too many connections), said at end of input.
        self._refusal: RpcError | None = None

    # -- outgoing --

    def start(self, call: Call[Any]) -> tuple[int, bytes]:
        """Register ``call`` and return its id and request frame."""
        if self._closed is not None:
            raise self._closed
        request_id = next(self._ids)
        frame = b"".join(
            (
                b'{"jsonrpc":"2.0","id":',
                str(request_id).encode(),
                b',"method":',
                _encoder.encode(call.method),
                b',"params":',
                encode_params(call),
                b"}\n",
            )
        )
        if len(frame) - 1 > self._max_request:  # the daemon's limit is without the newline
            # The daemon refuses a frame this long without reading its id, so
            # its answer could never reach this call: it would wait for ever.
            raise RpcError(
                errors.INVALID_REQUEST,
                f"{call.method}: a request of {len(frame)} bytes is over the daemon's"
                f" {self._max_request} byte frame limit",
            )
        self._pending[request_id] = call
        return request_id, frame

    def start_watch(
        self, params: WatchParams, budget: int = DEFAULT_WATCH_BUDGET
    ) -> tuple[int, bytes]:
        """Start ``eventlog/watch``; its entries are taken with :meth:`take`."""
        if budget < 1:
            raise ValueError("a watch budget must be positive")
        request_id, frame = self.start(Call("eventlog/watch", params, WatchResult))
        self._watches[request_id] = _Watch(budget=budget, last_seq=params.from_seq)
        return request_id, frame

    def cancel(self, request_id: int) -> bytes | None:
        """Abandon a call (or a watch): the cancel notification to send, or
        None when there is nothing left to cancel (answered, or the connection
        is closed)."""
        watch = self._watches.get(request_id)
        if watch is not None:
            watch.cancelled = True
            watch.entries.clear()
            watch.held = 0
        if request_id not in self._pending or request_id in self._abandoned:
            return None
        self._abandoned.add(request_id)
        if self._closed is not None:
            return None
        return encode_notification(CANCEL_METHOD, {"id": request_id})

    def withdraw(self, request_id: int) -> None:
        """Forget a request whose frame never left (its send timed out before
        any of it was written): there is nothing to cancel, and no answer
        will come to take it out of :attr:`in_flight`."""
        self._pending.pop(request_id, None)
        self._abandoned.discard(request_id)
        watch = self._watches.get(request_id)
        if watch is not None:
            watch.cancelled = True

    def lease_acquired(self, lock: str) -> None:
        """Count a lease as held on this connection (so its end reports it lost)."""
        self._leases.add(lock)

    def lease_released(self, lock: str) -> None:
        self._leases.discard(lock)

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered, abandoned ones included."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # -- watches --

    def take(self, watch_id: int) -> Entry | RpcError | WatchResult | None:
        """The watch's next entry; or how it ended (raise an RpcError, stop at a
        WatchResult), once every entry before the end has been taken; or None
        when there is nothing yet."""
        watch = self._watches.get(watch_id)
        if watch is None:
            raise KeyError(f"no watch {watch_id}")
        if watch.entries:
            entry, size = watch.entries.popleft()
            watch.held -= size
            watch.last_seq = entry.seq
            return entry
        if watch.ended is not None:
            return watch.ended
        return None

    def last_seq(self, watch_id: int) -> int:
        return self._watches[watch_id].last_seq

    def forget_watch(self, watch_id: int) -> None:
        """The consumer is done with this watch (after :meth:`cancel`, or its end)."""
        self._watches.pop(watch_id, None)

    # -- incoming --

    def receive(self, data: bytes | bytearray) -> tuple[list[Event], list[bytes]]:
        """Events for the frames ``data`` completes, and frames to send in
        answer (the cancel of a watch whose consumer fell behind). Empty
        ``data`` is end of input."""
        if not data:
            return self._eof(), []
        events: list[Event] = []
        outgoing: list[bytes] = []
        for frame in self._splitter.feed(data):
            self._frame(frame, events, outgoing)
        return events, outgoing

    def _eof(self) -> list[Event]:
        events: list[Event] = []
        for frame in self._splitter.close():
            self._frame(frame, events, [])
        refusal = self._refusal
        # Closed either way (the code callers test to reconnect), in the
        # daemon's words when it said why.
        events += self.fail_all(_closed("end of input") if refusal is None else RpcError(
            errors.CLOSED, f"connection to the streamd daemon closed: {refusal.message}",
            refusal.data))
        return events

    def fail_all(self, error: RpcError) -> list[Event]:
        """The connection is gone: fail every call and watch, report every lease
        lost. Idempotent."""
        if self._closed is not None:
            return []
        self._closed = error
        events: list[Event] = []
        for request_id in list(self._pending):
            self._pending.pop(request_id)
            if request_id in self._abandoned:
                continue
            watch = self._watches.get(request_id)
            if watch is not None:
                watch.ended = error
                events.append(WatchUpdated(request_id))
            else:
                events.append(Reply(request_id, error=error))
        self._abandoned.clear()
        for lock in sorted(self._leases):
            events.append(LockLost(lock, ""))
        self._leases.clear()
        return events

    def _frame(self, frame: bytes | Oversized, events: list[Event], out: list[bytes]) -> None:
        if isinstance(frame, Oversized):
            self._oversized(frame, events, out)
            return
        if not frame.strip():
            return
        try:
            env = _envelope.decode(frame)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            events.append(Garbled(f"a frame that is not a JSON-RPC message: {exc}"))
            return
        if env.method is not None:
            self._notification(env.method, env.params, len(frame), events, out)
        elif isinstance(env.id, int):
            self._answer(env, events)
        elif env.id is None and env.error:
            try:
                body = _error_body.decode(env.error)
            except msgspec.DecodeError as exc:
                events.append(Garbled(f"an error with no id that does not decode: {exc}"))
                return
            reason = body.data.get("reason") if isinstance(body.data, dict) else None
            if reason == errors.TOO_MANY_CONNECTIONS:
                self._refusal = RpcError(body.code, body.message, body.data)
            else:  # a frame of ours the daemon could not read (too big, too deep)
                events.append(Garbled(f"the daemon answered with no id: {body.message}"))
        else:
            events.append(Garbled(f"an answer with an id we never sent: {env.id!r}"))

    def _oversized(self, frame: Oversized, events: list[Event], out: list[bytes]) -> None:
        """A frame over the limit, dropped unread. The daemon answers nothing
        so large (it says -32603 instead), but one that did (another version,
        a log holding an entry stored before the limits) left the call it
        answered waiting for ever, or a watch silently short of an entry: its
        head names the call, or the watch, which fails with why."""
        why = f"a frame of {frame.size} bytes was over the limit ({self._max_request} bytes)"
        answered = _ANSWER_HEAD.match(frame.head)
        noted = _ENTRY_HEAD.match(frame.head)
        if answered is not None and (call := self._pending.get(int(answered[1]))) is not None:
            self._settle(int(answered[1]), RpcError(
                errors.INTERNAL_ERROR,
                f"{call.method}: the daemon's answer is {frame.size} bytes, over the"
                f" {self._max_request} byte frame limit; it was dropped unread",
                {"answer_bytes": frame.size, "max_frame": self._max_request},
            ), events)
            return
        watch_id = int(noted[1]) if noted is not None else None
        watch = self._watches.get(watch_id) if watch_id is not None else None
        if watch_id is None or watch is None or watch.cancelled or watch.ended is not None:
            events.append(Garbled(why))
            return
        # The entry after those buffered is missing: the watch ends there, as
        # for a consumer that fell behind, rather than go on past the gap.
        resume = watch.entries[-1][0].seq if watch.entries else watch.last_seq
        watch.ended = RpcError(
            errors.INTERNAL_ERROR,
            f"watch: an eventlog/entry of {frame.size} bytes, over the {self._max_request}"
            f" byte frame limit, was dropped unread; the watch has ended, resume with"
            f" from_seq={resume}",
            {"last_seq": resume, "entry_bytes": frame.size, "max_frame": self._max_request},
        )
        if watch_id in self._pending and watch_id not in self._abandoned:
            self._abandoned.add(watch_id)
            out.append(encode_notification(CANCEL_METHOD, {"id": watch_id}))
        events.append(WatchUpdated(watch_id))

    def _answer(self, env: Envelope, events: list[Event]) -> None:
        request_id = env.id
        assert isinstance(request_id, int)
        call = self._pending.get(request_id)
        if call is None:
            events.append(Garbled(f"an answer to id {request_id}, which is not in flight"))
            return
        self._settle(request_id, _outcome(call, env), events)

    def _settle(self, request_id: int, outcome: Any, events: list[Event]) -> None:
        """Call ``request_id`` (in flight) is answered with ``outcome``: a
        value, or an RpcError."""
        del self._pending[request_id]
        abandoned = request_id in self._abandoned
        self._abandoned.discard(request_id)
        watch = self._watches.get(request_id)
        if watch is not None:
            if not watch.cancelled and watch.ended is None:
                watch.ended = outcome if isinstance(outcome, RpcError | WatchResult) else None
                events.append(WatchUpdated(request_id))
            return
        if abandoned:
            return
        if isinstance(outcome, RpcError):
            events.append(Reply(request_id, error=outcome))
        else:
            events.append(Reply(request_id, value=outcome))

    def _notification(
        self, method: str, params: msgspec.Raw, size: int, events: list[Event], out: list[bytes]
    ) -> None:
        if method == ENTRY_NOTIFICATION:
            try:
                note = _entry_note.decode(params)
            except msgspec.DecodeError as exc:
                events.append(Garbled(f"an eventlog/entry that does not decode: {exc}"))
                return
            watch_id = note.watch
            if not isinstance(watch_id, int):
                return  # not an id this client gave: its watches are numbered
            watch = self._watches.get(watch_id)
            if watch is None or watch.cancelled or watch.ended is not None:
                return  # a watch already let go of: its stragglers are dropped
            if watch.held and watch.held + size > watch.budget:
                # The consumer still takes what is buffered, then the error;
                # the daemon is told to stop, and what it sent meanwhile is
                # dropped (the watch has ended).
                watch.ended = _fell_behind(watch)
                if watch_id in self._pending and watch_id not in self._abandoned:
                    self._abandoned.add(watch_id)
                    out.append(encode_notification(CANCEL_METHOD, {"id": watch_id}))
                events.append(WatchUpdated(watch_id))
                return
            watch.entries.append((note.entry, size))
            watch.held += size
            events.append(WatchUpdated(watch_id))
        elif method == LOCK_LOST_NOTIFICATION:
            try:
                lost = _lock_lost.decode(params)
            except msgspec.DecodeError as exc:
                events.append(Garbled(f"an eventlog/lock_lost that does not decode: {exc}"))
                return
            self._leases.discard(lost.lock)
            events.append(LockLost(lost.lock, lost.holder))
        else:
            log.debug("ignoring notification %s", method)

    def watches(self) -> Iterator[int]:
        return iter(list(self._watches))


def _outcome(call: Call[Any], env: Envelope) -> Any:
    if env.error:
        try:
            body = _error_body.decode(env.error)
        except msgspec.DecodeError as exc:
            return RpcError(errors.INTERNAL_ERROR, f"{call.method}: an error that does not "
                            f"decode: {exc}")
        return RpcError(body.code, body.message, body.data)
    if not env.result:
        return RpcError(errors.INTERNAL_ERROR, f"{call.method}: an answer with no result")
    try:
        return decode_result(env.result, call.result)
    except msgspec.DecodeError as exc:
        return RpcError(
            errors.INTERNAL_ERROR, f"{call.method}: the daemon's answer does not decode: {exc}"
        )


def _fell_behind(watch: _Watch) -> RpcError:
    # last_seq is what the consumer has taken; what is still buffered comes
    # before the error, so resuming after the last buffered entry loses nothing.
    resume = watch.entries[-1][0].seq if watch.entries else watch.last_seq
    return RpcError(
        errors.BUDGET_EXCEEDED,
        f"watch consumer fell behind: {watch.held} bytes of entries untaken, budget"
        f" {watch.budget}; the watch has ended, resume with from_seq={resume}",
        {"last_seq": resume, "buffered_bytes": watch.held, "budget_bytes": watch.budget},
    )
