"""Instants the way Go's RFC 3339 parser reads and prints them.

Expected instants are computed with ``calendar.timegm`` (plus nanoseconds by
hand), never with the module under test.
"""

from __future__ import annotations

import calendar

import pytest

from streamd.golang import gotime

NS = 1_000_000_000


def utc(y, mo, d, h=0, mi=0, s=0, nanos=0) -> int:
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) * NS + nanos


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-05-02T09:12:00Z", utc(2026, 5, 2, 9, 12)),
        # +24:00 is accepted: the instant is 24 hours earlier than the wall time.
        ("2026-05-02T09:12:00+24:00", utc(2026, 5, 1, 9, 12)),
        ("2026-05-02T09:12:00-02:30", utc(2026, 5, 2, 11, 42)),
        # A comma may introduce the fraction.
        ("2026-05-02T09:12:00,5Z", utc(2026, 5, 2, 9, 12, 0, 500_000_000)),
        ("2026-05-02T09:12:00.000000001Z", utc(2026, 5, 2, 9, 12, 0, 1)),
        # More than nine fraction digits are truncated, not rounded.
        ("2026-05-02T09:12:00.1234567899999Z", utc(2026, 5, 2, 9, 12, 0, 123_456_789)),
        ("2024-02-29T00:00:00Z", utc(2024, 2, 29)),
        # Year 0000 (a leap year) is accepted; 0000-01-01 is 719528 days before 1970.
        ("0000-01-01T00:00:00Z", -719_528 * 86_400 * NS),
        ("0000-03-01T00:00:00Z", (-719_528 + 31 + 29) * 86_400 * NS),
    ],
)
def test_accepted_forms_parse_to_the_instant(text, expected):
    assert gotime.parse(text) == expected
    assert gotime.parse(text.encode()) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-05-02t09:12:00Z",  # lowercase t
        "2026-05-02T09:12:00z",  # lowercase z
        "2026-05-02 09:12:00Z",  # space separator
        "2026-05-02T23:59:60Z",  # leap second
        "2026-05-02T09:12:00+0200",  # offset without colon
        "2026-05-02T09:12:00+02",  # offset without minutes
        "2026-05-02T09:12:00",  # no offset at all
        "2026-05-02T09:12:00.Z",  # a fraction needs a digit
        "2026-05-02T24:00:00Z",
        "2026-02-29T00:00:00Z",  # not a leap year
        "2026-04-31T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-05-02T09:12:00+25:00",
        "2026-05-02T09:12:00Z ",
        "",
    ],
)
def test_rejected_forms_do_not_parse(text):
    assert gotime.parse(text) is None


def test_a_one_digit_hour_is_accepted_like_go():
    assert gotime.parse("2026-05-02T9:12:00Z") == utc(2026, 5, 2, 9, 12)


def test_zero_time_constant_is_year_one():
    assert utc(1, 1, 1) == gotime.ZERO_TIME


@pytest.mark.parametrize(
    ("instant", "text"),
    [
        (utc(2026, 5, 2, 9, 12), "2026-05-02T09:12:00Z"),
        (utc(2026, 5, 2, 9, 12, 0, 500_000_000), "2026-05-02T09:12:00.5Z"),
        (utc(2026, 5, 2, 9, 12, 0, 120_000_000), "2026-05-02T09:12:00.12Z"),
        (utc(2026, 5, 2, 9, 12, 0, 1), "2026-05-02T09:12:00.000000001Z"),
        (utc(2026, 5, 2, 9, 12, 0, 100), "2026-05-02T09:12:00.0000001Z"),
        # Before the epoch the fraction still counts up from the whole second below.
        (-NS // 2, "1969-12-31T23:59:59.5Z"),
        (-719_528 * 86_400 * NS, "0000-01-01T00:00:00Z"),
    ],
)
def test_nano_format_is_utc_with_trailing_fraction_zeros_trimmed(instant, text):
    assert gotime.format_nano(instant) == text


@pytest.mark.parametrize(
    ("instant", "text"),
    [
        (utc(2026, 5, 2, 9, 12, 0, 999_999_999), "2026-05-02T09:12:00Z"),
        (utc(2026, 5, 2, 9, 12, 7), "2026-05-02T09:12:07Z"),
        (-1, "1969-12-31T23:59:59Z"),
    ],
)
def test_whole_second_format_truncates_the_fraction(instant, text):
    assert gotime.format_seconds(instant) == text


def test_an_offset_is_printed_back_in_utc():
    assert gotime.format_nano(gotime.parse("2026-05-02T09:12:00.250+02:00")) == (
        "2026-05-02T07:12:00.25Z"
    )
