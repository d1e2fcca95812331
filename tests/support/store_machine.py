"""The store model test's state machine: the operations a client can
cause (appends, sessions, leases, retention, boots) on one backend, each
judged against :mod:`support.store_model` as it is made, the model then
taking in what the store did. The reads, and the checks after every step,
are the test's own (``tests/eventlog/test_store_model.py``)."""

from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.model import (
    AppendResult,
    LeaseAcquireParams,
    RetentionPolicy,
    SessionCreateParams,
    to_us,
    validated,
)
from streamd.eventlog.retention import Bounds, StepOp, apply
from streamd.eventlog.store import AppendGroup, LeaseKey
from support import store_model_draws as draw
from support.store_contract import Fixture
from support.store_model import Append, Duplicate, GroupViews, Log, New, Policy, Refused

__all__ = ["StoreMachine", "outcome", "same_refusal"]

_TABLES = ("events", "sessions", "state_deltas", "app_states", "user_states", "leases", "boots",
           "retention", "removed_events")
"""Emptied before each example (events first: sessions are their foreign key)."""


def outcome(call: Any) -> Any:
    try:
        return call()
    except RpcError as exc:
        return exc


def same_refusal(got: Any, want: Refused, where: str) -> None:
    """The store refused as the model says: the code, and every datum the
    spec promises (the store may say more)."""
    assert isinstance(got, RpcError), f"{where}: {got!r}, the model expected error {want.code}"
    assert got.code == want.code, f"{where}: {got!r}, the model expected error {want.code}"
    for k, v in (want.data or {}).items():
        assert isinstance(got.data, dict) and got.data.get(k) == v, (where, got.data, want.data)


def run_now(coro: Any) -> Any:
    """Run a coroutine that never suspends (retention's step loop over a
    store called in place) to its end, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the step loop waited for something")


class StoreMachine(RuleBasedStateMachine):
    """One example: an emptied log on ``fx``'s backend, the model beside it,
    and a clock of its own (the time every operation is stamped with)."""

    def __init__(self, fx: Fixture, backend: str) -> None:
        super().__init__()
        self.fx = fx
        self.store = fx.store
        for table in _TABLES:
            fx.raw(f"DELETE FROM {table}", ())
        self.log = Log(backend=backend, newest=self.store.newest_seq())
        self.base = self.log.newest
        """Seqs go on from the examples before (none is given twice): a
        drawn seq is drawn past this, so each example draws as the last."""
        self.now = draw.T0
        self.mark = self.store.newest_removal()[0]
        self.sent: dict[str, Append] = {}
        """The append each stored event id was written by (what a retry resends)."""
        self.holders: list[tuple[tuple[str, str, str], str]] = []
        """Every lease acquired, held still or not (stolen, released)."""
        self.boot_ids: list[int] = []

    def teardown(self) -> None:
        if self.store is not self.fx.store:
            self.store.close()

    @rule()
    def reopen(self) -> None:
        """Another store on the same database (a daemon started again): it
        reads what the one before wrote, and the model goes on with it."""
        store = self.fx.reopen()
        if self.store is not self.fx.store:
            self.store.close()
        self.store = store

    # --- time ----------------------------------------------------------------------

    @rule(step=st.sampled_from([0, 1, 1000, 100_000, 31 * draw.SECOND, 3600 * draw.SECOND,
                                2 * 86_400 * draw.SECOND]))
    def time_passes(self, step: int) -> None:
        self.now += step

    # --- appends -------------------------------------------------------------------

    def _last_seqs(self) -> dict[tuple[str, str, str], int]:
        return {k: s.last_seq for k, s in self.log.sessions.items()}

    def _append(self, data: st.DataObject) -> Append:
        return data.draw(draw.appends(self.now, self._last_seqs(), self._seqs(0)))

    def _seqs(self, past: int) -> st.SearchStrategy[int]:
        """0 or a seq up to ``past`` beyond the newest given."""
        return st.just(0) | st.integers(0, self.log.newest - self.base + past).map(
            lambda k: self.base + k)

    def _judge(self, a: Append, got: Any, where: str) -> None:
        """One append's result against the model, which then takes it in."""
        want = self.log.plan(a)
        event(f"append: {type(want).__name__} {getattr(want, 'code', '')}")
        if isinstance(want, Refused):
            same_refusal(got, want, where)
        elif isinstance(want, Duplicate):
            assert got == AppendResult(seq=want.seq, duplicate=True), (where, got, want)
        else:
            assert isinstance(got, AppendResult) and not got.duplicate, (where, got)
            self.log.commit(a, got.seq, self.now)
            self.sent[a.id] = a

    def _judge_group(self, group: list[Append], got: Any, where: str) -> None:
        """A group: all or none. Refused, the first refusal names its index
        ("data adds its index"): the first append invalid in itself, if
        any ("refused before any append of the batch meets the log"), else
        the first the log refuses, which the model finds on a copy."""
        views = GroupViews()
        if isinstance(got, list):
            assert len(got) == len(group), (where, got)
            for i, (a, one) in enumerate(zip(group, got, strict=True)):
                a = views.expecting(a)
                self._judge(a, one, f"{where}[{i}]")
                views.took(self.log, a, one.seq, one.duplicate)
            return
        event("append: a group refused")
        invalid = [i for i, a in enumerate(group) if self.log.invalid(a)]
        if invalid:
            same_refusal(got, Refused(INVALID_PARAMS, {"index": invalid[0]}), where)
            return
        trial = self.log.copy()
        for i, a in enumerate(group):
            a = views.expecting(a)
            want = trial.plan(a)
            if isinstance(want, Refused):
                same_refusal(got, Refused(want.code, {"index": i}), where)
                if want.data and "expected_seq" in want.data:
                    assert got.data["expected_seq"] == want.data["expected_seq"], (where, got.data)
                return
            if isinstance(want, New):
                trial.commit(a, trial.newest + 1, self.now)
                views.took(trial, a, trial.newest, duplicate=False)
            else:
                views.took(trial, a, want.seq, duplicate=True)
        raise AssertionError(f"{where}: the store refused {got!r}; the model takes every append")

    @initialize(data=st.data())
    def some_history(self, data: st.DataObject) -> None:
        """A few events to begin with, so that the first steps meet some."""
        for _ in range(data.draw(st.integers(0, 6))):
            self.append(data, 0)

    @rule(data=st.data(), offset=st.integers(0, 2))
    def append(self, data: st.DataObject, offset: int) -> None:
        a = self._append(data)
        self._judge(a, outcome(lambda: self.store.append(draw.params(a, offset), self.now)),
                    "append")

    @rule(data=st.data())
    def append_batch(self, data: st.DataObject) -> None:
        """A group commit of several requests: "An event that conflicts ...
        fails alone and the others still commit"; a group
        (``eventlog/append_batch``) "all or none"."""
        items: list[Append | list[Append]] = []
        for _ in range(data.draw(st.integers(1, 5))):
            if data.draw(st.booleans()):
                items.append([self._in_group(data) for _ in range(data.draw(st.integers(1, 3)))])
            else:
                items.append(self._append(data))
        batch = [AppendGroup([draw.params(a) for a in item]) if isinstance(item, list)
                 else draw.params(item) for item in items]
        got = outcome(lambda: self.store.append_batch(batch, self.now))
        assert isinstance(got, list) and len(got) == len(items), got
        for i, (item, one) in enumerate(zip(items, got, strict=True)):
            if isinstance(item, list):
                self._judge_group(item, one, f"batch[{i}]")
            else:
                self._judge(item, one, f"batch[{i}]")

    def _in_group(self, data: st.DataObject) -> Append:
        """An append of a group; now and then one stored before, sent again
        with an expectation of its own or none: a duplicate that the group's
        later appends of its session are judged behind."""
        if not self.log.by_id or data.draw(st.integers(0, 3)):
            return self._append(data)
        a = self.sent[data.draw(st.sampled_from(sorted(self.log.by_id)))]
        last = self._last_seqs().get((a.app, a.user, a.session), 0)
        expected = data.draw(st.none() | st.just(last) | self._seqs(0))
        return Append(**{**a.__dict__, "expected_seq": expected})

    @rule(data=st.data(), expected=st.sampled_from([None, 0, 1]))
    def retry(self, data: st.DataObject, expected: int | None) -> None:
        """The same append again: "returns the original seq and duplicate:
        true", whatever it expects."""
        if not self.log.by_id:
            return
        event_id = data.draw(st.sampled_from(sorted(self.log.by_id)))
        a = self.sent[event_id]
        again = Append(**{**a.__dict__, "expected_seq": expected})
        got = outcome(lambda: self.store.append(draw.params(again, 1), self.now))
        assert got == AppendResult(seq=self.log.by_id[event_id], duplicate=True), got

    @rule(data=st.data(), change=st.sampled_from(
        ["content", "author", "delta", "metadata", "session", "time", "branch"]))
    def conflict(self, data: st.DataObject, change: str) -> None:
        """"The same id with different content is error -32010 event_conflict,
        and nothing is written"."""
        if not self.log.by_id:
            return
        event_id = data.draw(st.sampled_from(sorted(self.log.by_id)))
        a = Append(**self.sent[event_id].__dict__)
        if change == "content":
            a.content = [a.content]
        elif change == "author":
            a.author += "!"
        elif change == "delta":
            a.delta = {"session": {"conflict": True}}
        elif change == "metadata":
            a.metadata = {"x": "conflict"}
        elif change == "session":
            a.session += "!"
        elif change == "time":
            when = a.time_us if a.time_us is not None else self.now
            a.time_us = when + 1 if when < self.now else when - 1  # inside years 1-9999
        else:
            a.branch += "!"
        self._judge(a, outcome(lambda: self.store.append(draw.params(a), self.now)), "conflict")

    # --- sessions ------------------------------------------------------------------

    def _key(self, data: st.DataObject) -> tuple[str, str, str]:
        """A session key: mostly one the model holds, else any."""
        known = list(self.log.sessions)  # in the order made: generated ids are random
        if known and data.draw(st.integers(0, 3)):
            return data.draw(st.sampled_from(known))
        return (data.draw(draw.apps), data.draw(draw.users), data.draw(draw.sessions))

    @rule(data=st.data(), named=st.booleans(), state=draw.scope_values,
          app_state=draw.scope_values, user_state=draw.scope_values)
    def create_session(self, data: st.DataObject, named: bool, state: Any, app_state: Any,
                       user_state: Any) -> None:
        app, user, session = self._key(data)
        p = validated(SessionCreateParams(
            app=app, user=user, session=session if named else None, state=state,
            app_state=app_state, user_state=user_state,
        ))
        got = outcome(lambda: self.store.create_session(p, self.now))
        if not named:
            assert not isinstance(got, RpcError), got
            assert got.session and (app, user, got.session) not in self.log.sessions, got
            session = got.session
        key = (app, user, session)
        try:
            self.log.create(key, self.now, state, app_state, user_state)
        except Refused as want:
            same_refusal(got, want, "sessions.create")
            return
        assert not isinstance(got, RpcError), got
        assert draw.session(got) == draw.model_session(self.log.sessions[key], state or {}), got

    @rule(data=st.data())
    def delete_session(self, data: st.DataObject) -> None:
        key = self._key(data)
        assert outcome(lambda: self.store.delete_session(*key)) is None
        self.log.delete(key)

    def _state(self, key: tuple[str, str, str]) -> dict[str, Any]:
        return self.log.fold("session", key, None)

    # --- leases --------------------------------------------------------------------

    @rule(data=st.data(), window=st.sampled_from([150, 1000, 30_000]))
    def acquire(self, data: st.DataObject, window: int) -> None:
        """A fresh holder each time, as the daemon makes one per acquisition."""
        key = self._key(data)
        holder = f"host/1/{len(self.holders):08x}"
        p = validated(LeaseAcquireParams(app=key[0], user=key[1], session=key[2],
                                         stale_after_ms=window))
        got = outcome(lambda: self.store.acquire_lease(p, holder, self.now))
        held = key in self.log.leases
        try:
            self.log.acquire(key, holder, window, self.now)
        except Refused as want:
            same_refusal(got, want, "lock.acquire")
            event("lease: locked")
            return
        event(f"lease: {'stolen' if held else 'taken'}")
        assert got is None, got
        self.holders.append((key, holder))

    @rule(data=st.data(), release=st.booleans())
    def heartbeat_or_release(self, data: st.DataObject, release: bool) -> None:
        """Beats or releases by holders of now or of before (stolen,
        released): one lease's, or several leases' in one call (a log's
        leases of one interval beat together; a closing connection's are
        released together), each only where its holder still holds it."""
        if not self.holders:
            return
        picked = data.draw(st.lists(st.sampled_from(self.holders), min_size=1, max_size=3))
        if len(picked) == 1 and data.draw(st.booleans()):
            key, holder = picked[0]
            if release:
                assert self.store.release_lease(*key, holder) == self.log.release(key, holder)
            else:
                got = self.store.heartbeat_lease(*key, holder, self.now)
                assert got == self.log.heartbeat(key, holder, self.now)
            return
        leases = [LeaseKey(*key, holder) for key, holder in picked]
        if release:
            # Each row deleted once, however often the call names it.
            want = sum(self.log.release(key, holder) for key, holder in dict.fromkeys(picked))
            assert self.store.release_leases(leases) == want
        else:
            got = self.store.heartbeat_leases(leases, self.now)
            assert got == [self.log.heartbeat(key, holder, self.now) for key, holder in picked]

    # --- retention -----------------------------------------------------------------

    @rule(app=draw.apps, policy=draw.policies)
    def set_retention(self, app: str, policy: tuple[int | None, int | None, int | None]) -> None:
        """"none: remove the policy"."""
        self._set_retention(app, policy)

    def _set_retention(self, app: str, limits: tuple[int | None, int | None, int | None]) -> None:
        policy = validated(RetentionPolicy(app=app, max_age_s=limits[0], max_events=limits[1],
                                           idle_s=limits[2]))
        self.store.set_retention(policy, self.now)
        if policy.empty():
            self.log.policies.pop(app, None)
        else:
            self.log.policies[app] = Policy(*limits)
        assert [(p.app, p.max_age_s, p.max_events, p.idle_s)
                for p in self.store.retention_policies()] == [
            (a, p.max_age_s, p.max_events, p.idle_s) for a, p in sorted(self.log.policies.items())]

    @rule(data=st.data(), events=st.integers(1, 6), sessions=st.integers(1, 3),
          policy=st.none() | draw.policies, later=st.sampled_from([0, 61, 3601, 2 * 86_400]))
    def compact(self, data: st.DataObject, events: int, sessions: int,
                policy: tuple[int | None, int | None, int | None] | None, later: int) -> None:
        """Each app's policy (sometimes one set just before, for an app that
        has events), applied some time ``later`` in steps of a few rows and
        sessions (the result is "the one-transaction algorithm's"), keeping
        what a watch still needs after ``keep_after_seq``."""
        if policy is not None and self.log.events:
            app = data.draw(st.sampled_from(sorted({e.app for e in self.log.events.values()})))
            self._set_retention(app, policy)
        self.now += later * draw.SECOND
        keep = data.draw(st.none() | st.none() | st.sampled_from([0, *sorted(self.log.events)]))
        for app in sorted(self.log.policies):
            policy = self.store.retention_policies(app)[0]
            got = run_now(apply(policy, self._step(keep), Bounds(events, sessions)))
            assert got == self.log.compact(app, self.now, keep), (app, keep)
            event(f"compact: removed events {bool(got[0])}, sessions {bool(got[1])}")

    def _step(self, keep: int | None) -> Any:
        async def run(op: StepOp) -> Any:
            return op(self.store, self.now, keep)
        return run

    # --- boots ---------------------------------------------------------------------

    @rule(data=st.data(), ago=st.sampled_from([0, 1, 3600, 86_400, 10**6]),
          attempted=st.lists(draw.sessions, max_size=3))
    def boots(self, data: st.DataObject, ago: int, attempted: list[str]) -> None:
        """A boot recorded, or updated ("boot.update of an unknown id is an
        error"), then the recent ones read ("oldest first")."""
        at = self.now - ago * draw.SECOND
        if not self.boot_ids or data.draw(st.booleans()):
            boot_id = self.store.record_boot(at, attempted)
            assert boot_id not in self.log.boots
            self.log.boots[boot_id] = (at, attempted)
            self.boot_ids.append(boot_id)
        else:
            boot_id = data.draw(st.sampled_from(self.boot_ids) | st.integers(1, 10**6))
            got = outcome(lambda: self.store.update_boot(boot_id, attempted))
            if boot_id in self.log.boots:
                assert got is None, got
                self.log.boots[boot_id] = (self.log.boots[boot_id][0], attempted)
            else:
                assert isinstance(got, RpcError), got
        since = self.now - data.draw(st.sampled_from([0, 1, 3600, 86_400, 10**6])) * draw.SECOND
        got = [(to_us(b.boot_at), b.id, b.attempted)  # type: ignore[arg-type]
               for b in self.store.recent_boots(since)]
        assert got == self.log.recent_boots(since)
