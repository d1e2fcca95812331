"""Retention in bounded steps: no transaction removes more than the bound,
whatever the policy and however big a session is; a session being dropped
goes from its old end and its row goes with its newest event; appends commit
between the steps of one compaction; and the steps keep what one transaction
per rule kept.

The bound is checked through what each step reports (the store's
:class:`~streamd.eventlog.retention.Step`, and the EventLog's observer), never
by timing. Everything runs on both backends.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.store_contract import SECOND, T0, Fixture, ap, ev

from streamd.eventlog import EventLog
from streamd.eventlog.model import (
    LeaseAcquireParams,
    RetentionPolicy,
    SessionCreateParams,
    SessionGetParams,
    SinceParams,
    StateDelta,
    from_us,
)
from streamd.eventlog.retention import Bounds, Rule, Step, apply
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.store import Backend

DAY = 86_400 * SECOND
HOLDER = "h/1/aaaaaaaa"


def at(us: int) -> dt.datetime:
    return from_us(us)


def until_done(step: Callable[[Step | None], Step]) -> Iterator[Step]:
    """Run a store step again, given the one before, until its rule is done."""
    got = None
    while True:
        got = step(got)
        yield got
        if not got.more:
            return


def session_ids(store: Backend, app: str, session: str) -> list[str] | None:
    """The session's event ids, or None when the session is gone."""
    if session not in {s.session for s in store.list_sessions(app, None)}:
        return None
    return [
        e.event.id
        for e in store.get_session(SessionGetParams(app=app, user="u", session=session)).events
    ]


def fill(store: Backend, app: str, session: str, n: int, at_us: int = T0, **kw: Any) -> list[str]:
    made = [f"{app}-{session}-{i}" for i in range(n)]
    for start in range(0, n, 1000):
        store.append_batch(
            [ap(ev(i, **kw), app=app, session=session) for i in made[start : start + 1000]], at_us
        )
    return made


# --- each rule, step by step, on the store ------------------------------------------


def test_a_long_session_is_trimmed_oldest_first_within_the_bound(fx: Fixture) -> None:
    made = fill(fx.store, "app", "s", 30)
    seen: list[Step] = []
    for step in until_done(
        lambda prev: fx.store.trim_sessions("app", 3, None, T0, prev, Bounds(events=7))
    ):
        seen.append(step)
        left = session_ids(fx.store, "app", "s")
        # A reader between steps sees a suffix: the oldest went first.
        assert left is not None and left == made[len(made) - len(left) :] and len(left) >= 3
    assert [s.rows for s in seen] == [7, 7, 7, 6]
    assert session_ids(fx.store, "app", "s") == made[-3:]


def test_finding_where_to_cut_is_bounded_too(fx: Fixture) -> None:
    for name in ("s0", "s1", "s2", "s3", "s4", "s5"):
        fill(fx.store, "app", name, 3)  # under the limit: nothing to cut, a walk each
    # Each walk reads the session's 3 index entries (it may read up to
    # max_events + 1 = 5): three sessions fit a step's 10; the fourth's walk,
    # cut at the 1 entry left, cannot tell and is walked again next step.
    steps = list(
        until_done(lambda prev: fx.store.trim_sessions("app", 4, None, T0, prev, Bounds(events=10)))
    )
    assert [s.cursor for s in steps] == [("u", "s3"), None]
    assert sum(s.events for s in steps) == 0


def test_sessions_within_a_generous_limit_cost_a_step_for_what_they_hold(fx: Fixture) -> None:
    # Charged the limit (1,001 entries) each, every session took a step of its
    # own: a committed transaction per session of the log, 10,000 of them (26 s
    # on PostgreSQL) for a compaction that removed nothing.
    for i in range(20):
        fill(fx.store, "app", f"s{i:02}", 3)
    steps = list(
        until_done(lambda prev: fx.store.trim_sessions(
            "app", 1000, None, T0, prev, Bounds(events=100)))
    )
    assert len(steps) == 1
    assert sum(s.events for s in steps) == 0


def test_an_idle_session_goes_from_its_old_end_and_its_row_with_its_newest_event(
    fx: Fixture,
) -> None:
    made = [f"e{i}" for i in range(12)]
    for i, event_id in enumerate(made):
        delta = StateDelta(session={"k": i}, user={"u": i}) if i % 3 == 0 else None
        fx.store.append(ap(ev(event_id), session="old", state_delta=delta), T0)
    fill(fx.store, "app", "new", 2, at_us=T0 + 10 * DAY)
    now = T0 + 10 * DAY
    steps = []
    for step in until_done(
        lambda prev: fx.store.drop_idle_sessions(
            "app", now - DAY, None, now, prev, Bounds(events=5)
        )
    ):
        steps.append(step)
        assert step.rows <= 5
        left = session_ids(fx.store, "app", "old")
        # Never a session row without its newest event.
        assert left is None or (left and left == made[len(made) - len(left) :])
        if left is not None:  # its current state is in its row until the row goes
            assert fx.store.get_state("app", "u", "old", None).session == {"k": 9}
    # 4 deltas and 12 events, 5 rows a step: the row goes in the 4th.
    assert [(s.rows, s.events, s.sessions) for s in steps] == [
        (5, 1, 0),
        (5, 5, 0),
        (5, 5, 0),
        (1, 1, 1),
    ]
    assert session_ids(fx.store, "app", "old") is None
    assert session_ids(fx.store, "app", "new") == ["app-new-0", "app-new-1"]
    assert fx.store.get_state("app", "u", None, None).user == {"u": 9}  # shared state stays


def test_old_events_go_within_the_bound(fx: Fixture) -> None:
    fill(fx.store, "app", "s", 23, timestamp=at(T0))
    now = T0 + DAY
    steps = list(
        until_done(
            lambda prev: fx.store.drop_old_events(
                "app", now - SECOND, None, now, prev, Bounds(events=10)
            )
        )
    )
    assert [s.events for s in steps] == [10, 10, 3]
    assert session_ids(fx.store, "app", "s") == []


def test_a_session_appended_to_while_being_dropped_stays_with_its_newest_events(
    fx: Fixture,
) -> None:
    made = fill(fx.store, "app", "s", 10)
    now = T0 + 10 * DAY
    first = fx.store.drop_idle_sessions("app", now - DAY, None, now, None, Bounds(events=4))
    assert (first.events, first.sessions, first.more) == (4, 0, True)
    fx.store.append(ap(ev("late"), session="s"), now)  # no longer idle
    rest = list(
        until_done(
            lambda prev: fx.store.drop_idle_sessions(
                "app", now - DAY, None, now, prev or first, Bounds(events=4)
            )
        )
    )
    assert [s.events for s in rest] == [0]
    assert session_ids(fx.store, "app", "s") == [*made[4:], "late"]


# --- the steps keep what one transaction per rule kept -------------------------------


@dataclass
class _Session:
    at_us: int
    leased: bool
    events: list[tuple[int, str, int]] = field(default_factory=list)  # (seq, id, time)


def _one_transaction_per_rule(
    sessions: dict[str, _Session], policy: RetentionPolicy, keep: int | None, now: int
) -> dict[str, list[str]]:
    """What retention kept before it was cut into steps: each rule in one go."""
    horizon = keep if keep is not None else 1 << 62
    alive = {name: list(s.events) for name, s in sessions.items()}
    if policy.idle_s is not None:
        for name, s in sessions.items():
            last_seq = max((seq for seq, _, _ in s.events), default=0)
            if s.at_us < now - policy.idle_s * SECOND and last_seq <= horizon and not s.leased:
                del alive[name]
    if policy.max_age_s is not None:
        cutoff = now - policy.max_age_s * SECOND
        for name in alive:
            if not sessions[name].leased:
                alive[name] = [e for e in alive[name] if not (e[2] < cutoff and e[0] <= horizon)]
    if policy.max_events is not None:
        n = policy.max_events
        for name, events in alive.items():
            if not sessions[name].leased and len(events) > n:
                cut = events[-n - 1][0]
                alive[name] = [e for e in events if not (e[0] <= cut and e[0] <= horizon)]
    return {name: [e[1] for e in events] for name, events in alive.items()}


_apps = itertools.count()
_sessions = st.lists(
    st.tuples(
        st.sampled_from([0, 5]),  # days since the session was last written
        st.booleans(),  # leased
        st.lists(st.integers(0, 4), max_size=8),  # each event's age in days
    ),
    min_size=1,
    max_size=4,
)
_policies = st.builds(
    RetentionPolicy,
    app=st.just("x"),
    max_age_s=st.none() | st.sampled_from([DAY // SECOND, 3 * DAY // SECOND]),
    max_events=st.none() | st.integers(1, 4),
    idle_s=st.none() | st.sampled_from([DAY // SECOND, 6 * DAY // SECOND]),
).filter(lambda p: not p.empty())


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    shape=_sessions,
    policy=_policies,
    bounds=st.builds(Bounds, events=st.integers(1, 4), sessions=st.integers(1, 3)),
)
def test_the_steps_keep_what_one_transaction_per_rule_kept(
    fx: Fixture,
    data: st.DataObject,
    shape: list[tuple[int, bool, list[int]]],
    policy: RetentionPolicy,
    bounds: Bounds,
) -> None:
    app = f"p{next(_apps)}"  # one app per example: nothing of another example counts
    policy = RetentionPolicy(
        app=app, max_age_s=policy.max_age_s, max_events=policy.max_events, idle_s=policy.idle_s
    )
    now = T0 + 6 * DAY
    sessions: dict[str, _Session] = {}
    order = [(f"s{i}", age) for i, (_, _, ages) in enumerate(shape) for age in ages]
    order = data.draw(st.permutations(order))  # the sessions' events interleave in seq
    for i, (days, leased, _) in enumerate(shape):
        sessions[f"s{i}"] = _Session(now - days * DAY, leased)
        fx.store.create_session(
            SessionCreateParams(app=app, user="u", session=f"s{i}"), now - days * DAY
        )
    for n, (name, age) in enumerate(order):
        s = sessions[name]
        event_time = now - age * DAY
        seq = fx.store.append(
            ap(ev(f"{app}-{n}", timestamp=at(event_time)), app=app, session=name), s.at_us
        ).seq
        s.events.append((seq, f"{app}-{n}", event_time))
    for name, s in sessions.items():
        if s.leased:
            fx.store.acquire_lease(
                LeaseAcquireParams(app=app, user="u", session=name, stale_after_ms=30_000),
                HOLDER,
                now,
            )
    all_seqs = sorted(seq for s in sessions.values() for seq, _, _ in s.events)
    keep = data.draw(st.none() | st.sampled_from(all_seqs)) if all_seqs else None
    expected = _one_transaction_per_rule(sessions, policy, keep, now)

    steps: list[tuple[Rule, Step]] = []

    async def run(op: Any) -> Step:
        return op(fx.store, now, keep)

    trio.run(apply, policy, run, bounds, lambda _app, rule, step: steps.append((rule, step)))
    assert all(step.rows <= bounds.events for _, step in steps)
    got = {name: session_ids(fx.store, app, name) for name in sessions}
    assert {name: ids for name, ids in got.items() if ids is not None} == expected


# --- the EventLog: the observer, and appends between the steps -----------------------


@pytest.fixture(params=["sqlite", "postgres"])
def log_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Backend]]:
    """(what EventLog opens, a store on the same database to fill it with)."""
    if request.param == "sqlite":
        path = str(tmp_path / "events.db")
        store: Backend = SqliteStore.open(path, SqliteOptions(synchronous="NORMAL"))
        where = path
    else:
        from psycopg.conninfo import conninfo_to_dict

        from streamd.eventlog.postgres.store import PostgresStore

        conninfo = request.getfixturevalue("postgres_db")
        store = PostgresStore.open(conninfo)
        dbname = conninfo_to_dict(conninfo)["dbname"]
        where = request.getfixturevalue("postgres_cluster").url(dbname)
    try:
        yield where, store
    finally:
        store.close()  # type: ignore[attr-defined]


def _count(store: Backend) -> int:
    return sum(1 for _ in store.since(SinceParams(from_seq=0, limit=100_000)).entries)


async def test_no_compaction_transaction_removes_more_than_the_bound(
    log_db: tuple[str, Backend],
) -> None:
    where, store = log_db
    n = 11_000
    trimmed = fill(store, "trim", "s", n)
    fill(store, "idle", "s", n)
    fill(store, "age", "s", n, timestamp=at(T0))
    before = _count(store)
    steps: list[tuple[str, Rule, Step]] = []
    with trio.fail_after(300):
        async with EventLog(
            where,
            synchronous="NORMAL",
            retention_interval=0,
            on_retention_step=lambda *s: steps.append(s),
        ) as log:
            await log.set_retention("trim", max_events=10)
            await log.set_retention("idle", idle_s=60)
            await log.set_retention("age", max_age_s=60)
            result = await log.compact()
            kept = [e.event.id for e in (await log.get_session("trim", "u", "s")).events]
    assert max(step.rows for _, _, step in steps) == 5000  # the default bound, reached
    for app, rule in [("trim", "max_events"), ("idle", "idle_s"), ("age", "max_age_s")]:
        mine = [step for a, r, step in steps if (a, r) == (app, rule)]
        assert sum(s.events for s in mine) == (n - 10 if app == "trim" else n)
        assert len(mine) >= 3  # 11,000 events: never fewer than three transactions
    assert result.events_deleted == sum(s.events for _, _, s in steps) == before - _count(store)
    assert result.sessions_deleted == 1
    assert kept == trimmed[-10:]


async def test_an_append_commits_between_the_steps_of_one_compaction(
    log_db: tuple[str, Backend],
) -> None:
    where, store = log_db
    fill(store, "app", "big", 5000)
    steps: list[Step] = []
    first_step = trio.Event()
    compacted = trio.Event()

    def observe(app: str, rule: Rule, step: Step) -> None:
        steps.append(step)
        first_step.set()

    with trio.fail_after(300):
        async with EventLog(
            where,
            synchronous="NORMAL",
            retention_interval=0,
            retention_bounds=Bounds(events=250),
            on_retention_step=observe,
        ) as log:
            await log.set_retention("app", max_events=1)

            async def compact() -> None:
                await log.compact()
                compacted.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(compact)
                await first_step.wait()
                await log.append("app", "u", "other", ev("during"))
                # The append was acknowledged while the compaction was still
                # going: it did not wait for the pass, only for one step.
                assert not compacted.is_set()
                steps_before_ack = len(steps)
            assert len(steps) > steps_before_ack
            got = await log.get_session("app", "u", "other")
    assert [e.event.id for e in got.events] == ["during"]
    assert len(steps) == 20 and sum(s.events for s in steps) == 4999
