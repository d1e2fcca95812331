"""Times people type: RFC 3339, dates, durations before now, today and
yesterday, read by one parser (``streamd.cli.timeinput``) for search and log
alike, all in UTC; an unreadable time is exit 2 with one line naming the flag,
whichever command it was given to."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from streamd.cli import main
from streamd.cli.timeinput import TimeInputError, parse_datetime, parse_instant, wire_time
from streamd.golang import gotime

# 2026-05-02T15:30:45.5Z
NOW = gotime.parse("2026-05-02T15:30:45.5Z")
H = 3600 * gotime.NS


def at(text: str) -> int:
    t = gotime.parse(text)
    assert t is not None
    return t


@pytest.mark.parametrize(("typed", "instant"), [
    ("2026-05-02T10:00:00Z", at("2026-05-02T10:00:00Z")),
    ("2026-05-02T12:00:00+02:00", at("2026-05-02T10:00:00Z")),
    ("2026-05-02T10:00:00.25Z", at("2026-05-02T10:00:00.25Z")),
    ("2026-05-02", at("2026-05-02T00:00:00Z")),
    ("2026-05-02T10:00", at("2026-05-02T10:00:00Z")),
    ("2026-05-02 10:00:00", at("2026-05-02T10:00:00Z")),
    ("2026-05-02 10:00:00.000Z", at("2026-05-02T10:00:00Z")),  # as `log` prints times
    ("2026-05-02t10:00:00z", at("2026-05-02T10:00:00Z")),
    ("now", NOW),
    ("today", at("2026-05-02T00:00:00Z")),
    ("yesterday", at("2026-05-01T00:00:00Z")),
    ("Yesterday", at("2026-05-01T00:00:00Z")),
    ("2h", NOW - 2 * H),
    ("90m", NOW - 90 * 60 * gotime.NS),
    ("1h30m", NOW - 90 * 60 * gotime.NS),
    ("3d", NOW - 72 * H),
    ("1w", NOW - 168 * H),
    ("2 hours ago", NOW - 2 * H),
    ("45s ago", NOW - 45 * gotime.NS),
])
def test_what_people_type_reads_as_the_instant_they_mean(typed, instant):
    assert parse_instant(typed, "--since", now=NOW) == instant


def test_dates_and_yesterday_are_utc_midnights_whatever_the_local_zone(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14
    time.tzset()
    try:
        assert wire_time("2026-05-02", "--since", now=NOW) == "2026-05-02T00:00:00Z"
        assert wire_time("yesterday", "--since", now=NOW) == "2026-05-01T00:00:00Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize("typed", [
    "", "soon", "2x", "2026-02-30", "2026-13-01", "2026-05-02T25:00:00Z", "10000-01-01",
    "2026-05-02T10:00:00+24:00", "h", "2", "-2h", "tomorrow",
])
def test_what_is_not_a_time_is_refused_naming_the_flag(typed):
    with pytest.raises(TimeInputError) as e:
        parse_instant(typed, "--until", now=NOW)
    message = str(e.value)
    assert message.startswith(f"--until {typed!r} is not a time: give RFC 3339")
    assert "\n" not in message


def test_a_time_outside_what_the_wire_can_write_is_refused():
    with pytest.raises(TimeInputError, match="outside years 0000 to 9999"):
        parse_instant("99999999d", "--since", now=NOW)
    with pytest.raises(TimeInputError, match="outside years 1 to 9999"):
        parse_datetime("0000-06-01", "--timestamp", now=NOW)


# --- the same parser, and the same exit code, in every command --------------------


@pytest.fixture
def stream(recall_world):
    w = recall_world
    return w.write(
        "a.jsonl",
        w.rec("r1", "2026-05-02T10:00:00Z", title="Deploy alpha", text="alpha went out"),
        w.rec("r2", "2026-05-02T10:05:00Z", title="Rollback", text="alpha rolled back"),
        w.rec("r3", "2026-05-03T09:00:00Z", title="Again", text="alpha again"),
    )


@pytest.mark.parametrize("argv", [
    ["search", "alpha", "{stream}", "--since", "{bad}"],
    ["search", "alpha", "{stream}", "--until", "{bad}"],
    ["search", "alpha", "{stream}", "--as-of", "{bad}"],
    ["log", "--db", "{db}", "append", "--app", "a", "--user", "u", "--session", "s",
     "--author", "me", "--timestamp", "{bad}"],
    ["log", "--db", "{db}", "boots", "--since", "{bad}"],
])
def test_an_unreadable_time_is_exit_2_in_search_and_log_alike(argv, stream, tmp_path, capsys):
    argv = [a.format(stream=stream, db=tmp_path / "ev.db", bad="2026-05-02 noon")
            for a in argv]
    flag = argv[-2]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"streamd: {flag} '2026-05-02 noon' is not a time: give RFC 3339")
    assert len(err.splitlines()) == 1


def ids(capsys) -> list[str]:
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return [row["source_record_id"] for row in rows if row["type"] == "hit"]


def test_search_takes_dates_and_zoneless_times_as_utc(stream, capsys):
    assert main(["search", "alpha", str(stream), "--json", "--since", "2026-05-03"]) == 0
    assert ids(capsys) == ["r3"]
    assert main(["search", "alpha", str(stream), "--json", "--since", "2026-05-02T10:04",
                 "--until", "2026-05-03"]) == 0
    assert ids(capsys) == ["r2"]
    # Every record is after midnight of May 2: nothing, and grep's exit 1.
    assert main(["search", "alpha", str(stream), "--json", "--until", "2026-05-02"]) == 1
    assert ids(capsys) == []


def test_search_takes_durations_and_yesterday(stream, capsys):
    # The stream is in 2026; from any clock after it, records are days old.
    assert main(["search", "alpha", str(stream), "--json", "--until", "1h"]) == 0
    assert sorted(ids(capsys)) == ["r1", "r2", "r3"]
    code = main(["search", "alpha", str(stream), "--json", "--since", "yesterday"])
    assert code == (0 if dt.datetime.now(dt.UTC).date() <= dt.date(2026, 5, 4) else 1)
    capsys.readouterr()


def test_log_append_stores_a_typed_date_as_utc_midnight(tmp_path, capsys):
    db = str(tmp_path / "ev.db")
    at = ["--app", "a", "--user", "u", "--session", "s", "--author", "me", "--text", "hi"]
    assert main(["log", "--db", db, "append", *at, "--timestamp", "2026-05-02"]) == 0
    assert main(["log", "--db", db, "append", *at, "--timestamp", "2h"]) == 0
    capsys.readouterr()
    assert main(["log", "--db", db, "since", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    stamps = [json.loads(ln)["event"]["timestamp"] for ln in lines]
    assert stamps[0] == "2026-05-02T00:00:00Z"
    two_hours_ago = dt.datetime.fromisoformat(stamps[1])
    expected = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    assert abs((two_hours_ago - expected).total_seconds()) < 60
