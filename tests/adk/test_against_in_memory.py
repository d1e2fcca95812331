"""``StreamdSessionService`` against ADK's own ``InMemorySessionService``, call for
call, on long random sequences of calls (a Hypothesis state machine).

Each step makes one call on both services with equal arguments (each its own
copies: ADK's keeps the objects it is given), on two apps and two users:
``create_session`` (given, padded, blank and generated ids, state of every
scope), ``get_session`` (whole or windowed), ``list_sessions`` (of a user, of
all), ``delete_session``, ``get_user_state``, ``append_event`` through any
session object either handed out (new events with content and deltas of every
scope, ``temp:`` too, partial ones, retries, reused ids; through current, stale
and deleted sessions' objects) and ``flush``. Their answers must agree: ids,
state (type for type), every field of every event, ``last_update_time``, the
order of a listing, the type of an exception, the session objects appended to.
ADK's clock and id generator (``google.adk.platform``) give a created session
the time (checked to fall within the call) and id ours gave it.

Where the answers may differ, the difference is modelled explicitly and cites
where it is documented: docs/agent-builders.md for ours, ADK's source
(google/adk/sessions/in_memory_session_service.py) for a quirk of the in-memory
service. Run in this process (``database=``) and, with fewer examples, through a
``streamd serve --socket`` daemon; each durable and write-behind.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.platform import time as adk_time  # noqa: E402
from google.adk.platform import uuid as adk_uuid  # noqa: E402
from google.adk.sessions import InMemorySessionService, Session  # noqa: E402
from google.genai import types  # noqa: E402
from hypothesis import HealthCheck, event, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test  # noqa: E402
from support.adk_logs import DaemonLog, FileLog, Log, daemon_log  # noqa: E402
from support.adk_oracle import (  # noqa: E402
    APPS,
    GIVEN_IDS,
    USERS,
    Copy,
    LogModel,
    Outcome,
    Stored,
    Unreported,
    documented_window,
    kept_time,
    listed_order,
    make_config,
    note_fate,
    states,
    typed,
    windows_agree,
    without_temp,
)

from streamd.adk import EventConflictError  # noqa: E402

_T = TypeVar("_T")
STEP_TIMEOUT = 30.0
EVENT_EPOCH_US = 2_000_000_000 * 1_000_000

# Ids a step asks for: the given ones, padded (ADK strips them), blank (none).
ASKED_IDS = (*GIVEN_IDS, " s1", "s2\t", "nope")
CREATED_IDS = (None, "", "  ", *GIVEN_IDS, " s1 ", "\ns2")


class Differential(RuleBasedStateMachine):
    log: ClassVar[Log]
    write_behind: ClassVar[bool]

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.prefix = self.log.prefix()
        self.ours = self.run(self.log.service(self.write_behind))
        self.theirs = InMemorySessionService()
        self.model = LogModel()
        self.copies: list[Copy] = []
        self.ids = list(GIVEN_IDS)  # session ids to ask for, generated ones added
        self.sent: list[Event] = []  # stored events, as stored, to re-deliver
        # Events' times: from a fixed instant (after every creation), stepped
        # by the examples; the real clock would make each replay draw anew.
        self.clock_us = EVENT_EPOCH_US
        self.event_ids = itertools.count()
        self.unreported = Unreported()

    # -- running --

    def run(self, call: Awaitable[_T]) -> _T:
        async def bounded() -> _T:
            async with asyncio.timeout(STEP_TIMEOUT):
                return await call

        return self.runner.run(bounded())

    def both(
        self, ours: Callable[[], Awaitable[Any]], theirs: Callable[[], Awaitable[Any]] | None,
    ) -> tuple[Outcome, Outcome | None]:
        """Our call, then ADK's (None: not made), each outcome caught."""

        async def made(call: Callable[[], Awaitable[Any]]) -> Outcome:
            try:
                return Outcome(value=await call())
            except Exception as exc:
                return Outcome(error=exc)

        got = self.run(made(ours))
        return got, (None if theirs is None else self.run(made(theirs)))

    def app(self, name: str) -> str:
        return self.prefix + name if name else name

    def heard_all(self) -> None:
        """A call that drains the queues: every refusal is heard."""
        for c in self.copies:
            c.heard = c.heard or c.refused is not None

    # -- comparing --

    def same_session(self, ours: Session, theirs: Session, events: list[Event] | None = None,
                     ) -> None:
        assert (ours.app_name, ours.user_id, ours.id) == (
            theirs.app_name, theirs.user_id, theirs.id)
        assert typed(ours.state) == typed(theirs.state)
        want = theirs.events if events is None else events
        assert [typed(e.model_dump()) for e in ours.events] == [
            typed(e.model_dump()) for e in want]
        assert ours.last_update_time == kept_time(theirs.last_update_time)

    def same_copy(self, c: Copy) -> None:
        if c.refused is None:  # a refused copy is stale for good: its view is its own
            self.same_session(c.ours, c.theirs)

    def same_listing(self, app: str, user: str | None) -> tuple[list[Session], list[Session]]:
        """Both services' listing, compared; ours, and ADK's in our order."""
        ours, theirs = self.both(
            lambda: self.ours.list_sessions(app_name=app, user_id=user),
            lambda: self.theirs.list_sessions(app_name=app, user_id=user))
        assert theirs is not None and ours.error is None and theirs.error is None
        if app and user != "":
            self.heard_all()
        mine, adks = ours.value.sessions, theirs.value.sessions
        assert [(s.user_id, s.id) for s in mine] == listed_order(adks)
        by_key = {(s.user_id, s.id): s for s in adks}
        for s in mine:
            self.same_session(s, by_key[(s.user_id, s.id)])
        return mine, [by_key[(s.user_id, s.id)] for s in mine]

    # -- sessions --

    @rule(app=st.sampled_from(APPS), user=st.sampled_from(USERS),
          session_id=st.sampled_from(CREATED_IDS), state=states, empty=st.integers(0, 9))
    def create_session(
        self, app: str, user: str, session_id: str | None, state: dict[str, Any], empty: int
    ) -> None:
        if empty < 2:
            # Documented (docs/agent-builders.md): "An empty app_name or user_id is
            # refused by create_session and append_event with a ValueError saying
            # which"; ADK's services accept empty names, so ADK's is not asked.
            app, user = (app, "") if empty else ("", user)
            ours, _ = self.both(lambda: self.ours.create_session(
                app_name=app, user_id=user, state=copy.deepcopy(state)), None)
            assert isinstance(ours.error, ValueError), ours.error
            assert "must not be empty" in str(ours.error)
            return
        app = self.app(app)
        before = time.time()
        ours, _ = self.both(lambda: self.ours.create_session(
            app_name=app, user_id=user, state=copy.deepcopy(state), session_id=session_id), None)
        after = time.time()
        self.heard_all()
        made: Session | None = ours.value

        async def theirs_create() -> Session:
            # ADK's clock and ids as ours gave them: both then list alike.
            if made is not None:
                adk_time.set_time_provider(lambda: made.last_update_time)
                adk_uuid.set_id_provider(lambda: made.id)
            return await self.theirs.create_session(
                app_name=app, user_id=user, state=copy.deepcopy(state), session_id=session_id)

        _, theirs = self.both(lambda: asyncio.sleep(0), theirs_create)
        assert theirs is not None
        assert ours.kind() is theirs.kind(), (ours.error, theirs.error)
        if made is None:
            return
        assert made.id.strip() and made.id == made.id.strip()
        assert int(before * 1e6) / 1e6 <= made.last_update_time <= after
        self.same_session(made, theirs.value)
        key = (app, user, made.id)
        assert key not in self.model.stored
        self.model.stored[key] = Stored()
        self.copies.append(Copy(made, theirs.value, key, 0))
        if made.id not in self.ids:
            self.ids.append(made.id)

    def _target(self, data: st.DataObject) -> tuple[str, str, str]:
        """Whose session a read or a delete names: mostly one stored (its id as
        given, or padded), else any app, user and id (empty names too)."""
        stored = list(self.model.stored)
        if stored and data.draw(st.integers(0, 3), label="a_stored_session") > 0:
            app, user, session_id = data.draw(st.sampled_from(stored), label="session")
            pad = data.draw(st.sampled_from(("", " ", "\t\n")), label="padding")
            return app, user, pad + session_id + pad
        app = self.app(data.draw(st.sampled_from(("", *APPS)), label="app"))
        user = data.draw(st.sampled_from(("", *USERS)), label="user")
        return app, user, data.draw(st.sampled_from([*self.ids, *ASKED_IDS, "  "]), label="id")

    @rule(data=st.data(), recent=st.none() | st.integers(0, 4), keep=st.booleans())
    def get_session(self, data: st.DataObject, recent: int | None, keep: bool) -> None:
        app, user, session_id = self._target(data)
        after = data.draw(self._times(), label="after_timestamp")
        config = make_config(after, recent)
        ours, theirs = self.both(
            lambda: self.ours.get_session(
                app_name=app, user_id=user, session_id=session_id, config=config),
            lambda: self.theirs.get_session(
                app_name=app, user_id=user, session_id=session_id, config=config))
        _, whole = self.both(lambda: asyncio.sleep(0), lambda: self.theirs.get_session(
            app_name=app, user_id=user, session_id=session_id))
        assert theirs is not None and whole is not None
        assert ours.error is None and theirs.error is None, (ours.error, theirs.error)
        if app and user:
            self.heard_all()
        if theirs.value is None:
            assert ours.value is None
            return
        assert ours.value is not None
        event(f"get_session: found, {len(whole.value.events)} events")
        window = documented_window(whole.value.events, config)
        self.same_session(ours.value, theirs.value, window)
        agree = windows_agree(whole.value.events, config)
        event(f"get_session: window the documented one {'and' if agree else 'not'} ADK's")
        if agree:  # the model of the window is ADK's own where they must agree
            assert [e.model_dump() for e in window] == [
                e.model_dump() for e in theirs.value.events]
        if keep and agree:
            key = (app, user, ours.value.id)
            self.copies.append(Copy(ours.value, theirs.value, key, self.model.stored[key].last_seq))

    @rule(data=st.data())
    def another_copy(self, data: st.DataObject) -> None:
        """A stored session read whole again: one more object to append through,
        current until another appends."""
        if not self.model.stored:
            return
        key = data.draw(st.sampled_from(list(self.model.stored)), label="session")
        app, user, session_id = key
        ours, theirs = self.both(
            lambda: self.ours.get_session(app_name=app, user_id=user, session_id=session_id),
            lambda: self.theirs.get_session(app_name=app, user_id=user, session_id=session_id))
        assert theirs is not None and ours.value is not None and theirs.value is not None
        self.heard_all()
        self.same_session(ours.value, theirs.value)
        self.copies.append(Copy(ours.value, theirs.value, key, self.model.stored[key].last_seq))

    def _times(self) -> st.SearchStrategy[float | None]:
        """An ``after_timestamp``: none, or an event's time, a microsecond either
        side of it, or a third of one past it."""
        times = [e.timestamp for e in self.sent] or [self.clock_us / 1e6]
        return st.none() | st.builds(
            lambda t, d: t + d, st.sampled_from(times), st.sampled_from((0.0, 1e-6, -1e-6, 3e-7)))

    @rule(app=st.sampled_from(("", *APPS)), user=st.none() | st.sampled_from(("", *USERS)),
          keep=st.none() | st.integers(0, 7))
    def list_sessions(self, app: str, user: str | None, keep: int | None) -> None:
        mine, adks = self.same_listing(self.app(app), user)
        if keep is not None and mine:  # a listed session is a session object too
            # Picked in the order made (a listing's can vary by run: generated ids).
            made = list(self.model.stored)
            pairs = sorted(zip(mine, adks, strict=True),
                           key=lambda p: made.index((p[0].app_name, p[0].user_id, p[0].id)))
            s, t = pairs[keep % len(pairs)]
            key = (s.app_name, s.user_id, s.id)
            self.copies.append(Copy(s, t, key, self.model.stored[key].last_seq))

    @rule(data=st.data())
    def delete_session(self, data: st.DataObject) -> None:
        app, user, session_id = self._target(data)
        ours, theirs = self.both(
            lambda: self.ours.delete_session(app_name=app, user_id=user, session_id=session_id),
            lambda: self.theirs.delete_session(
                app_name=app, user_id=user, session_id=session_id))
        assert theirs is not None and ours.error is None and theirs.error is None
        if app and user:
            self.heard_all()
        self.model.delete((app, user, session_id.strip()))

    @rule(app=st.sampled_from(("", *APPS)), user=st.sampled_from(("", *USERS)))
    def get_user_state(self, app: str, user: str) -> None:
        app = self.app(app)
        ours, theirs = self.both(
            lambda: self.ours.get_user_state(app_name=app, user_id=user),
            lambda: self.theirs.get_user_state(app_name=app, user_id=user))
        assert theirs is not None and ours.error is None and theirs.error is None
        if app and user:
            self.heard_all()
        assert typed(ours.value) == typed(theirs.value)

    @rule()
    def flush(self) -> None:
        ours, theirs = self.both(self.ours.flush, self.theirs.flush)
        assert theirs is not None and theirs.error is None
        self.heard_all()
        self.flushed(ours)

    def flushed(self, ours: Outcome) -> None:
        if not self.write_behind:
            assert ours.error is None, ours.error
            return
        # Documented (docs/agent-builders.md): a refusal met by a queued append "is
        # raised by the copy's next append_event, or by flush".
        kinds = {i: c.refused for i, c in enumerate(self.copies) if c.refused is not None}
        if ours.error is None:
            assert self.unreported.flush_returned(), "flush returned with a refusal unraised"
        else:
            kind = type(ours.error)
            assert self.unreported.flush_raised(kind, kinds), ours.error  # type: ignore[arg-type]

    def everything_reads_alike(self) -> None:
        """Every app's listing of each user and of all, every session read whole,
        every user's state."""
        for app in APPS:
            app = self.app(app)
            for user in (None, *USERS):
                self.same_listing(app, user)
            for user in USERS:
                ours, theirs = self.both(
                    lambda: self.ours.get_user_state(app_name=app, user_id=user),  # noqa: B023
                    lambda: self.theirs.get_user_state(app_name=app, user_id=user))  # noqa: B023
                assert theirs is not None and typed(ours.value) == typed(theirs.value)
        for key in self.model.stored:
            app, user, sid = key
            ours, theirs = self.both(
                lambda: self.ours.get_session(app_name=app, user_id=user, session_id=sid),  # noqa: B023
                lambda: self.theirs.get_session(app_name=app, user_id=user, session_id=sid))  # noqa: B023
            assert theirs is not None and ours.value is not None and theirs.value is not None
            self.same_session(ours.value, theirs.value)

    # -- events --

    def _event(self, data: st.DataObject, event_id: str | None = None) -> Event:
        step = data.draw(st.sampled_from((1, 1, 1, 2, 0, -3)), label="clock_step_us")
        self.clock_us += step
        timestamp = self.clock_us / 1e6
        if data.draw(st.integers(0, 9), label="off_the_microsecond") == 0:
            timestamp += 3e-7
        text = data.draw(st.none() | st.text(max_size=12), label="text")
        delta = data.draw(states, label="state_delta")
        fields: dict[str, Any] = {
            "id": event_id or f"{self.prefix}e{next(self.event_ids)}",
            "invocation_id": data.draw(st.sampled_from(("inv-1", "inv-2")), label="invocation"),
            "author": data.draw(st.sampled_from(("user", "agent")), label="author"),
            "timestamp": timestamp,
            "actions": EventActions(state_delta=delta),
        }
        if text is not None:
            fields["content"] = types.Content(
                role="user" if fields["author"] == "user" else "model",
                parts=[types.Part(text=text)])
        if data.draw(st.integers(0, 3), label="branch") == 0:
            fields["branch"] = "root.sub"
        if data.draw(st.integers(0, 11), label="partial") == 0:
            fields["partial"] = True
        return Event(**fields)

    def _copy(self, data: st.DataObject) -> Copy | None:
        """A session object to append through: mostly one of a session stored
        now, else any (of a session deleted since, or made anew)."""
        live = [c for c in self.copies if c.key in self.model.stored and c.refused is None]
        if live and data.draw(st.integers(0, 3), label="a_live_copy") > 0:
            return data.draw(st.sampled_from(live), label="copy")
        return data.draw(st.sampled_from(self.copies), label="copy") if self.copies else None

    def _turn(self, data: st.DataObject, count: int) -> None:
        """A turn: new events through one session object."""
        c = self._copy(data)
        for _ in range(count if c is not None else 0):
            self._append(c, self._event(data))  # type: ignore[arg-type]

    # Rules are drawn alike: turns are three of them, so that sessions grow.
    @rule(data=st.data(), count=st.integers(1, 6))
    def append_events(self, data: st.DataObject, count: int) -> None:
        self._turn(data, count)

    @rule(data=st.data(), count=st.integers(1, 6))
    def append_more_events(self, data: st.DataObject, count: int) -> None:
        self._turn(data, count)

    @rule(data=st.data(), count=st.integers(1, 6))
    def append_a_turn(self, data: st.DataObject, count: int) -> None:
        self._turn(data, count)

    @rule(data=st.data())
    def append_again(self, data: st.DataObject) -> None:
        """A stored event appended again (a retry): as it was stored, through any copy."""
        c = self._copy(data)
        if c is not None and self.sent:
            self._sent_first()
            self._append(c, data.draw(st.sampled_from(self.sent), label="event"))

    @rule(data=st.data())
    def append_a_reused_id(self, data: st.DataObject) -> None:
        """A new event under the id of one stored before."""
        c = self._copy(data)
        if c is not None and self.sent:
            used = data.draw(st.sampled_from(self.sent), label="reused")
            event = self._event(data, used.id)
            if without_temp(event) != without_temp(used):  # other content
                self._sent_first()
                self._append(c, event)

    def _sent_first(self) -> None:
        """Write-behind: what is queued is sent before an id is used again.
        Documented (docs/agent-builders.md): sessions' queues are sent side by
        side, so an id queued in two sessions is stored in the one sent first."""
        if self.write_behind:
            self.flush()

    def _append(self, c: Copy, event: Event) -> None:
        mine, adks = event.model_copy(deep=True), event.model_copy(deep=True)
        index = self.copies.index(c)
        form = without_temp(event)
        append_ours = lambda: self.ours.append_event(c.ours, mine)  # noqa: E731
        append_theirs = lambda: self.theirs.append_event(c.theirs, adks)  # noqa: E731
        if event.partial:
            ours, theirs = self.both(append_ours, append_theirs)
            assert theirs is not None and ours.error is None and theirs.error is None
            assert ours.value is mine and theirs.value is adks
            self.same_copy(c)
            return
        if self.write_behind:
            self._append_behind(c, index, mine, adks, form, append_ours, append_theirs)
            return
        fate = self.model.fate(c, event, form)
        held = any(e.id == event.id for e in c.ours.events)
        note_fate(fate, event.id in self.model.registry, held)
        if fate is None or fate is SessionNotFoundError:
            ours, theirs = self.both(append_ours, append_theirs)
            assert theirs is not None
            assert ours.kind() is theirs.kind(), (ours.error, theirs.error)
        else:
            # Documented (docs/agent-builders.md, "Where it differs"): a reused event
            # id with other content, or in another session, raises EventConflictError;
            # an append through a session object the session moved on from raises
            # StaleSessionError ("A session object is the log's view of the session,
            # checked at each durable append"). ADK's in-memory service stores both,
            # so it is not asked; nothing may change, the caller's event included.
            ours, _ = self.both(append_ours, None)
            assert isinstance(ours.error, fate), ours.error
            assert without_temp(mine) == form and mine == event
        if ours.error is None:
            assert ours.value is mine
            if event.id in self.model.registry:
                self._stored_again(c, adks, held)
            else:
                self._stored(c, form)
        self.same_copy(c)

    def _stored(self, c: Copy, form: dict[str, Any]) -> None:
        self.model.store(c, form)
        self.sent.append(Event.model_validate(form))

    def _stored_again(self, c: Copy, adks: Event, held: bool) -> None:
        """An event stored before, appended again through ``c``: ADK's service
        answers it without a change to the copy (its ``append_event`` returns an
        event equal to one it holds). Documented (docs/agent-builders.md, "A stored
        event appended again"): ours does the same, unless the copy lacks it and it
        is the session's next event after the copy's own (an append whose answer
        was lost, made again); then the copy takes it, as the session has it."""
        seq = self.model.registry[adks.id][2]
        if held or self.model.next_after(c) != seq:
            event("append: stored before, the copy left as it was")
            return
        event("append: stored before, the copy took it")
        c.seq = seq
        c.theirs.events.append(adks)
        c.theirs.state.update(adks.actions.state_delta)
        c.theirs.last_update_time = adks.timestamp

    def _append_behind(
        self, c: Copy, index: int, mine: Event, adks: Event, form: dict[str, Any],
        append_ours: Callable[[], Awaitable[Any]], append_theirs: Callable[[], Awaitable[Any]],
    ) -> None:
        if c.refused is not None:
            # Documented (docs/agent-builders.md): a refusal "drops what that session
            # copy queued after the refused event and is raised by the copy's next
            # append_event"; until the service has heard it (its send ends in the
            # background), an append is queued, to be dropped.
            ours, _ = self.both(append_ours, None)
            from_copy = isinstance(ours.error, EventConflictError) and ours.error.seq is None
            if isinstance(ours.error, c.refused) and not from_copy:
                self.unreported.raised_by_append(index)
            else:  # queued, or answered by the copy (below) as the refusal is not heard
                assert not c.heard, f"a refused copy appended again: {ours.error!r}"
            return
        held = next((e for e in c.ours.events if e.id == mine.id), None)
        if held is not None:
            # Documented (docs/agent-builders.md, write-behind): an event the copy
            # holds is answered by the copy at once, without asking the log: the
            # same content returns (ADK's answer too while the session holds it;
            # once deleted, ADK's raises SessionNotFoundError), other content
            # raises EventConflictError (ADK's would store both).
            in_storage = self.model.registry.get(mine.id, (None, None, 0))[:2] == (c.key, form)
            if without_temp(held) == form:
                ours, theirs = self.both(append_ours, append_theirs if in_storage else None)
                assert ours.error is None and ours.value is mine, ours.error
                assert theirs is None or theirs.error is None, theirs.error
            else:
                ours, _ = self.both(append_ours, None)
                assert isinstance(ours.error, EventConflictError), ours.error
                assert without_temp(mine) == form
            self.same_copy(c)
            return
        fate = self.model.fate(c, mine, form)
        note_fate(fate, mine.id in self.model.registry, False)
        again = fate is None and mine.id in self.model.registry
        if again and self.model.next_after(c) != self.model.registry[mine.id][2]:
            # Documented (docs/agent-builders.md, "A stored event appended again"):
            # queued, the copy took it; stored elsewhere than right after the
            # copy's seq, the copy is refused as stale.
            fate = StaleSessionError
        ours, _ = self.both(append_ours, None)
        assert ours.error is None and ours.value is mine, ours.error
        if fate is None:
            _, theirs = self.both(lambda: asyncio.sleep(0), append_theirs)
            assert theirs is not None and theirs.error is None, theirs.error
            if again:
                self._stored_again(c, adks, False)
            else:
                self._stored(c, form)
            self.same_copy(c)
        else:
            # Queued, and refused at its send (documented as above): ADK's service is
            # not asked, and the copy is stale for good ("reload it").
            c.refused, c.heard = fate, False
            self.unreported.add(index)
            event(f"write-behind: refused at its send, {fate.__name__}")
        if again:
            # Sent alone, so that what the copy queues next is a batch of its own:
            # documented, events queued behind it in the same batch are stored
            # before the refusal comes ("A stored event appended again").
            self.flush()

    def teardown(self) -> None:
        try:
            for _ in range(len(self.copies) + 1):  # each flush raises one refusal
                ours, _ = self.both(self.ours.flush, None)
                self.heard_all()
                self.flushed(ours)
                if ours.error is None:
                    break
            self.everything_reads_alike()
            self.run(self.log.release(self.ours))
        finally:
            self.runner.close()


def _check(log: Log, write_behind: bool, examples: int, steps: int) -> None:
    machine = type("Machine", (Differential,), {"log": log, "write_behind": write_behind})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_in_process_every_sequence_of_calls_answers_as_adks_in_memory_service(
    tmp_path: Path, write_behind: bool
) -> None:
    _check(FileLog(tmp_path), write_behind, examples=100, steps=40)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonLog]:
    with daemon_log() as log:
        yield log


@pytest.mark.subprocess
@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_through_a_daemon_every_sequence_of_calls_answers_as_adks_in_memory_service(
    daemon: DaemonLog, write_behind: bool
) -> None:
    _check(daemon, write_behind, examples=40, steps=40)
