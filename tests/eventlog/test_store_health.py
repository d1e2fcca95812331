"""Contract tests for the storage backends: a healthy log's ping, rows that
cannot be rendered, content that is not JSON, closed and reopened stores, on
each backend in ``BACKENDS`` (see ``test_store.py``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support.store_contract import KEY, T0, Fixture, ap, ev, ids

from streamd.errors import (
    CLOSED,
    RpcError,
)
from streamd.eventlog.model import (
    LeaseAcquireParams,
    SessionCreateParams,
    SessionGetParams,
    SinceParams,
    from_us,
)
from streamd.eventlog.store import ReadShape

# --- health, errors, schema ---------------------------------------------------


def test_ping_succeeds_on_a_healthy_log(fx: Fixture) -> None:
    fx.store.ping()
    fx.store.append(ap(ev("e1")), T0)
    fx.store.ping()


def test_damaged_metadata_reads_as_null_rather_than_failing_the_replay(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1"), metadata={"caller": "a"}), T0)
    fx.raw("UPDATE events SET metadata = '[broken'", ())
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert entry.metadata is None and entry.damaged == ["metadata"]


# 10000-01-01T13:59:59Z: what 9999-12-31T23:59:59-14:00 became when it was accepted.
YEAR_10000_US = 253_402_351_199_000_000


@pytest.mark.parametrize("shape", ["decoded", "raw", "encoded"])
def test_rows_that_cannot_be_rendered_read_as_null_and_flagged_never_fail_or_vanish(
    fx: Fixture, shape: str
) -> None:
    for i in range(4):
        fx.store.append(ap(ev(f"e{i}", {"i": i}), metadata={"caller": "c"}), T0)
    fx.raw("UPDATE events SET event_time = ? WHERE event_id = 'e1'", (YEAR_10000_US,))
    fx.raw("UPDATE events SET metadata = '[broken' WHERE event_id = 'e2'", ())
    how = ReadShape.of(raw_content=shape == "raw", encoded=shape == "encoded")

    def on_the_wire(entries: list[Any]) -> list[Any]:
        return [msgspec.json.decode(msgspec.json.encode(e)) for e in entries]

    wire = on_the_wire(fx.store.since(SinceParams(limit=10), how).entries)
    assert [w["event"]["id"] for w in wire] == ["e0", "e1", "e2", "e3"]
    # Only a damaged row carries the flag; nothing else about it is lost.
    assert [w.get("damaged") for w in wire] == [None, ["event.timestamp"], ["metadata"], None]
    assert wire[1]["event"]["timestamp"] is None and wire[1]["event"]["content"] == {"i": 1}
    assert wire[2]["metadata"] is None and wire[2]["event"]["timestamp"].endswith("Z")
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session="s"), how).events
    assert on_the_wire(got) == wire
    recent = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s", recent=3), how
    ).events
    assert on_the_wire(recent) == wire[1:]


def test_content_that_is_not_json_cannot_be_stored_even_by_hand(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1", {"i": 1})), T0)
    refused, message = fx.not_json
    with pytest.raises(refused, match=message):
        fx.raw("UPDATE events SET content = '{nope'", ())
    with pytest.raises(refused, match=message):
        fx.raw(
            "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id,"
            " author, branch, event_time, content, digest)"
            " VALUES ('app', 'u', 's', 'e2', '', 'a', '', 0, 'nope', x'00')",
            (),
        )
    assert ids(fx.store) == ["e1"]
    # A file that arrives without the guard (changed by other means) still reads:
    # a decoded read reports the content instead of failing.
    fx.raw(fx.unguard, ())
    fx.raw("UPDATE events SET content = '{nope'", ())
    (entry,) = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert entry.event.content is None and entry.damaged == ["event.content"]


def test_encoded_entries_are_the_bytes_the_entries_encode_to(fx: Fixture) -> None:
    for i in range(3):
        fx.store.append(ap(ev(f"e{i}", {"i": [i, "é"]}, branch="b.x")), T0 + i)
    decoded = fx.store.since(SinceParams(from_seq=0, limit=10))
    encoded = fx.store.since(SinceParams(from_seq=0, limit=10), ReadShape.of(encoded=True))
    assert all(isinstance(e, msgspec.Raw) for e in encoded.entries)
    assert msgspec.json.encode(encoded) == msgspec.json.encode(decoded)
    assert (encoded.next_seq, encoded.caught_up) == (3, True)
    got = fx.store.get_session(
        SessionGetParams(app="app", user="u", session="s"), ReadShape.of(encoded=True)
    )
    assert msgspec.json.encode(got) == msgspec.json.encode(
        fx.store.get_session(SessionGetParams(app="app", user="u", session="s"))
    )


def test_a_session_boot_or_lease_with_unrenderable_values_reads_with_nulls(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1")), T0)
    fx.store.create_session(
        SessionCreateParams(app="app", user="u", session="s2", state={"k": 1}), T0
    )
    fx.raw(
        "UPDATE sessions SET state = 'oops', created_at = ? WHERE session_id = 's2'",
        (YEAR_10000_US,),
    )
    got = fx.store.get_session(SessionGetParams(app="app", user="u", session="s2"))
    assert (got.state, got.created_at, got.updated_at) == (None, None, from_us(T0))
    assert [s.state for s in fx.store.list_sessions("app", None)] == [{}, None]
    boot = fx.store.record_boot(T0, ["s"])
    fx.raw("UPDATE boots SET boot_at = ? WHERE id = ?", (YEAR_10000_US, boot))
    assert [(b.id, b.boot_at) for b in fx.store.recent_boots(0)] == [(boot, None)]
    fx.store.acquire_lease(
        LeaseAcquireParams(app=KEY[0], user=KEY[1], session=KEY[2], stale_after_ms=30_000), "h", T0
    )
    fx.raw("UPDATE leases SET acquired_at = ?", (YEAR_10000_US,))
    (lease,) = fx.store.list_leases()
    assert (lease.acquired_at, lease.heartbeat_at) == (None, from_us(T0))


def test_operations_on_a_closed_store_are_closed_errors(fx: Fixture) -> None:
    fx.close()
    with pytest.raises(RpcError) as info:
        fx.store.latest_seq(None)
    assert info.value.code == CLOSED


def test_reopening_keeps_everything(fx: Fixture) -> None:
    fx.store.append(ap(ev("e1")), T0)
    again = fx.reopen()
    assert [e.event.id for e in again.since(SinceParams(from_seq=0, limit=10)).entries] == ["e1"]
    assert again.append(ap(ev("e1")), T0).duplicate
