"""Row mapping: values to the columns they are stored in, and rows back to Structs.

Values in, values out; no connection. Writes: :func:`prepare` computes all an
append stores that needs no database (the content and metadata as JSON text,
the event time, the digest that makes a retry safe). Reads are total: a stored
value that cannot be rendered (a time outside years 0001-9999, JSON that does
not parse, a column of the wrong type written by hand) reads as null and its
row is still returned, flagged in ``Entry.damaged`` and logged as a warning,
never dropped and never an error.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from streamd import plain
from streamd.errors import invalid_params
from streamd.eventlog.model import (
    MAX_ENTRY_BYTES,
    AppendParams,
    Boot,
    Entry,
    Event,
    LeaseInfo,
    Session,
    StateDelta,
    check_renderable,
    from_us,
    from_us_or_none,
    to_us,
    wire_size,
)
from streamd.eventlog.store.backend import Committed, Shape
from streamd.eventlog.store.storable import refusal_of

__all__ = [
    "ENTRY_COLUMNS",
    "ENTRY_COLUMNS_WITHOUT_CONTENT",
    "LEASE_COLUMNS",
    "SESSION_COLUMNS",
    "Prepared",
    "committed",
    "decode_state",
    "encode_entry",
    "entry_encoder",
    "json_text",
    "just_written",
    "prepare",
    "state_or_empty",
    "take",
    "to_boot",
    "to_entry",
    "to_lease",
    "to_session",
]

logger = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
_encode_canonical = msgspec.json.Encoder(order="deterministic").encode
_decode_any = msgspec.json.Decoder().decode
_decode_metadata = msgspec.json.Decoder(dict[str, str]).decode
_decode_state = msgspec.json.Decoder(dict[str, Any]).decode
_decode_attempted = msgspec.json.Decoder(list[str]).decode
_decode_delta = msgspec.json.Decoder(StateDelta).decode

# The compiled encoder's call and output this module expects (the module's
# ENTRY_INTERFACE): an editable install whose extension predates these
# sources, or was built from others, leaves reads on the Python path.
ENTRY_INTERFACE = 1
_compiled_entry: Callable[[tuple[Any, ...]], bytes | None] | None = None
try:
    import streamd._native as _core
except ImportError:  # built without a Rust toolchain
    pass
else:
    if getattr(_core, "ENTRY_INTERFACE", None) == ENTRY_INTERFACE:
        _compiled_entry = _core.encode_entry

ENTRY_COLUMNS = (
    "seq, app_name, user_id, session_id, event_id, invocation_id, author, branch, "
    "event_time, content, metadata, state_delta"
)
ENTRY_COLUMNS_WITHOUT_CONTENT = ENTRY_COLUMNS.replace("content,", "'null',")
"""The same row with the content read as JSON null: for a client that keeps
decoded events by seq and needs only the seqs (``sessions.get`` with
``content: false``); the content's bytes are neither read into Python nor sent."""
SESSION_COLUMNS = (
    "app_name, user_id, session_id, state, created_at, updated_at, last_seq, last_event_time"
)
LEASE_COLUMNS = "app_name, user_id, session_id, holder, acquired_at, heartbeat_at, stale_after_ms"

# What a value that cannot be rendered raises on the way out (DecodeError is a
# ValueError; TypeError is a column of the wrong type, written by hand).
_UNRENDERABLE = (OverflowError, TypeError, ValueError)


# --- writes -------------------------------------------------------------------


def json_text(value: Any) -> str:
    """``value`` as the JSON text a column stores."""
    return _encode(value).decode()


class Prepared(msgspec.Struct, frozen=True):
    """An append with everything computed that needs no database. (One per
    append: a Struct is made in a tenth of a frozen dataclass's time.)"""

    params: AppendParams
    event_time: int
    content: str
    metadata: str | None
    digest: bytes
    state_delta: StateDelta | None
    """Normalized: no empty scope, None when nothing is set."""
    state_delta_text: str | None


def prepare(p: AppendParams, now_us: int) -> Prepared:
    ev = p.event
    try:
        # Decoded params were checked already; this guards params changed
        # after construction: a stored time that cannot be rendered would read
        # back as null forever.
        check_renderable("event.timestamp", ev.timestamp)
    except ValueError as exc:
        raise invalid_params(str(exc)) from None
    given_time = to_us(ev.timestamp) if ev.timestamp is not None else None
    metadata = p.metadata or None  # {} reads back as null, so it is stored as null
    delta = p.state_delta.normalized() if p.state_delta is not None else None
    fields: list[Any] = [
        p.app,
        p.user,
        p.session,
        ev.id,
        ev.author,
        ev.branch,
        ev.invocation_id,
        given_time,
        ev.content,
        metadata,
    ]
    if delta is not None:
        # Only when there is one: an event without state keeps the identity it
        # had before state existed, so retrying it stays a duplicate.
        fields.append(delta)
    try:
        content = json_text(ev.content)
        identity = _encode_canonical(fields)
    except (TypeError, ValueError) as exc:
        # Looked for only now: a surrogate may sit in any field (a key as
        # well as the content), and walking every append's content to find
        # one first would cost more than encoding it.
        if (refusal := refusal_of(exc, p)) is not None:
            raise refusal from None
        raise invalid_params(f"event content is not JSON: {exc}") from None
    if len(identity) > MAX_ENTRY_BYTES:
        # Every field as stored, in one encoding already made. Stored, such an
        # entry could never be read back whole: a client drops a frame over
        # the limit, and the call or the watch waiting for it waited for ever.
        raise invalid_params(
            f"event is {len(identity)} bytes once stored (its content, names, metadata"
            f" and state delta as JSON), over the {MAX_ENTRY_BYTES} bytes an entry may"
            " take so that it can be read back in one frame"
        )
    try:
        delta_text = json_text(delta) if delta is not None else None
    except (TypeError, ValueError) as exc:
        raise invalid_params(f"state_delta is not JSON: {exc}") from None
    return Prepared(
        params=p,
        event_time=given_time if given_time is not None else now_us,
        content=content,
        metadata=json_text(metadata) if metadata is not None else None,
        digest=hashlib.blake2b(identity, digest_size=16).digest(),
        state_delta=delta,
        state_delta_text=delta_text,
    )


# --- reads --------------------------------------------------------------------


def to_entry(row: tuple[Any, ...], raw_content: bool = False) -> Entry:
    """An entry from its row (:data:`ENTRY_COLUMNS`). ``raw_content`` leaves the
    content as the stored JSON text (``msgspec.Raw``), which the JSON-RPC layer
    writes out verbatim: decoding it only to encode it again was a quarter of the
    cost of a ``since`` page.

    Total: a row with a value that cannot be rendered is built by
    :func:`_damaged_entry` instead (the ``try`` costs nothing when nothing
    raises, so intact rows pay nothing for it)."""
    t, content, md, sd = row[8], row[9], row[10], row[11]
    try:
        timestamp = from_us(t)
        body = msgspec.Raw(content) if raw_content else _decode_any(content)
        metadata = (_decode_metadata(md) or None) if md is not None else None
        delta = _decode_delta(sd) if sd is not None else None
    except _UNRENDERABLE:
        return _damaged_entry(row, raw_content)
    return _built(row, timestamp, body, metadata, delta)


def _damaged_entry(row: tuple[Any, ...], raw_content: bool) -> Entry:
    t, content, md, sd = row[8], row[9], row[10], row[11]
    damaged: list[str] = []
    timestamp = from_us_or_none(t)
    if timestamp is None:
        damaged.append("event.timestamp")
    body: Any = None
    try:
        body = msgspec.Raw(content) if raw_content else _decode_any(content)
    except _UNRENDERABLE:
        damaged.append("event.content")
    metadata = None
    if md is not None:
        try:
            metadata = _decode_metadata(md) or None
        except _UNRENDERABLE:
            damaged.append("metadata")
    delta = None
    if sd is not None:
        try:
            delta = _decode_delta(sd)
        except _UNRENDERABLE:
            damaged.append("state_delta")
    logger.warning(
        "event log row seq %s cannot be fully rendered (%s); read as null",
        row[0],
        ", ".join(damaged),
    )
    return _built(row, timestamp, body, metadata, delta, damaged)


def _built(
    row: tuple[Any, ...],
    timestamp: Any,
    body: Any,
    metadata: dict[str, str] | None,
    delta: StateDelta | None,
    damaged: list[str] | None = None,
) -> Entry:
    seq, app, user, session, event_id, invocation_id, author, branch = row[:8]
    return Entry(
        seq=seq,
        app=app,
        user=user,
        session=session,
        event=Event(
            id=event_id,
            author=author,
            content=body,
            branch=branch,
            invocation_id=invocation_id,
            timestamp=timestamp,
        ),
        metadata=metadata,
        damaged=damaged,
        state_delta=delta,
    )


def take(
    rows: Iterable[tuple[Any, ...]],
    limit: int | None,
    shape: Shape,
    max_bytes: int | None,
    min_one: bool = True,
) -> tuple[list[Any], int | None, bool]:
    """Entries from ``rows`` in order, at most ``limit`` and at most ``max_bytes``
    on the wire (but always the first unless ``min_one`` is false, so a reader
    gets past any entry); the last seq taken; and whether a row was left over.
    Rows are read only as far as they are used, so a reply cut by bytes never
    loads what it leaves out."""
    entries: list[Any] = []
    used = 0
    last = None
    wire = entry_encoder()
    for row in rows:
        if limit is not None and len(entries) == limit:
            return entries, last, True
        entry: Any
        if shape == "committed":
            entry = committed(row, wire)
            size = len(entry.wire)
        elif shape == "encoded":
            entry = msgspec.Raw(wire(row))
            size = len(entry)
        else:
            entry = to_entry(row, shape != "decoded")
            if max_bytes is not None:
                size = wire_size(entry)
        if max_bytes is not None:
            used += size + 1  # and its comma
            if used > max_bytes and (entries or not min_one):
                return entries, last, True
        entries.append(entry)
        last = row[0]
    return entries, last, False


def committed(
    row: tuple[Any, ...], wire: Callable[[tuple[Any, ...]], bytes] | None = None
) -> Committed:
    """A row just written (:data:`ENTRY_COLUMNS` order) as the watchers get it:
    rendered and encoded exactly as :func:`take` does for an ``encoded`` read
    (``wire``: :func:`entry_encoder`'s, when the caller has it)."""
    return Committed(
        seq=row[0],
        app=row[1],
        user=row[2],
        session=row[3],
        branch=row[7],
        author=row[6],
        wire=(wire or entry_encoder())(row),
    )


def encode_entry(row: tuple[Any, ...]) -> bytes:
    """The entry of ``row`` (:data:`ENTRY_COLUMNS` order) as the log answers
    with it: the definition, which the compiled encoder must match byte for
    byte."""
    return _encode(to_entry(row, raw_content=True))


def entry_encoder() -> Callable[[tuple[Any, ...]], bytes]:
    """:func:`encode_entry`, or its compiled twin where there is one and
    ``STREAMD_NATIVE=0`` is not set: asked once a read, not once a row. The
    compiled one writes the common row (no metadata, no state delta, nothing
    damaged) in about a third of the time (0.38 against 1.18 us for an ADK
    event of 500 bytes), and hands any other back."""
    compiled = _compiled_entry
    if compiled is None or plain.asked():
        return encode_entry

    def wire(row: tuple[Any, ...]) -> bytes:
        return compiled(row) or encode_entry(row)

    return wire


class _WireEntry(msgspec.Struct, omit_defaults=True):
    """:class:`~streamd.eventlog.model.Entry` as it encodes, with the metadata
    and the state delta carried as JSON text (the same fields, in the same
    order, with the same defaults: the same bytes)."""

    seq: int
    app: str
    user: str
    session: str
    event: Event
    metadata: msgspec.Raw | None
    damaged: list[str] | None = None
    state_delta: msgspec.Raw | None = None


def just_written(added: Iterable[tuple[Any, ...]]) -> list[Committed]:
    """Rows a commit of this process just wrote, values as :func:`prepare`
    made them (:data:`ENTRY_COLUMNS` order), as the watchers get them: the
    same as :func:`committed` of each, for less. An event time is converted
    once for a run of rows that share it (a batch's events mostly carry the
    commit's), and the metadata and state delta are the JSON text this
    module encoded, which decoding and encoding again would give back
    unchanged, so it goes out as it is. Every watched commit pays this per
    event, on the writer's thread; the compiled encoder writes the common row
    (0.5 against 0.7-1.2 us), and a row that is neither (a time it cannot
    render) goes the general way."""
    compiled = None if plain.asked() else _compiled_entry
    out: list[Committed] = []
    last_us: Any = None
    last_time: Any = None
    raw = msgspec.Raw
    for row in added:
        seq, app, user, session, event_id, invocation_id, author, branch, t, content, md, sd = row
        if compiled is not None and (encoded := compiled(row)) is not None:
            out.append(Committed(seq, app, user, session, branch, author, encoded))
            continue
        try:
            if t != last_us:
                last_time, last_us = from_us(t), t
        except _UNRENDERABLE:
            out.append(committed(row))
            continue
        event = Event(
            id=event_id,
            author=author,
            content=raw(content),
            branch=branch,
            invocation_id=invocation_id,
            timestamp=last_time,
        )
        wire = _encode(
            _WireEntry(
                seq,
                app,
                user,
                session,
                event,
                None if md is None else raw(md),
                None,
                None if sd is None else raw(sd),
            )
        )
        out.append(Committed(seq, app, user, session, branch, author, wire))
    return out


def to_session(row: tuple[Any, ...]) -> Session:
    """A session from its row (:data:`SESSION_COLUMNS`)."""
    app, user, session, state_text, created, updated, last_seq, event_time = row
    try:
        state: dict[str, Any] | None = _decode_state(state_text)
    except _UNRENDERABLE:
        state = None
    created_at, updated_at = from_us_or_none(created), from_us_or_none(updated)
    last_event_time = from_us_or_none(event_time)
    if state is None or created_at is None or updated_at is None or last_event_time is None:
        logger.warning(
            "event log session %s/%s/%s cannot be fully rendered; read with nulls",
            app,
            user,
            session,
        )
    return Session(
        app=app,
        user=user,
        session=session,
        state=state,
        created_at=created_at,
        updated_at=updated_at,
        last_seq=last_seq,
        last_event_time=last_event_time,
    )


def state_or_empty(text: str | None, what: str) -> dict[str, Any]:
    """A stored state object; ``{}`` when there is none yet. A stored state
    that does not parse (written by hand) reads as ``{}`` with a warning, as
    every damaged value reads as null rather than failing the read."""
    if text is None:
        return {}
    try:
        return _decode_state(text)
    except _UNRENDERABLE:
        logger.warning("event log %s state cannot be parsed; read as {}", what)
        return {}


def decode_state(text: str) -> dict[str, Any]:
    """A stored state object, for a write that merges into it: raises
    ValueError when it does not parse."""
    try:
        return _decode_state(text)
    except _UNRENDERABLE as exc:
        raise ValueError(str(exc)) from None


def to_lease(row: tuple[Any, ...]) -> LeaseInfo:
    """A lease from its row (:data:`LEASE_COLUMNS`)."""
    app, user, session, holder, acquired, beat, window = row
    return LeaseInfo(
        app=app,
        user=user,
        session=session,
        holder=holder,
        acquired_at=from_us_or_none(acquired),
        heartbeat_at=from_us_or_none(beat),
        stale_after_ms=window,
    )


def to_boot(row: tuple[Any, ...]) -> Boot:
    """A boot from ``(id, boot_at, attempted)``."""
    boot_id, at, text = row
    try:
        attempted: list[str] | None = _decode_attempted(text)
    except _UNRENDERABLE:
        attempted = None
    return Boot(id=boot_id, boot_at=from_us_or_none(at), attempted=attempted)
