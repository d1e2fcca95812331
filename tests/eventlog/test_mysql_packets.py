"""The MySQL backend and the server's ``max_allowed_packet``: what one statement
may carry. Appends queued together are written in runs that fit; an event, or
a state grown by many deltas, that cannot fit alone is refused alone, before
anything is sent, and the connection and the rest of its group commit live on.
Every test needs the MariaDB server of ``mysql_server`` (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.mysql_store import T0, ap

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.model import AppendParams, Event, LeaseAcquireParams, StateDelta
from streamd.eventlog.mysql import packets
from streamd.eventlog.mysql.store import MysqlStore
from streamd.eventlog.store import LeaseKey, rows


def test_appends_queued_together_past_the_servers_packet_limit_all_commit(
    open_mysql_store: Callable[..., MysqlStore],
) -> None:
    # 24 events of 1 MB, each well under the frame limit, were one INSERT of
    # 24 MB: over the test server's max_allowed_packet (16 MiB, MariaDB's
    # default), which drops the connection, and most of them failed.
    store = open_mysql_store()
    big = [ap(f"big{i}", content="x" * 1_000_000) for i in range(24)]
    out = store.append_commit(big, T0, capture=False)
    assert [getattr(r, "seq", r) for r in out.results] == list(range(1, 25))
    assert store.newest_seq() == 24


def test_an_event_too_big_for_the_servers_packet_limit_fails_alone_and_clearly(
    open_mysql_store: Callable[..., MysqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 M quotes were 10 MB of JSON text and 20 MB escaped in the INSERT: over
    # the test server's max_allowed_packet (16 MiB). Sent, it dropped the
    # connection under the whole group commit: the small appends queued with
    # it failed too, all told they "may or may not have committed". An event
    # is now at most MAX_ENTRY_BYTES of JSON, at most twice that escaped, which
    # 16 MiB holds: a server whose max_allowed_packet is 4 MiB, then, and 2 M
    # quotes (4 MB of JSON, 8 MB escaped).
    monkeypatch.setattr(packets, "max_packet", lambda conn: 4 << 20)
    store = open_mysql_store()
    before = store.connection
    out = store.append_commit(
        [ap("small1"), ap("huge", content='"' * 2_000_000), ap("small2")], T0, capture=False
    )
    small1, huge, small2 = out.results
    assert (getattr(small1, "seq", small1), getattr(small2, "seq", small2)) == (1, 2)
    assert isinstance(huge, RpcError) and huge.code == INVALID_PARAMS
    assert "max_allowed_packet" in huge.message and "huge" in huge.message
    assert store.connection is before  # the connection was never dropped
    assert store.newest_seq() == 2


def test_a_state_grown_past_the_packet_limit_refuses_its_next_delta_alone_and_clearly(
    open_mysql_store: Callable[..., MysqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app's state is written whole: deltas of 6 MB made a third UPDATE of
    # 18 MB, over the test server's max_allowed_packet (16 MiB), which dropped
    # the connection under the group commit, every append in it failing, the
    # other app's too, and so on for every delta. A state is now at most
    # MAX_STATE_BYTES (1 MiB): a server whose max_allowed_packet is 512 KiB,
    # then, and deltas of 200 kB.
    monkeypatch.setattr(packets, "max_packet", lambda conn: 512 << 10)
    store = open_mysql_store()

    def grow(i: int) -> list[Any]:
        big = AppendParams(
            app="big", user="u", session="s",
            event=Event(id=f"grow{i}", author="agent", content=None),
            state_delta=StateDelta(app={f"k{i}": "x" * 200_000}),
        )
        out = store.append_commit([big, ap(f"other{i}", app="other")], T0, capture=False)
        return out.results

    assert [r.seq for r in grow(0) + grow(1)] == [1, 2, 3, 4]
    before = store.connection
    refused, other = grow(2)
    assert isinstance(refused, RpcError) and refused.code == INVALID_PARAMS
    assert "max_allowed_packet" in refused.message and "app_states" in refused.message
    assert getattr(other, "seq", other) == 5  # the rest of the batch commits
    assert store.connection is before  # the connection was never dropped
    assert sorted(store.get_state("big", None, None, None).app) == ["k0", "k1"]


def test_a_state_write_a_few_bytes_over_the_limit_is_refused_not_sent(
    open_mysql_store: Callable[..., MysqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check measured a statement as its text plus 4 bytes a value: a
    # number's digits and the packet's command byte went uncounted, so an
    # UPDATE a few bytes past max_allowed_packet passed it, and the server
    # dropped the connection under the whole group commit. (A server whose
    # limit a state can reach: at most MAX_STATE_BYTES, 1 MiB, since.)
    monkeypatch.setattr(packets, "max_packet", lambda conn: 512 << 10)
    store = open_mysql_store()
    conn = store.connection
    limit = packets.max_packet(conn)
    update = "UPDATE app_states SET state = %s, updated_at = %s WHERE app_name = %s"

    def packet(state: dict[str, str]) -> int:
        # The packet the driver sends: the command byte, then the statement.
        values = (conn.literal(rows.json_text(state)), conn.literal(T0), conn.literal("big"))
        return 1 + len(update.encode() % values)

    # Thirds: an event (its delta included) is at most MAX_ENTRY_BYTES.
    third = limit // 3
    grown = {"k0": "x" * third, "k1": "x" * third}
    first = store.append_commit(
        [_grows("big", 0, "k0", third), _grows("big", 1, "k1", third)], T0, capture=False
    ).results
    assert [getattr(r, "seq", r) for r in first] == [1, 2]
    # The third delta's UPDATE is one byte over the limit.
    rest = limit - packet({**grown, "k2": ""}) + 1
    assert packet({**grown, "k2": "x" * rest}) == limit + 1
    before = store.connection
    refused, other = store.append_commit(
        [_grows("big", 2, "k2", rest), ap("other", app="other")], T0, capture=False
    ).results
    assert isinstance(refused, RpcError) and refused.code == INVALID_PARAMS
    assert "max_allowed_packet" in refused.message
    assert getattr(other, "seq", other) == 3  # the rest of the batch commits
    assert store.connection is before  # the connection was never dropped


def _grows(app: str, i: int, key: str, size: int) -> AppendParams:
    return AppendParams(
        app=app, user="u", session="s", event=Event(id=f"grow{i}", author="agent", content=None),
        state_delta=StateDelta(app={key: "x" * size}),
    )


def test_the_heartbeats_of_many_long_named_leases_go_in_statements_that_fit_the_packet(
    open_mysql_store: Callable[..., MysqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A log's due heartbeats are one store call whatever their number: named
    # in one statement, the keys of a hundred leases with long session names
    # are over a 64 KiB max_allowed_packet, which refused the statement and
    # failed every beat of the call, the short-named leases' too.
    monkeypatch.setattr(packets, "max_packet", lambda conn: 64 << 10)
    sent: list[str] = []
    real = packets.refuse_long_statement

    def measured(query: str, args: tuple[object, ...], max_packet: int) -> None:
        sent.append(query)
        real(query, args, max_packet)

    monkeypatch.setattr(packets, "refuse_long_statement", measured)
    store = open_mysql_store(lease_clock="caller")
    keys = []
    for i in range(100):
        session = f"s{i:03d}-" + "\U0001d11e" * 240  # four bytes each
        store.acquire_lease(LeaseAcquireParams(app="app", user="u", session=session), f"h{i}", T0)
        keys.append(LeaseKey("app", "u", session, f"h{i}"))
    before = store.connection
    sent.clear()
    assert store.heartbeat_leases(keys, T0 + 1_000_000) == [True] * 100
    updates = [q for q in sent if q.startswith("UPDATE leases")]
    assert len(updates) > 1 and [q for q in sent if "leases" in q] == updates
    assert store.connection is before  # the connection was never dropped
