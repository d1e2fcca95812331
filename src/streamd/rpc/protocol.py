"""JSON-RPC 2.0 frames as events, and the frames we write: sans-I/O.

:class:`FrameReader` takes bytes as they arrive and hands back one event per
frame, without awaiting anything, so every rule below is tested without an
event loop; the Trio server (:mod:`~streamd.rpc.server`) only acts on the
events. The rules:

* What counts as a request: a JSON object with a ``method``. With an ``id``
  (of any JSON-RPC type, null included: that request is answered with id null
  and cannot be cancelled) it is a :class:`Call`; without one it is a
  notification, of which only ``recall/cancel`` and ``$/cancelRequest`` mean
  anything (:class:`Cancel`); others are :class:`Ignored`.
* A frame that is not a request is a :class:`Fault`: the error to answer and
  the id to answer it with (null when none could be read). Not JSON, invalid
  UTF-8 anywhere but the params, or a lone surrogate escape: -32700. A batch
  (a JSON array), nesting deeper than ``max_depth``, an integer id outside 64
  bits, a wrong ``jsonrpc``, a frame over ``max_frame`` bytes: -32600. A
  response frame is :class:`Ignored`: this server sends no requests, and
  answering one could start an endless exchange of errors.
* Params are decoded later, by :func:`bind`, against the method's strict
  Struct, so an unknown method is -32601 before its params are looked at and a
  bad params value is -32602 with msgspec's path message.
* A call carries what its params are estimated to take once decoded
  (:mod:`~streamd.rpc.footprint`), which the server charges against the
  connection's in-flight bound; one whose estimate passes ``max_decoded`` is
  never decoded: :func:`bind` refuses it -32602, after the method lookup.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from streamd import errors
from streamd.errors import RpcError
from streamd.golang.quote import quote
from streamd.rpc.footprint import MAX_DECODED_BYTES, decoded_size
from streamd.rpc.framing import (
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    LineSplitter,
    Oversized,
    nests_deeper_than,
)

log = logging.getLogger("streamd.rpc")

RequestId = int | float | str

SHUTDOWN_METHOD = "recall/shutdown"
CANCEL_METHODS = frozenset({"recall/cancel", "$/cancelRequest"})

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


# --- events -------------------------------------------------------------------


class Call(msgspec.Struct, frozen=True):
    """A request to answer. ``id`` is None for a request sent with a null id.

    A Struct, not a frozen dataclass: one is built per request, and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) cost 0.4 us of
    the 1.8 us of classifying an append's frame; this costs 0.06."""

    id: RequestId | None
    method: str
    params: msgspec.Raw
    size: int  # bytes of the frame
    # Charged against the in-flight bound: what the params are estimated to
    # take once decoded (at least the frame's bytes); the frame's bytes alone
    # for a call that will not be decoded (``params_fault``).
    held: int
    # Why the params cannot be read (a lone surrogate escape in them, or an
    # estimate past ``max_decoded``): raised by ``bind`` after the method
    # lookup, as a params decoding error is.
    params_fault: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """A well-formed cancel notification for the request with this id."""

    id: RequestId


@dataclass(frozen=True, slots=True)
class Shutdown:
    id: RequestId | None


@dataclass(frozen=True, slots=True)
class Fault:
    """A frame that is answered with ``error`` and otherwise skipped."""

    id: RequestId | None
    error: RpcError


@dataclass(frozen=True, slots=True)
class Ignored:
    """Nothing to do: a blank line, a response, an unknown notification."""

    why: str


Event = Call | Cancel | Shutdown | Fault | Ignored


class FrameReader:
    """Bytes in, one :data:`Event` per frame out."""

    def __init__(
        self,
        max_frame: int = MAX_FRAME_BYTES,
        max_depth: int = MAX_DEPTH,
        max_decoded: int = MAX_DECODED_BYTES,
    ) -> None:
        self.max_frame = max_frame
        self.max_depth = max_depth
        self.max_decoded = max_decoded
        self._splitter = LineSplitter(max_frame)

    def feed(self, data: bytes | bytearray) -> list[bytes | Oversized]:
        """The complete frames ``data`` finishes; classify each with :meth:`event`.

        Frames, not events, so that a caller working through a long list holds
        each event (and the params it references) only while handling it."""
        return self._splitter.feed(data)

    def close(self) -> list[bytes | Oversized]:
        """End of input: a last line without a newline is still a frame."""
        return self._splitter.close()

    @property
    def pending(self) -> int:
        """The bytes of an unfinished frame held, up to ``max_frame``."""
        return self._splitter.pending

    def event(self, frame: bytes | Oversized) -> Event:
        if isinstance(frame, Oversized):
            return Fault(None, RpcError(
                errors.INVALID_REQUEST,
                f"frame of {frame.size} bytes exceeds the {self.max_frame} byte limit",
            ))
        if frame[:1] != b"{" and not frame.strip():  # a request is usually "{..."
            return Ignored("blank line")
        # Counted once, for the nesting check and the call's estimate.
        objects, arrays = frame.count(b"{"), frame.count(b"[")
        env = self._envelope(frame, objects + arrays)
        if isinstance(env, RpcError):
            # Only a frame that did not parse can be a request but for a
            # lone surrogate (one too deep was refused before any decoding).
            found = _lone_surrogate(frame) if env.code == errors.PARSE_ERROR else None
            return found or Fault(None, env)
        reply_id = None if env.id is UNSET else env.id
        if env.jsonrpc != "2.0":
            return Fault(reply_id, RpcError(errors.INVALID_REQUEST, 'jsonrpc must be "2.0"'))
        if env.method is None:
            if env.result or env.error:
                return Ignored("a response")
            return Fault(
                reply_id, RpcError(errors.INVALID_REQUEST, "frame has neither a method nor an id")
            )
        if env.result or env.error:
            return Fault(
                reply_id, RpcError(errors.INVALID_REQUEST, "a request carries no result or error")
            )
        if env.id is UNSET:
            return _notification(env.method, env.params)
        if env.method == SHUTDOWN_METHOD:
            try:
                decode_params(SHUTDOWN_METHOD, env.params, EmptyParams | None)
            except RpcError as exc:
                return Fault(reply_id, exc)
            return Shutdown(reply_id)
        held = decoded_size(frame, objects, arrays)
        if held > self.max_decoded:
            return Call(reply_id, env.method, env.params, len(frame), len(frame), params_fault=(
                f"would take about {held} bytes of memory once decoded ({objects} objects"
                f" and {arrays} arrays in {len(frame)} bytes), over the {self.max_decoded}"
                " byte limit; refused undecoded"
            ))
        return Call(reply_id, env.method, env.params, len(frame), held)

    def _envelope(self, frame: bytes, openings: int) -> Envelope | RpcError:
        if nests_deeper_than(frame, self.max_depth, openings):
            return RpcError(
                errors.INVALID_REQUEST,
                f"frame nests arrays and objects more than {self.max_depth} levels deep",
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


def _notification(method: str, params: msgspec.Raw) -> Cancel | Ignored:
    if method not in CANCEL_METHODS:
        return Ignored(f"notification {method}")
    try:
        return Cancel(decode_params(method, params, CancelParams).id)
    except RpcError as exc:
        return Ignored(f"malformed {method}: {exc.message}")


class _Bound(Protocol):
    """What :func:`bind` reads of a method (a :class:`~streamd.rpc.methods.Method`)."""

    @property
    def params(self) -> type: ...


M = TypeVar("M", bound=_Bound)


def bind(call: Call, methods: Mapping[str, M]) -> tuple[M, Any]:
    """The method a call names in ``methods`` (a method table) and its decoded
    params; RpcError -32601/-32602."""
    method = methods.get(call.method)
    if method is None:
        name = call.method
        if len(name) > _QUOTED_METHOD_CHARS:
            name = name[:_QUOTED_METHOD_CHARS] + "..."
        raise RpcError(errors.METHOD_NOT_FOUND, f"unknown method {quote(name)}")
    if call.params_fault is not None:
        raise RpcError(errors.INVALID_PARAMS, f"{call.method} params: {call.params_fault}")
    # Struct __post_init__ validation raises RpcError with its own words.
    return method, decode_params(call.method, call.params, method.params)


def decode_params(method: str, raw: msgspec.Raw, params_type: Any) -> Any:
    decoder = _params_decoders.get(params_type)
    if decoder is None:
        decoder = _params_decoders[params_type] = msgspec.json.Decoder(params_type)
    try:
        return decoder.decode(raw)
    except UnicodeDecodeError:
        raise RpcError(errors.INVALID_PARAMS, f"{method} params: {_NOT_UTF8}") from None
    except msgspec.DecodeError as exc:
        if _INVALID_UTF8 in str(exc):
            raise RpcError(errors.INVALID_PARAMS, f"{method} params: {_NOT_UTF8}") from None
        raise RpcError(errors.INVALID_PARAMS, f"{method} params: {exc}") from None


def id_key(request_id: RequestId) -> tuple[str, RequestId]:
    """The in-flight table's key: 1 and "1" are different ids; 1 and 1.0 the same."""
    return ("s", request_id) if isinstance(request_id, str) else ("n", request_id)


# --- faults -------------------------------------------------------------------

_envelope_decoder = msgspec.json.Decoder(Envelope)
# One per params type: ``msgspec.json.decode(raw, type=...)`` looks the type
# up again on every call, a few microseconds of every request.
_params_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}
_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_well_formed = msgspec.json.Decoder(msgspec.Raw)

# A \uD800-\uDBFF escape (preceded by an even run of backslashes, so it is an
# escape) not followed by a \uDC00-\uDFFF one. msgspec calls some of these
# "Input data was truncated", which sends the peer looking for a short write.
_LONE_HIGH_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


# Surrogate escapes, whole pairs, and escaped backslashes (matched first, so
# that the text ``\\ud800`` is not taken for an escape): a lone half of a pair
# is the third group.
_SURROGATE_ESCAPES = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)
# What a lone surrogate escape is read as to find the request around it: a
# noncharacter, so that one in the params can be told from the frame's own.
_MARK = rb"\ufdd0"
_LONE_SURROGATE = ("a \\u escape of a lone surrogate (D800-DFFF), which no UTF-8 string"
                   " can hold")


def _lone_surrogate(frame: bytes) -> Call | Fault | None:
    """A frame that is a request but for a lone surrogate escape: refused
    with the request's id (-32602 when the escape is in its params, which
    ``bind`` raises after the method lookup, as for any params it cannot
    read; -32700 elsewhere), where an unreadable frame is answered with
    id null and its client would wait for an answer that never comes."""
    if _MARK in frame:
        return None  # a noncharacter of its own: the mark could not be told apart
    lone = 0

    def mark(m: re.Match[bytes]) -> bytes:
        nonlocal lone
        if m.group(1) is None:
            return m.group(0)
        lone += 1
        return _MARK

    marked = _SURROGATE_ESCAPES.sub(mark, frame)
    if not lone:
        return None
    try:
        env = _envelope_decoder.decode(marked)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if env.id is UNSET or env.id is None or env.method is None or env.jsonrpc != "2.0":
        return None
    if isinstance(env.id, str) and "\ufdd0" in env.id:
        return None  # the id itself held one: it cannot be answered
    if _MARK in bytes(env.params) and _MARK not in marked.replace(bytes(env.params), b"", 1):
        return Call(env.id, env.method, env.params, len(frame), len(frame),
                    params_fault=_LONE_SURROGATE)
    return Fault(env.id, RpcError(errors.PARSE_ERROR, f"parse error: {_LONE_SURROGATE}"))


# msgspec up to 0.22 raises UnicodeDecodeError for a string that is not UTF-8;
# 0.23 raises DecodeError with these words. Either is said the same way.
_INVALID_UTF8 = "Invalid UTF-8"
_NOT_UTF8 = "a string is not valid UTF-8"


def _parse_error(frame: bytes, exc: Exception) -> RpcError:
    if isinstance(exc, UnicodeDecodeError) or _INVALID_UTF8 in str(exc):
        message = _NOT_UTF8
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


# --- encoders -----------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def encode_result(request_id: RequestId | None, result: Any) -> bytes:
    return b"".join(
        (b'{"jsonrpc":"2.0","id":', _encoder.encode(request_id), b',"result":',
         _encoder.encode(result), b"}\n")
    )


def result_frame(
    request_id: RequestId | None, result: Any, max_frame: int = MAX_FRAME_BYTES
) -> bytes:
    """:func:`encode_result`, or an error when that answer would be a frame
    over ``max_frame``: a client drops such a frame unread (it cannot tell
    whose it was), so the call it answered waited for ever. Said instead, the
    call fails and its caller learns why."""
    frame = encode_result(request_id, result)
    size = len(frame) - 1  # the limit is without the newline, as on reading
    if size <= max_frame:
        return frame
    return encode_error(request_id, _too_large(size, max_frame))


def result_room(request_id: RequestId | None, max_frame: int = MAX_FRAME_BYTES) -> int:
    """The most bytes a result may encode to in an answer to ``request_id``
    within ``max_frame``: for a handler that can tell early that its result
    will not fit (:func:`oversized_result`)."""
    return max_frame - (len(encode_result(request_id, None)) - 1 - len(b"null"))


def oversized_result(
    request_id: RequestId | None, result_bytes: int, max_frame: int = MAX_FRAME_BYTES
) -> RpcError:
    """The error :func:`result_frame` answers for a result of ``result_bytes``
    past :func:`result_room`, for a handler to raise without building it."""
    size = max_frame - result_room(request_id, max_frame) + result_bytes
    return _too_large(size, max_frame)


def _too_large(size: int, max_frame: int) -> RpcError:
    return RpcError(
        errors.INTERNAL_ERROR,
        f"the answer is {size} bytes, over the {max_frame} byte frame limit",
        {"answer_bytes": size, "max_frame": max_frame},
    )


def encode_error(request_id: RequestId | None, err: RpcError) -> bytes:
    body: dict[str, Any] = {"code": err.code, "message": err.message}
    if err.data is not None:
        body["data"] = err.data
    return b"".join(
        (b'{"jsonrpc":"2.0","id":', _encoder.encode(request_id), b',"error":',
         _encoder.encode(body), b"}\n")
    )


def error_frame(
    request_id: RequestId | None, err: RpcError, max_frame: int = MAX_FRAME_BYTES
) -> bytes:
    """:func:`encode_error`, falling back to an internal error that always encodes:
    a handler's error data (or a message holding a lone surrogate) that JSON
    cannot carry must still produce an answer. One over ``max_frame`` keeps
    its code and the head of its message (see :func:`_cut_to_fit`)."""
    try:
        frame = encode_error(request_id, err)
    except Exception:
        log.exception("cannot encode %r", err)
        message = f"{err.name}: the error could not be encoded"
        return encode_error(request_id, RpcError(errors.INTERNAL_ERROR, message))
    if len(frame) - 1 <= max_frame:  # the limit is without the newline
        return frame
    return _cut_to_fit(request_id, err, len(frame) - 1, max_frame)


_ERROR_HEAD_CHARS = 256
"""What is kept of an error message too long for a frame."""


def _cut_to_fit(request_id: RequestId | None, err: RpcError, size: int, max_frame: int) -> bytes:
    """An error can echo most of its request (msgspec names an unknown params
    key whole), and so be longer than the frame that carried it: a client
    drops such a frame unread, and the call waited for ever. Its code stays,
    its message is cut and its data left out."""
    message = (
        f"{err.message[:_ERROR_HEAD_CHARS]}... (the error is {size} bytes,"
        f" over the {max_frame} byte frame limit)"
    )
    return encode_error(request_id, RpcError(err.code, message))


def encode_notification(method: str, params: Any) -> bytes:
    return b"".join(
        (b'{"jsonrpc":"2.0","method":', _encoder.encode(method), b',"params":',
         _encoder.encode(params), b"}\n")
    )
