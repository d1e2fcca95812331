"""How much of a MySQL log's batch one statement carries: the server's
``max_allowed_packet``.

The server refuses a statement longer than its ``max_allowed_packet`` (4 MiB
by default before MySQL 8.0, 64 MiB in 8.0, 16 MiB in MariaDB) by dropping
the connection. What that costs is handled here:

* Appends queued together are written in runs (:func:`packets`) that each
  fit, so valid appends never add up to a refused statement.
* One event that cannot fit even alone is refused before anything is sent
  (:func:`refuse_oversized`, -32602 naming the limit). Sent, it cut the
  connection under the whole group commit: every other client's append
  queued with it failed, each told that it "may or may not have committed",
  and a retry of the big one failed the same way, for ever.
* Any other statement too long to send is refused the same way
  (:func:`refuse_long_statement`, which every statement passes): a state
  that grew past the limit by many deltas, each small, is written whole by
  the next delta, which cut the connection under its group commit, and every
  later delta of that app (user, session) did the same.

A value's length in a statement is its UTF-8 length plus one for each byte
the driver escapes (``mysql_real_escape_string``: NUL, LF, CR, Ctrl-Z, ``\\``,
``'``, ``"``); a character is at most four bytes there (a four-byte character
is never escaped, an escaped one is one byte doubled).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from streamd.errors import invalid_params
from streamd.eventlog.store import rows
from streamd.eventlog.store.plan import Planned

__all__ = [
    "ARG_BYTES", "DEFAULT_MAX_PACKET", "KEYS_A_STATEMENT", "PACKET_CHARS", "PACKET_SLACK",
    "STATEMENT_SLACK", "key_runs", "max_packet", "packets",
    "refuse_long_statement", "refuse_oversized", "statement_bytes",
]

DEFAULT_MAX_PACKET = 4 << 20
"""The smallest default of any server, until a connection has read its own."""

PACKET_CHARS = 512 << 10
"""Characters of text one INSERT of events carries at most when several events
share it (at most 2 MiB escaped: under every server's default limit)."""
STATEMENT_SLACK = 4096
"""Bytes of an event's INSERT beside its values: column names, numbers, quotes."""
_ESCAPED = b"\\'\"\0\n\r\x1a"
ARG_BYTES = 32
"""Bytes a value may take in a statement beside its escaped text, at most: its
quotes and ``_binary`` prefix, or a number's digits (``seq`` and microsecond
times are up to 20), or ``NULL``."""
PACKET_SLACK = 64
"""Bytes of a statement's packet beside its text: the command byte, and room."""


def max_packet(conn: Any) -> int:
    """The connection's ``max_allowed_packet`` (the server's, as of its start)."""
    cur = conn.cursor()
    try:
        cur.execute("SELECT @@max_allowed_packet")
        row = cur.fetchone()
    finally:
        cur.close()
    return int(row[0]) if row else DEFAULT_MAX_PACKET


def packets(events: list[Planned], max_packet: int) -> Iterator[list[Planned]]:
    """``events`` in runs that each fit one statement (or one event alone)."""
    budget = max(1, min(PACKET_CHARS, (max_packet - STATEMENT_SLACK) // 4))
    run: list[Planned] = []
    size = 0
    for e in events:
        n = 64 + sum(len(v) for v in e.row if isinstance(v, str | bytes))
        if run and size + n > budget:
            yield run
            run, size = [], 0
        run.append(e)
        size += n
    if run:
        yield run


KEYS_A_STATEMENT = 250
"""Keys one statement names at most (:func:`key_runs`). MariaDB 10.11 read
250 keys of a 3,000-row table by primary key and 500 by scanning the whole
index; 3,000 keys took the same 34 ms in runs of 100 or 250 (39 ms in runs of
500), so runs stay short enough to be read by key."""


def key_runs(
    keys: Sequence[tuple[Any, ...]], max_packet: int, per_key: int
) -> Iterator[Sequence[tuple[Any, ...]]]:
    """``keys`` (rows of texts) in runs that each fit one statement that
    spends ``per_key`` characters of its text on each, as
    :func:`refuse_long_statement` measures a statement (so none is refused)."""
    budget = max(1, (max_packet - STATEMENT_SLACK) // 4)
    start, size = 0, 0
    for i, key in enumerate(keys):
        n = per_key + sum(ARG_BYTES + len(v) for v in key)
        if i > start and (size + n > budget or i - start == KEYS_A_STATEMENT):
            yield keys[start:i]
            start, size = i, 0
        size += n
    if start < len(keys):
        yield keys[start:]


def refuse_long_statement(query: str, args: tuple[object, ...], max_packet: int) -> None:
    """Refuse (-32602) a statement whose text with ``args`` could be longer than
    ``max_packet``: measured only when its characters could make it so. The
    measure is an upper bound (a value's escaped bytes and :data:`ARG_BYTES`,
    the packet's :data:`PACKET_SLACK`): a statement a few bytes past the limit
    cut the connection under its whole group commit as any other did."""
    chars = len(query) + PACKET_SLACK + ARG_BYTES * len(args)
    for a in args:
        if isinstance(a, str | bytes):
            chars += len(a)
    if chars * 4 <= max_packet:
        return
    size = len(query.encode("utf-8")) + PACKET_SLACK + ARG_BYTES * len(args)
    for a in args:
        if isinstance(a, str | bytes):
            size += _escaped_len(a)
    if size > max_packet:
        raise invalid_params(
            f"refused by the database: {' '.join(query.split()[:3])} ... would be a statement of"
            f" {size} bytes, more than the server's max_allowed_packet ({max_packet} bytes)"
            " lets one statement carry; raise max_allowed_packet on the server to store it"
        )


def _escaped_len(value: str | bytes) -> int:
    data = value.encode("utf-8") if isinstance(value, str) else value
    # One pass: each escaped byte is one more (what deleting them takes away).
    return 2 * len(data) - len(data.translate(None, _ESCAPED))


def _texts(item: rows.Prepared) -> list[str | bytes]:
    """The text values of ``item``'s row in an INSERT statement."""
    p, ev = item.params, item.params.event
    values: list[str | bytes | None] = [
        p.app, p.user, p.session, ev.id, ev.invocation_id, ev.author, ev.branch,
        item.content, item.metadata, item.state_delta_text, item.digest,
    ]
    return [v for v in values if v is not None]


def statement_bytes(item: rows.Prepared) -> int:
    """The length of ``item``'s values in an INSERT statement, escaped."""
    return sum(_escaped_len(v) for v in _texts(item))


def refuse_oversized(item: rows.Prepared, max_packet: int) -> None:
    """Refuse an event whose INSERT alone is longer than ``max_packet``."""
    room = max_packet - STATEMENT_SLACK
    chars = sum(len(v) for v in _texts(item))
    if chars * 4 <= room:
        return  # fits even if every character took its most bytes: not measured
    size = statement_bytes(item)
    if size > room:
        event_id = item.params.event.id[:200]
        raise invalid_params(
            f"event rejected by the database: event {event_id!r} takes {size} bytes in a"
            f" statement, more than the server's max_allowed_packet ({max_packet} bytes) lets"
            " one statement carry; raise max_allowed_packet on the server to store it"
        )
