"""Instants with nanosecond precision, parsed and printed the way Go does.

Python's ``datetime`` stops at microseconds and at year 1, while the reference
keeps nanoseconds and accepts year 0000, so an instant here is a plain ``int``:
nanoseconds since the Unix epoch, in UTC, with no range limit.

Parsing follows what the reference accepts in a JSON record (measured, see
RECALL-ADAPTER-NOTES): ``YYYY-MM-DDTHH:MM:SS[.,]fraction?(Z|±HH:MM)`` with an
uppercase ``T`` and ``Z``, a comma or a period before the fraction, more than
nine fraction digits truncated, offset hours up to 24, seconds below 60.
"""

from __future__ import annotations

import re
from functools import lru_cache

NS = 1_000_000_000
DAY_NS = 86_400 * NS

_RFC3339 = re.compile(
    rb"(\d{4})-(\d{2})-(\d{2})T(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))\Z"
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# 0001-01-01T00:00:00Z, Go's zero time: a record carrying it has no event time.
ZERO_TIME = -62_135_596_800 * NS


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (any year)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719_468
    era = days // 146_097
    doe = days - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


@lru_cache(maxsize=4096)
def _day_seconds(date: bytes) -> int | None:
    """Seconds at the start of a YYYY-MM-DD day, or None for no such day.
    Cached: a stream's records fall on few distinct days."""
    year, month, day = int(date[0:4]), int(date[5:7]), int(date[8:10])
    if not 1 <= month <= 12:
        return None
    limit = 29 if month == 2 and _is_leap(year) else _DAYS_IN_MONTH[month - 1]
    if not 1 <= day <= limit:
        return None
    return days_from_civil(year, month, day) * 86_400


def parse(text: str | bytes) -> int | None:
    """An RFC 3339 instant as Unix nanoseconds, or None when Go would refuse it."""
    raw = text.encode() if isinstance(text, str) else text
    m = _RFC3339.match(raw)
    if m is not None and m.group(8) is not None and len(m.group(4)) == 2:
        # The usual shape, UTC with a two-digit hour: the day comes from the cache.
        day = _day_seconds(raw[:10])
        hour, minute, sec = int(raw[11:13]), int(raw[14:16]), int(raw[17:19])
        if day is None or hour > 23 or minute > 59 or sec > 59:
            return None
        frac = m.group(7)
        nanos = int(frac[:9].ljust(9, b"0")) if frac else 0
        return (day + hour * 3600 + minute * 60 + sec) * NS + nanos
    if m is None:
        return None
    year, month, day, hour, minute, sec = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    if not 1 <= month <= 12 or hour > 23 or minute > 59 or sec > 59:
        return None
    limit = 29 if month == 2 and _is_leap(year) else _DAYS_IN_MONTH[month - 1]
    if not 1 <= day <= limit:
        return None
    frac = m.group(7)
    nanos = int(frac[:9].ljust(9, b"0")) if frac else 0
    offset = 0
    if m.group(8) is None:
        off_h, off_m = int(m.group(10)), int(m.group(11))
        if off_h > 24 or off_m > 60:
            return None
        offset = (off_h * 3600 + off_m * 60) * (1 if m.group(9) == b"+" else -1)
    secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + sec - offset
    return secs * NS + nanos


# What the protocol schemas' "date-time" format admits (RFC 3339 proper):
# two-digit hour, a period before the fraction, offsets within 23:59.
_WIRE = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)\Z"
)


def parse_wire(text: str) -> int | None:
    """A timestamp in a request: the schema's date-time format, then Go's parser."""
    if not _WIRE.match(text):
        return None
    return parse(text)


# 0000-01-01T00:00:00Z and 10000-01-01T00:00:00Z.
_FIRST_PRINTABLE = days_from_civil(0, 1, 1) * DAY_NS
_PAST_PRINTABLE = days_from_civil(10000, 1, 1) * DAY_NS


def printable(t: int) -> bool:
    """Go refuses to write a year outside 0000-9999 as RFC 3339."""
    return _FIRST_PRINTABLE <= t < _PAST_PRINTABLE


def format_nano(t: int) -> str:
    """RFC 3339 in UTC with the fraction's trailing zeros trimmed (Go's RFC3339Nano)."""
    base = format_seconds(t)
    nanos = t % NS
    if not nanos:
        return base
    return f"{base[:-1]}.{nanos:09d}".rstrip("0") + "Z"


def format_seconds(t: int) -> str:
    """RFC 3339 in UTC, whole seconds (Go's RFC3339)."""
    days, rem = divmod(t // NS, 86_400)
    year, month, day = civil_from_days(days)
    hour, rem = divmod(rem, 3600)
    minute, sec = divmod(rem, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{sec:02d}Z"


