"""Retention's edges the store's model test found (``test_store_model.py``):
an idle session kept for a watch by its history rather than by the events
the watch still needs, and a policy's largest count overflowing the walk
that finds where a session is cut. Against every backend (``fx``).
"""

from __future__ import annotations

from support.store_contract import SECOND, T0, Fixture, ap, ev

from streamd.eventlog.model import SinceParams, from_us
from streamd.eventlog.model.base import MAX_INT
from streamd.eventlog.retention import Bounds, Step

DAY = 86_400 * SECOND
B = Bounds()


def test_an_idle_session_holding_nothing_a_watch_needs_goes_though_its_last_seq_is_past_it(
    fx: Fixture,
) -> None:
    # A watch needs the events after what it was sent, not a session's
    # history. The session's events went by age (no watch was open then);
    # judged by its last_seq, past the watch's 1, it stayed empty and idle
    # for as long as the watch lagged behind.
    watched = fx.store.append(ap(ev("e0"), session="watched"), T0).seq
    fx.store.append(ap(ev("e1", timestamp=from_us(T0 - 10 * DAY)), session="aged"), T0)
    assert fx.store.drop_old_events("app", T0 - DAY, None, T0, None, B).events == 1
    now = T0 + 2 * DAY
    assert fx.store.drop_idle_sessions("app", now - DAY, watched - 1, now, None, B) == Step(
        events=0, rows=0, sessions=1
    )
    assert [s.session for s in fx.store.list_sessions("app", None)] == ["watched"]


def test_a_policy_keeping_more_events_than_any_session_holds_trims_nothing_and_fails_nothing(
    fx: Fixture,
) -> None:
    # max_events takes any count up to 2**63 - 1. Finding where a session is
    # cut walks its newest max_events + 1 entries: a LIMIT of 2**63, which no
    # backend's integer holds, so every compaction of the app failed, and
    # with it the policies of every app after it.
    for i in range(3):
        fx.store.append(ap(ev(f"e{i}"), session="s"), T0)
    step = fx.store.trim_sessions("app", MAX_INT, None, T0, None, B)
    assert (step.events, step.more) == (0, False)
    every = fx.store.since(SinceParams(from_seq=0, limit=10)).entries
    assert [e.event.id for e in every] == ["e0", "e1", "e2"]
