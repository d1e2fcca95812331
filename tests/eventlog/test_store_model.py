"""A long random sequence of store operations, every backend checked
against a model of the specification after each step.

The single-feature property tests (``test_since_reads.py``,
``test_state_as_of.py``, ``test_filters.py``, ...) each fix one feature's
answer; here appends (single, batched, grouped; retries and conflicts;
state deltas of every scope; expected seqs), session creation and
deletion, leases on an injected clock, retention in small bounded steps,
and boots interleave at random, and every read a client can make is
compared with :mod:`support.store_model`, written from
``EVENTLOG-SPEC.md`` and ``docs/wire.md``. After every step the whole log,
every app's sessions and the removals recorded are compared too, so a
write that leaves something wrong is caught at the step that made it.

SQLite runs more examples than the servers, which cost a round trip a
statement; ``STREAMD_MODEL_EXAMPLES`` multiplies every backend's examples,
for a long search by hand.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test
from support import store_model_draws as draw
from support.store_contract import Fixture
from support.store_machine import StoreMachine, outcome, same_refusal
from support.store_model import Filt, Refused

from streamd.errors import SESSION_NOT_FOUND, RpcError
from streamd.eventlog.model import (
    Entry,
    SessionGetParams,
    SessionKey,
    SessionListParams,
    SessionsGetParams,
    SinceParams,
    from_us,
    to_us,
    validated,
)
from streamd.eventlog.store import ReadShape, Shape

pytestmark = pytest.mark.slow

_SCALE = int(os.environ.get("STREAMD_MODEL_EXAMPLES", "1"))
_RUNS = {"sqlite": (80, 50), "postgres": (25, 40), "mysql": (25, 40)}
"""Examples and steps per example, by backend: 5-12 s each on 2 idle cores."""


class ModelChecked(StoreMachine):
    """Every read a client can make, compared with the model's answer."""

    @rule(data=st.data(), after_seq=st.integers(0, 3), recent=st.none() | st.integers(0, 3),
          content=st.booleans(), scoped=st.booleans(), event_time=st.booleans(),
          budget=st.none() | st.integers(200, 1500))
    def get_session(self, data: st.DataObject, after_seq: int, recent: int | None,
                    content: bool, scoped: bool, event_time: bool, budget: int | None) -> None:
        """``sessions.get``; under a small reply budget, each answer holds the
        oldest events that fit (at least one) and is continued "with
        after_seq: next_seq" until it is whole."""
        key = self._key(data)
        seqs = sorted(self.log.events)
        after = data.draw(st.sampled_from([0, *seqs])) if after_seq else 0
        after_time = data.draw(st.none() | draw.times(self.now))
        got: list[Any] = []
        start = after
        while True:
            p = validated(SessionGetParams(
                app=key[0], user=key[1], session=key[2], after_seq=start, recent=recent,
                after_time=None if after_time is None else from_us(after_time),
                content=content, scoped_state=scoped, event_time=event_time,
            ))
            one = outcome(lambda p=p: self.store.get_session(p, ReadShape(max_bytes=budget)))
            if key not in self.log.sessions:
                same_refusal(one, Refused(SESSION_NOT_FOUND), "sessions.get")
                return
            assert not isinstance(one, RpcError), one
            s = self.log.sessions[key]
            assert draw.session(one) == draw.model_session(s, self._state(key)), one
            if scoped:
                _, app_state, user_state, _ = self.log.state(key[0], key[1], None, None)
                assert (one.app_state, one.user_state) == (app_state, user_state), one
            else:
                assert (one.app_state, one.user_state) == (None, None), one
            got += [draw.entry(e) for e in one.events]
            if not one.truncated:
                assert one.next_seq is None, one
                break
            assert one.events and one.next_seq == one.events[-1].seq, one
            event("sessions.get: cut by its reply budget")
            start = one.next_seq
        want = self.log.bounded_events(key, after, after_time, recent)
        assert got == [draw.model_entry(e, content) for e in want]

    @rule(data=st.data(), recent=st.none() | st.integers(0, 3), scoped=st.booleans(),
          budget=st.none() | st.integers(200, 1500))
    def get_sessions(self, data: st.DataObject, recent: int | None, scoped: bool,
                     budget: int | None) -> None:
        """``sessions.get_many``: "in the order asked, one snapshot; keys never
        written are in missing", each session's events bounded as in
        ``sessions.get`` (its own ``after_seq``); a session cut by the shared
        budget is continued by ``sessions.get`` with ``after_seq: next_seq``."""
        keys = [self._key(data) for _ in range(data.draw(st.integers(1, 3)))]
        app = data.draw(st.sampled_from([k[0] for k in keys]))
        after = st.sampled_from([0, *sorted(self.log.events)])
        asked = [SessionKey(user=u, session=s, after_seq=data.draw(after))
                 for a, u, s in keys if a == app]
        after_time = data.draw(st.none() | draw.times(self.now))
        when = None if after_time is None else from_us(after_time)
        p = validated(SessionsGetParams(app=app, sessions=asked, recent=recent,
                                        after_time=when, scoped_state=scoped))
        got = outcome(lambda: self.store.get_sessions(p, ReadShape(max_bytes=budget)))
        assert not isinstance(got, RpcError), got
        found = [k for k in asked if (app, k.user, k.session) in self.log.sessions]
        assert [(k.user, k.session) for k in got.missing] == [
            (k.user, k.session) for k in asked if k not in found]
        assert [(s.user, s.session) for s in got.sessions] == [(k.user, k.session) for k in found]
        for one, k in zip(got.sessions, found, strict=True):
            key = (app, one.user, one.session)
            s = self.log.sessions[key]
            assert draw.session(one) == draw.model_session(s, self._state(key)), one
            events = [draw.entry(e) for e in one.events]
            if one.truncated:
                assert one.next_seq is not None, one
                rest = self.store.get_session(SessionGetParams(
                    app=app, user=one.user, session=one.session, after_seq=one.next_seq,
                    recent=recent, after_time=when))
                events += [draw.entry(e) for e in rest.events]
            want = self.log.bounded_events(key, k.after_seq, after_time, recent)
            assert events == [draw.model_entry(e) for e in want], one
            if scoped:
                _, app_state, user_state, _ = self.log.state(app, one.user, None, None)
                assert (one.app_state, one.user_state) == (app_state, user_state), one

    @rule(app=draw.apps, user=st.none() | draw.users, limit=st.integers(1, 3), data=st.data(),
          scoped=st.booleans(), event_time=st.booleans())
    def list_sessions(self, app: str, user: str | None, limit: int, data: st.DataObject,
                      scoped: bool, event_time: bool) -> None:
        """A page "in (user, session) order" after the cursor; ``next`` "null
        on the last"; scoped_state adds the app's state and each page user's."""
        after = data.draw(st.none() | st.tuples(draw.users, draw.sessions))
        p = validated(SessionListParams(
            app=app, user=user, limit=limit, scoped_state=scoped, event_time=event_time,
            after=None if after is None else SessionKey(user=after[0], session=after[1]),
        ))
        got = outcome(lambda: self.store.list_sessions_page(p))
        assert not isinstance(got, RpcError), got
        rest = [s for s in self.log.sessions_of(app, user)
                if after is None or (s.user, s.session) > after]
        page = rest[:limit]
        assert [draw.session(s) for s in got.sessions] == [
            draw.model_session(s, self._state((s.app, s.user, s.session))) for s in page]
        last = page[-1] if len(rest) > limit else None
        assert got.next == (None if last is None else SessionKey(user=last.user,
                                                                  session=last.session))
        if scoped:
            assert got.app_state == self.log.fold("app", (app, "", ""), None)
            assert got.user_states == {
                s.user: self.log.fold("user", (app, s.user, ""), None) for s in page}
        else:
            assert (got.app_state, got.user_states) == (None, None)

    # --- state ---------------------------------------------------------------------

    @rule(data=st.data(), app=draw.apps, user=st.none() | draw.users, named=st.booleans())
    def get_state(self, data: st.DataObject, app: str, user: str | None, named: bool) -> None:
        """``state.get``, now or "as of a seq" (any seq, past the newest too)."""
        session = data.draw(draw.sessions) if named and user is not None else None
        if named and user is not None and data.draw(st.booleans()):
            app, user, session = self._key(data)
        as_of = data.draw(st.none() | self._seqs(2)
                          | st.sampled_from(sorted(self.log.events) or [0]))
        got = outcome(lambda: self.store.get_state(app, user, session, as_of))
        try:
            want = self.log.state(app, user, session, as_of)
        except Refused as refused:
            same_refusal(got, refused, "state.get")
            return
        assert not isinstance(got, RpcError), got
        assert (got.seq, got.app, got.user, got.session) == want, (as_of, got, want)

    # --- reads by filter -------------------------------------------------------------

    def _from_seq(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from([0, *sorted(self.log.events)]) | self._seqs(1))

    @rule(data=st.data(), flt=draw.filters(), limit=st.sampled_from([1, 2, 3, 10_000]),
          shape=st.sampled_from(["decoded", "raw", "encoded"]),
          budget=st.none() | st.integers(200, 1500))
    def since(self, data: st.DataObject, flt: tuple[Any, Filt | None], limit: int,
              shape: Shape, budget: int | None) -> None:
        """A page of ``since`` in each shape the store reads. Under a reply
        budget a page holds the oldest entries that fit (at least one), says
        it is not caught up, and pages from ``next_seq`` on read the rest."""
        from_seq = self._from_seq(data)
        entries, next_seq, caught_up = self.log.since(from_seq, flt[1], limit)
        want = [draw.model_entry(e) for e in entries]
        page = self.store.since(SinceParams(from_seq=from_seq, filter=flt[0], limit=limit),
                                ReadShape(shape, budget))
        got = [draw.entry(draw.decoded(e)) for e in page.entries]
        if len(got) == len(want):
            assert got == want
            assert (page.next_seq, page.caught_up) == (next_seq, caught_up)
            return
        event("since: a page cut by its reply budget")
        assert budget is not None and got and got == want[:len(got)], (got, want)
        assert (page.next_seq, page.caught_up) == (got[-1][0], False)
        while not page.caught_up:
            page = self.store.since(SinceParams(from_seq=page.next_seq, filter=flt[0]),
                                    ReadShape(shape, budget))
            assert page.entries, page
            got += [draw.entry(draw.decoded(e)) for e in page.entries]
        assert got == [draw.model_entry(e) for e in self.log.matching(flt[1], from_seq)]

    @rule(data=st.data(), flt=draw.filters(), limit=st.sampled_from([1, 3, 10_000]),
          budget=st.integers(1, 1500))
    def watch_page(self, data: st.DataObject, flt: tuple[Any, Filt | None], limit: int,
                   budget: int) -> None:
        """What a watch reads: the entries of ``since``, each encoded "byte for
        byte what since with encoded=True returns", with the fields its
        filter reads."""
        from_seq = self._from_seq(data)
        got, last = self.store.since_committed(from_seq, flt[0], limit, budget)
        entries, _, caught_up = self.log.since(from_seq, flt[1], limit)
        assert got or not entries
        assert [(c.seq, c.app, c.user, c.session, c.branch, c.author) for c in got] == [
            (e.seq, e.app, e.user, e.session, e.branch, e.author) for e in entries[:len(got)]]
        assert [draw.entry(msgspec.json.decode(c.wire, type=Entry)) for c in got] == [
            draw.model_entry(e) for e in entries[:len(got)]]
        assert last == (caught_up and len(got) == len(entries)), (last, got)

    @rule(data=st.data(), limit=st.integers(1, 4))
    def index_rows(self, data: st.DataObject, limit: int) -> None:
        """The rows an index of the log (the Recall source) reads: after a
        seq, and at given seqs ("The events still stored at seqs")."""
        from_seq = self._from_seq(data)
        want = [draw.model_row(e) for e in self.log.matching(None, from_seq)[:limit]]
        assert [draw.row(r) for r in self.store.event_rows(from_seq, limit)] == want
        at = data.draw(st.lists(self._seqs(1), max_size=4))
        assert [draw.row(r) for r in self.store.event_rows_at(at)] == [
            draw.model_row(self.log.events[seq]) for seq in sorted(set(at))
            if seq in self.log.events]

    @rule(flt=draw.filters(), offset=st.integers(0, 3), limit=st.none() | st.integers(1, 3))
    def latest_seq_and_branches(self, flt: tuple[Any, Filt | None], offset: int,
                                limit: int | None) -> None:
        assert self.store.latest_seq(flt[0]) == self.log.latest_seq(flt[1])
        assert self.store.nth_newest_seq(flt[0], offset) == self.log.nth_newest_seq(flt[1],
                                                                                     offset)
        assert self.store.branches(flt[0], limit) == self.log.branches(flt[1], limit)

    @rule(app=st.none() | draw.apps, user=st.none() | draw.users)
    def list_leases(self, app: str | None, user: str | None) -> None:
        got = [(le.app, le.user, le.session, le.holder, to_us(le.acquired_at),
                to_us(le.heartbeat_at), le.stale_after_ms)
               for le in self.store.list_leases(app, user)]  # type: ignore[arg-type]
        assert got == [
            (*key, le.holder, le.acquired_us, le.heartbeat_us, le.stale_after_ms)
            for key, le in sorted(self.log.leases.items())
            if (app is None or key[0] == app) and (user is None or key[1] == user)
        ]
        if app is not None:
            assert self.store.leased_sessions(app, self.now) == sum(
                1 for key in self.log.leases if key[0] == app and self.log.live(key, self.now))

    # --- after every step ------------------------------------------------------------

    @invariant()
    def the_log_is_the_models(self) -> None:
        """Every event, every session, each app's state, the newest seq and
        the removals."""
        newest = self.store.newest_seq()
        assert newest >= self.log.newest, (newest, self.log.newest)
        self.log.newest = newest  # a refused append may use a seq up (no gaplessness)
        got = self.store.since(SinceParams(from_seq=0, limit=10_000))
        assert [draw.entry(e) for e in got.entries] == [
            draw.model_entry(e) for _, e in sorted(self.log.events.items())]
        for app in sorted(set(draw.APPS)):
            assert [draw.session(s) for s in self.store.list_sessions(app, None)] == [
                draw.model_session(s, self._state((s.app, s.user, s.session)))
                for s in self.log.sessions_of(app, None)]
            state = self.store.get_state(app, None, None, None)
            assert (state.seq, state.app) == self.log.state(app, None, None, None)[:2]
        # "Retention and session deletes record each removed event's seq",
        # in marks that only grow (docs/eventlog-source.md).
        removals = self.store.removed_after(self.mark, 10_000)
        marks = [m for m, _ in removals]
        assert marks == sorted(set(marks)) and all(m > self.mark for m in marks), removals
        assert sorted(s for _, s in removals) == sorted(self.log.removed), removals
        self.log.removed.clear()
        self.mark = marks[-1] if marks else self.mark


def test_a_random_sequence_of_store_operations_reads_back_as_the_spec_says(
    fx: Fixture, request: pytest.FixtureRequest
) -> None:
    backend = request.node.callspec.params["fx"]
    examples, steps = _RUNS[backend]
    run_state_machine_as_test(
        lambda: ModelChecked(fx, backend),
        settings=settings(
            max_examples=examples * _SCALE, stateful_step_count=steps, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
