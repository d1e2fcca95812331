"""Times people type on the command line: one parser for every flag.

An instant is RFC 3339 as the wire takes it (``2026-05-02T10:00:00Z``, an
offset instead of ``Z``, a fraction after a period), parsed by the same Go
rules the adapter applies to requests, so a flag accepts exactly what the
request it becomes will accept.
"""

from __future__ import annotations

import datetime as dt

from streamd.golang import gotime

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class TimeInputError(ValueError):
    """A time a person typed that we cannot read; the message says so."""


def parse_instant(text: str, flag: str) -> int:
    """Unix nanoseconds of ``text``; TimeInputError naming ``flag`` otherwise."""
    parsed = gotime.parse_wire(text)
    if parsed is None:
        raise TimeInputError(
            f"{flag} {text!r} is not an RFC 3339 time (like 2026-05-02T10:00:00Z)"
        )
    return parsed


def parse_datetime(text: str, flag: str) -> dt.datetime:
    """:func:`parse_instant` as an aware UTC datetime (microseconds kept)."""
    ns = parse_instant(text, flag)
    try:
        return _EPOCH + dt.timedelta(microseconds=ns // 1000)
    except OverflowError:
        raise TimeInputError(f"{flag} {text!r} is outside years 1 to 9999") from None
