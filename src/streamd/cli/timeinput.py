"""Times people type on the command line: one parser for every flag.

Every flag that takes a time reads it here (``search --since/--until/--as-of``,
``log append --timestamp``, ``log boots --since``), so they all accept the same
spellings, and a time that cannot be read is always a usage error (exit 2) whose
one line names the flag and lists what it would have taken:

* RFC 3339, as the wire takes it: ``2026-05-02T10:00:00Z``, an offset instead
  of ``Z``, a fraction after a period. Also a space (or a lower-case ``t``)
  for the ``T``, minutes without seconds, and no zone at all (read as UTC), so
  that a time copied from streamd's own output (``2026-05-02 10:00:00.000Z``)
  reads back.
* A date, ``2026-05-02``: 00:00:00 UTC of that day, whatever the flag (so
  ``--until 2026-05-03`` takes May 2 whole, and an event stamped exactly at
  midnight of May 3, since search's ``until`` is inclusive).
* ``now``, ``today`` (00:00 UTC today), ``yesterday`` (00:00 UTC the day before).
* A duration before now: ``90s``, ``15m``, ``2h``, ``3d``, ``1w``, combined
  (``1h30m``), spelled out (``2 hours``) and with an optional ``ago``.

Why UTC and never the local zone: every time streamd prints is UTC, so a date
copied from its output means the instant it shows, and a command means the
same on every machine it runs on. A local midnight is an offset away:
``2026-05-02T00:00:00+02:00``.

Whatever was typed is checked as the wire would check the request it becomes
(Go's rules, years 0000 to 9999), so a flag never accepts a time that its
request would then refuse.
"""

from __future__ import annotations

import datetime as dt
import re
import time

from streamd.golang import gotime

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# A date, optionally a time of day (seconds and fraction optional), optionally
# a zone; the separators people use. Normalised to the wire's RFC 3339, then
# parsed by the wire's own rules, which check month lengths, hours and offsets.
_CALENDAR = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})"
    r"(?:[Tt ](?P<hm>\d{2}:\d{2})(?P<sec>:\d{2}(?:\.\d+)?)?)?"
    r"(?P<zone>[Zz]|[+-]\d{2}:\d{2})?\Z"
)
_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86_400, "day": 86_400, "days": 86_400,
    "w": 604_800, "week": 604_800, "weeks": 604_800,
}
_PART = re.compile(r"\s*(\d+)\s*([a-z]+)")
_DURATION = re.compile(r"(?:\s*\d+\s*[a-z]+)+\s*\Z")

ACCEPTED = ("RFC 3339 like 2026-05-02T10:00:00Z, a date like 2026-05-02 (UTC midnight), "
            "a duration before now like 2h or 3d, or now, today, yesterday")


class TimeInputError(ValueError):
    """A time a person typed that we cannot read; the message says so, in one line."""


def parse_instant(text: str, flag: str, now: int | None = None) -> int:
    """Unix nanoseconds of ``text``; :class:`TimeInputError` naming ``flag``
    otherwise. ``now`` (Unix nanoseconds) anchors relative times; the clock
    by default."""
    ns = _parse(text.strip(), time.time_ns() if now is None else now)
    if ns is None:
        raise TimeInputError(f"{flag} {text!r} is not a time: give {ACCEPTED}")
    if not gotime.printable(ns):
        raise TimeInputError(f"{flag} {text!r} is outside years 0000 to 9999")
    return ns


def wire_time(text: str, flag: str, now: int | None = None) -> str:
    """:func:`parse_instant` written as the RFC 3339 a request carries (UTC)."""
    return gotime.format_nano(parse_instant(text, flag, now))


def parse_datetime(text: str, flag: str, now: int | None = None) -> dt.datetime:
    """:func:`parse_instant` as an aware UTC datetime (microseconds kept)."""
    ns = parse_instant(text, flag, now)
    try:
        return _EPOCH + dt.timedelta(microseconds=ns // 1000)
    except OverflowError:
        raise TimeInputError(f"{flag} {text!r} is outside years 1 to 9999") from None


def _parse(text: str, now: int) -> int | None:
    word = text.lower()
    if word == "now":
        return now
    if word in ("today", "yesterday"):
        midnight = now - now % gotime.DAY_NS
        return midnight - (gotime.DAY_NS if word == "yesterday" else 0)
    m = _CALENDAR.match(text)
    if m is not None:
        clock = f"{m['hm']}{m['sec'] or ':00'}" if m["hm"] else "00:00:00"
        zone = (m["zone"] or "Z").upper()
        return gotime.parse_wire(f"{m['date']}T{clock}{zone}")
    word = word.removesuffix("ago").rstrip()
    if _DURATION.match(word):
        seconds = 0
        for count, unit in _PART.findall(word):
            if unit not in _UNITS:
                return None
            seconds += int(count) * _UNITS[unit]
        return now - seconds * gotime.NS
    return None
