"""Where ``StreamdSessionService`` failed ADK's shared session-service contract
(ADK's ``tests/unittests/sessions/test_session_service.py``, run by
``adk/test_contract.py``) and around it, each stated here in our own words:

* a session's ``last_update_time`` is its last event's timestamp, stored, so a
  session read back equals the one ``append_event`` returned, and it orders
  ``list_sessions``;
* session ids are stripped of surrounding whitespace on create, read and
  delete, and a blank one is none (a generated id), as ADK's in-memory service;
* with write-behind, every read and every create sees every append queued
  before it, and a copy without our marker is checked after its own appends;
* a reused event id with other content raises :class:`EventConflictError`; the
  stale-session error says the session was modified in storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from support.adk import Service, event, run, run_with_client

from streamd.adk import EventConflictError, StreamdSessionService
from streamd.adk.clients import Client

pytestmark = pytest.mark.subprocess

MODES = pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])


# --- last_update_time -------------------------------------------------------------


@MODES
def test_a_session_read_back_equals_what_append_returned_its_time_the_events(
    tmp_path: Path, write_behind: bool
) -> None:
    async def body(svc: Service, client: Client) -> None:
        session = await svc.create_session(app_name="app", user_id="u")
        assert session == await svc.get_session(app_name="app", user_id="u", session_id=session.id)
        # A timestamp in the past, finer than the microseconds the log keeps.
        await svc.append_event(session, event(ts=1_700_000_000.1234567))
        assert session.last_update_time == pytest.approx(1_700_000_000.1234567, abs=1e-6)
        got = await svc.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got == session
        # A new service (no cache, its own reads) reads the same time.
        fresh = StreamdSessionService(client)
        again = await fresh.get_session(app_name="app", user_id="u", session_id=session.id)
        assert again is not None and again.last_update_time == session.last_update_time

    run_with_client(tmp_path, body, write_behind=write_behind)


def test_list_sessions_is_ordered_by_the_last_events_timestamp(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        made = {}
        for sid in ("a", "b", "c"):
            made[sid] = await svc.create_session(app_name="app", user_id="u", session_id=sid)
        # a: an event stamped after everything; c: one stamped long before it was
        # written (an imported turn), so c's update time is the oldest.
        await svc.append_event(made["a"], event(ts=made["c"].last_update_time + 60))
        await svc.append_event(made["c"], event(ts=made["a"].last_update_time - 3600))
        listed = await svc.list_sessions(app_name="app", user_id="u")
        assert [s.id for s in listed.sessions] == ["c", "b", "a"]
        assert listed.sessions[0].last_update_time == pytest.approx(
            made["a"].last_update_time - 3600, abs=1e-6
        )

    run(tmp_path, body)


# --- session ids ------------------------------------------------------------------


def test_padded_ids_reach_the_stripped_session_and_a_blank_id_is_generated(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        created = await svc.create_session(
            app_name="app", user_id="u", session_id="order-42\n", state={"cart": "book"}
        )
        assert created.id == "order-42"
        got = await svc.get_session(app_name="app", user_id="u", session_id=" order-42\t")
        assert got is not None and got.id == "order-42" and got.state == {"cart": "book"}
        with pytest.raises(AlreadyExistsError):
            await svc.create_session(app_name="app", user_id="u", session_id="  order-42  ")
        await svc.delete_session(app_name="app", user_id="u", session_id="order-42\n")
        assert await svc.get_session(app_name="app", user_id="u", session_id="order-42") is None
        blank = await svc.create_session(app_name="app", user_id="u", session_id="   ")
        assert blank.id.strip() == blank.id and blank.id
        assert await svc.get_session(app_name="app", user_id="u", session_id="   ") is None

    run(tmp_path, body)


def test_a_session_stored_under_a_padded_id_before_is_still_reached_by_it(
    tmp_path: Path,
) -> None:
    async def body(svc: Service, client: Client) -> None:
        # As a streamd that kept ids verbatim stored it (straight through the log).
        await client.create_session("app", "u", " old ", {"k": "v"})
        got = await svc.get_session(app_name="app", user_id="u", session_id=" old ")
        assert got is not None and got.id == " old " and got.state == {"k": "v"}
        await svc.delete_session(app_name="app", user_id="u", session_id=" old ")
        assert await svc.get_session(app_name="app", user_id="u", session_id=" old ") is None

    run_with_client(tmp_path, body)


# --- write-behind ordering --------------------------------------------------------


class _Recording:
    """The service's client, noting when each append batch and each creation
    is sent and answered: what a create waits for is an order, not a speed."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.log: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def append_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append("append sent")
        got = await self._client.append_batch(*args, **kwargs)
        self.log.append("append stored")
        return got

    async def create_session(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append("create sent")
        return await self._client.create_session(*args, **kwargs)


def test_write_behind_a_create_waits_for_the_appends_queued_before_it(tmp_path: Path) -> None:
    async def body(svc: Service, client: Client) -> None:
        recording = _Recording(client)
        svc = StreamdSessionService(recording, write_behind=True)  # type: ignore[arg-type]
        first = await svc.create_session(app_name="app", user_id="u", session_id="first")
        for i in range(3):
            recording.log.clear()
            await svc.append_event(first, event(delta={"app:n": i, "user:n": i}))
            other = await svc.create_session(app_name="app", user_id="u", session_id=f"s{i}")
            assert recording.log == ["append sent", "append stored", "create sent"]
            assert (other.state.get("app:n"), other.state.get("user:n")) == (i, i)
        await svc.flush()

    run_with_client(tmp_path, body)


def test_write_behind_a_copy_without_a_marker_is_checked_after_its_own_appends(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        session = await svc.create_session(app_name="app", user_id="u")
        for i in range(10):
            await svc.append_event(session, event(delta={"n": i}))
            session._storage_update_marker = None  # as a caller that copied it field by field
        await svc.flush()
        got = await svc.get_session(app_name="app", user_id="u", session_id=session.id)
        assert [e.id for e in got.events] == [e.id for e in session.events]
        assert got.state == {"n": 9}

    run(tmp_path, body, write_behind=True)


# --- refusals ---------------------------------------------------------------------


@MODES
def test_a_reused_event_id_with_other_content_raises_event_conflict_and_writes_nothing(
    tmp_path: Path, write_behind: bool
) -> None:
    async def body(svc: Service) -> None:
        session = await svc.create_session(app_name="app", user_id="u")
        await svc.append_event(session, event(id="e-1", author="user"))
        await svc.flush()
        copy = await svc.get_session(app_name="app", user_id="u", session_id=session.id)
        other = await svc.create_session(app_name="app", user_id="u")
        with pytest.raises(EventConflictError) as info:
            await svc.append_event(other, event(id="e-1", author="agent", delta={"x": 1}))
            await svc.flush()  # write-behind: the refusal is raised here
        assert isinstance(info.value, ValueError)
        assert info.value.event_id == "e-1" and info.value.seq is not None
        assert "e-1" in str(info.value)
        stored = await svc.get_session(app_name="app", user_id="u", session_id=other.id)
        assert stored.events == [] and stored.state == {}
        assert await svc.get_session(app_name="app", user_id="u", session_id=session.id) == copy

    run(tmp_path, body, write_behind=write_behind)


@MODES
def test_an_event_appended_to_a_second_session_is_refused_saying_ids_are_the_logs(
    tmp_path: Path, write_behind: bool
) -> None:
    # A history copied into a new session under the same ids (ADK's database
    # services take it: their events are keyed by session): refused, and the
    # message said "other content" of an event whose content was the same.
    async def body(svc: Service) -> None:
        first = await svc.create_session(app_name="app", user_id="u")
        copied = event(id="e-1", author="user")
        await svc.append_event(first, copied)
        await svc.flush()
        second = await svc.create_session(app_name="app", user_id="u")
        with pytest.raises(EventConflictError) as info:
            await svc.append_event(second, copied.model_copy())
            await svc.flush()  # write-behind: the refusal is raised here
        assert "in another session" in str(info.value)
        assert "an id of its own" in str(info.value)
        stored = await svc.get_session(app_name="app", user_id="u", session_id=second.id)
        assert stored.events == []

    run(tmp_path, body, write_behind=write_behind)


@MODES
def test_the_stale_session_error_says_the_session_was_modified_in_storage(
    tmp_path: Path, write_behind: bool
) -> None:
    async def body(svc: Service) -> None:
        session = await svc.create_session(app_name="app", user_id="u")
        copy = await svc.get_session(app_name="app", user_id="u", session_id=session.id)
        await svc.append_event(session, event())
        await svc.flush()
        with pytest.raises(StaleSessionError, match="modified in storage since it was loaded"):
            await svc.append_event(copy, event())
            await svc.flush()
        # A copy without our marker, checked by its last event, says it too.
        hand = await svc.get_session(app_name="app", user_id="u", session_id=session.id)
        hand.events = []
        hand._storage_update_marker = None
        with pytest.raises(StaleSessionError, match="modified in storage since it was loaded"):
            await svc.append_event(hand, event())
            await svc.flush()

    run(tmp_path, body, write_behind=write_behind)
