"""``streamd status``'s event-log line, from the daemon's ``streamd/status``
fields: which connect under way it names, and who waits for it."""

from __future__ import annotations

from typing import Any

from streamd.resident.control import event_log_line

DB = "postgresql://agent@db.internal/events"


def status(**fields: Any) -> dict[str, Any]:
    return {"db": DB, "db_connecting_s": None, "db_reconnecting_s": None, **fields}


def test_a_watchs_first_connect_unanswered_is_not_said_to_hold_calls() -> None:
    # The log's own connections serve; only a watch's listening connection
    # waits for a server that accepts and never answers. Before: "connecting
    # to ... (no answer yet; calls wait for it)", a daemon that served.
    line = event_log_line(status(db_connecting_s=12.3, db_calls_wait=False))
    assert line == f"{DB} (a watch's connect unanswered for 12 s; watches poll meanwhile)"


def test_a_watchs_reconnect_unanswered_is_not_said_to_hold_calls() -> None:
    line = event_log_line(status(db_connecting_s=12.3, db_reconnecting_s=42.0,
                                 db_calls_wait=False))
    assert line == (f"reconnecting to {DB} for 42 s (a watch's attempt unanswered for 12 s;"
                    " watches poll meanwhile)")


def test_a_connect_calls_wait_for_is_said_to_hold_them() -> None:
    assert event_log_line(status(db_connecting_s=12.3, db_calls_wait=True)) == (
        f"connecting to {DB} for 12 s (no answer yet; calls wait for it)")
    assert event_log_line(status(db_connecting_s=12.3, db_reconnecting_s=42.0,
                                 db_calls_wait=True)) == (
        f"reconnecting to {DB} for 42 s (an attempt unanswered for 12 s; calls wait for it)")


def test_a_daemon_without_the_field_is_read_as_it_meant() -> None:
    # Its status came before watches' connects counted: all were calls'.
    assert event_log_line(status(db_connecting_s=5.0)).endswith("calls wait for it)")
    assert event_log_line(status()) == DB
