"""Limits, the annotated scalar types, time conversion, the Params and Result
bases, and the helpers that build and check Structs (``checked``,
``validated``, ``wire_size``); ``ping`` and the empty result.

No I/O here, and no trio.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, TypeVar

import msgspec

from streamd.errors import invalid_params

DEFAULT_SINCE_LIMIT = 1000
MAX_SINCE_LIMIT = 10_000
REPLY_BUDGET_BYTES = 4 << 20
"""How many bytes of entries one ``since`` page or ``sessions.get`` answer may
carry on the wire: half the 8 MiB frame limit (``streamd.rpc.framing``), so a reply
is always a frame a client can read. A reply that stops at the budget says how
to continue (``since``: ``caught_up`` false and ``next_seq``; ``sessions.get``:
``truncated`` and ``next_seq``; ``sessions.list``: ``next``). At least one entry
is always returned, so a reader makes progress even past an entry bigger than
the budget."""
MAX_STATE_BYTES = 1 << 20
"""How large one scope's state (the app's, a user's, a session's) may grow, as
stored JSON. A session read carries its state, and with ``scoped_state`` the
app's and the user's too, beside up to :data:`REPLY_BUDGET_BYTES` of events:
three states at this size and a full budget (or one entry of up to
:data:`MAX_ENTRY_BYTES`) still make a frame a client can read. A delta (or a
new session's state) that would grow one past it is refused at append, where
the writer can hear it; grown by deltas without a bound, a session's state
made every read of it over the frame limit."""
MAX_ENTRY_BYTES = (8 << 20) - 3 * MAX_STATE_BYTES - (4 << 10)
"""How large an event may be once stored, as its fields encode (the content's
JSON text, the names, metadata and state delta): the 8 MiB frame limit
(``streamd.rpc.framing``) less the three states a session read carries beside
it (:data:`MAX_STATE_BYTES` each) and room for the keys, seq and time of its
entry and the envelope of the frame, so that every entry can be read back,
alone if need be, by a client that holds frames to that limit. (Less the
states: an entry of the whole frame, beside 100 kB of state, made every
``sessions.get`` of its session over the limit.) Checked at append on the
stored form, not the request's: a float's text can grow (``1e15`` is stored
as ``1000000000000000.0``), and an entry has keys and fields the request may
leave out."""
DEFAULT_WATCH_BUFFER_BYTES = 4 << 20
# Seconds between change polls while someone watches and inotify is unavailable.
DEFAULT_WATCH_INTERVAL = 0.2
"""What one watch may hold for a consumer that is not reading: over the wire,
its notifications queued on the connection plus what it has read ahead from the
log; in Python, what it has read ahead. (``--watch-buffer-bytes``)"""
DEFAULT_STALE_AFTER_MS = 30_000
MAX_DERIVED_HEARTBEAT_MS = 5_000
"""An omitted heartbeat is a third of the stale window, but at most this."""
MIN_HEARTBEAT_MS = 50
MIN_STALE_AFTER_MS = 150
"""Lease floors: below them a heartbeat is a busy loop on the database, and a
window of a few scheduler hiccups lets a healthy holder look dead."""
MAX_INT = 2**63 - 1
"""SQLite's largest integer. Every integer param is bounded by it, so an
oversized one is invalid_params, never an overflow deep in the driver."""

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
Count = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT)]
Millis = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT)]
UtcTime = Annotated[_dt.datetime, msgspec.Meta(tz=True)]
"""An aware datetime; offsets other than UTC are accepted and normalised on write."""

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MIN_TIME = _dt.datetime.min.replace(tzinfo=_dt.UTC)
_MAX_TIME = _dt.datetime.max.replace(tzinfo=_dt.UTC)
TIME_RANGE = "0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z"


def to_us(when: _dt.datetime) -> int:
    """Microseconds since the epoch; integer arithmetic so no float rounding."""
    if when.tzinfo is None:
        raise invalid_params("time must carry a timezone (RFC 3339 with Z or an offset)")
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> _dt.datetime:
    """The UTC time of a stored value; OverflowError outside years 0001-9999
    (see :func:`from_us_or_none` for reads of rows that may be damaged)."""
    # Seconds and microseconds given apart: timedelta(microseconds=...) normalises
    # through a slower path, and this runs once per entry read (30 % of it).
    seconds, micros = divmod(us, 1_000_000)
    return _EPOCH + _dt.timedelta(0, seconds, micros)


def from_us_or_none(us: Any) -> _dt.datetime | None:
    """:func:`from_us`, or None for a stored value that is no renderable time."""
    try:
        return from_us(us)
    except (OverflowError, TypeError, ValueError):
        return None


def check_renderable(field: str, when: _dt.datetime | None) -> None:
    """Refuse a time that could not be written back as RFC 3339 in UTC."""
    if when is None or when.tzinfo is None:
        return  # absent, or naive (refused elsewhere with its own message)
    if not _MIN_TIME <= when <= _MAX_TIME:
        raise ValueError(
            f"{field} must lie within {TIME_RANGE} once converted to UTC,"
            f" not {when.isoformat()}"
        )


class Params(msgspec.Struct, forbid_unknown_fields=True):
    """Base for everything a client sends: unknown keys are errors."""


class Result(msgspec.Struct):
    """Base for everything the log returns."""


class PingParams(Params):
    pass


class Empty(Result):
    pass


_T = TypeVar("_T", bound=msgspec.Struct)

_encoder = msgspec.json.Encoder()


def wire_size(value: Any) -> int:
    """Bytes of ``value`` as JSON on the wire; exact, and cheap for entries whose
    content is ``msgspec.Raw`` (about 0.5 us: it is a copy)."""
    return len(_encoder.encode(value))


def checked(cls: type[_T], **fields: Any) -> _T:
    """Build params from Python values and validate them as the wire would."""
    try:
        params = cls(**fields)
    except (TypeError, ValueError) as exc:
        raise invalid_params(str(exc)) from None
    return validated(params)


def validated(params: _T) -> _T:
    """Check a Struct built in Python against the same rules the wire enforces.

    Constructing a Struct does not run its ``Meta`` constraints; decoding does. A
    round trip through JSON is the one check that is exactly the wire's, so the
    Python API and the JSON-RPC methods can never disagree about what is valid.
    """
    try:
        return msgspec.json.decode(_encoder.encode(params), type=type(params))
    except UnicodeEncodeError as exc:
        # A surrogate code point: refused as the store refuses it, naming the
        # field (imported here: the model is below the store's rules).
        from streamd.eventlog.store.storable import refusal_of

        raise (refusal_of(exc, params) or invalid_params(str(exc))) from None
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise invalid_params(str(exc)) from None
