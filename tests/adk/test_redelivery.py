"""What an append that is refused, or that the log answers as stored already,
leaves in the session object it went through (found by the differential test
against ADK's in-memory service, test_against_in_memory.py):

* a refused append leaves the session object and the caller's event as they
  were: its ``temp:`` keys reached the object's state, and left the event's
  delta, before the log refused it;
* an event stored before, appended again through an object that lacks it, is
  taken into the object only when it is the session's next event after the
  object's own (a retry of an append whose answer was lost); anywhere else it
  was put at the object's end: a stale object passed for current, its next
  append stored on a view that missed events, and an object read with fewer
  events got an old event at its end, and the state that event set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.adk.sessions.base_session_service import GetSessionConfig
from support.adk import Service, run, said

from streamd.adk import EventConflictError

pytestmark = pytest.mark.subprocess


async def _texts(svc: Service, session_id: str) -> list[str]:
    got = await svc.get_session(app_name="app", user_id="u", session_id=session_id)
    assert got is not None
    return [e.content.parts[0].text for e in got.events]  # type: ignore[union-attr,index]


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_a_refused_append_leaves_the_session_object_and_the_event_as_they_were(
    tmp_path: Path, write_behind: bool
) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        kept = said("kept", id="e-1")
        await svc.append_event(s, kept)
        await svc.flush()
        stale = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert stale is not None
        # Another id, other content: refused by the log, or (write-behind) by the
        # copy that holds it, at once.
        clash = said("clash", id="e-1", delta={"n": 1, "temp:scratch": "t"})
        with pytest.raises(EventConflictError):
            await svc.append_event(s, clash)
        assert s.state == {} and [e.id for e in s.events] == ["e-1"]
        assert clash.actions.state_delta == {"n": 1, "temp:scratch": "t"}  # type: ignore[attr-defined]
        if write_behind:
            return
        await svc.append_event(s, said("moves on"))
        late = said("late", delta={"temp:scratch": "t"})
        with pytest.raises(StaleSessionError):
            await svc.append_event(stale, late)
        assert stale.state == {} and [e.id for e in stale.events] == ["e-1"]
        assert late.actions.state_delta == {"temp:scratch": "t"}  # type: ignore[attr-defined]
        # The same event, once the append is accepted, is ADK's base class's.
        fresh = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert fresh is not None
        await svc.append_event(fresh, late)
        assert fresh.state == {"temp:scratch": "t"}
        assert late.actions.state_delta == {}  # type: ignore[attr-defined]

    run(tmp_path, body, write_behind=write_behind)


async def _behind_by_two(svc: Service) -> tuple[Any, Any]:
    """A copy of a session read before another copy appended "x" then "e"
    to it, and the event "e"."""
    ahead = await svc.create_session(app_name="app", user_id="u", session_id="s")
    behind = await svc.get_session(app_name="app", user_id="u", session_id="s")
    assert behind is not None
    await svc.append_event(ahead, said("x"))
    e = said("e")
    await svc.append_event(ahead, e)
    return behind, e


def test_an_event_appended_again_through_a_stale_copy_leaves_it_stale(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        behind, e = await _behind_by_two(svc)
        # Stored already, not right after the copy's seq: the copy is left as it is.
        assert await svc.append_event(behind, e.model_copy(deep=True)) is not None
        assert behind.events == []
        with pytest.raises(StaleSessionError):  # it was taken for current, and stored
            await svc.append_event(behind, said("computed without x"))
        assert await _texts(svc, "s") == ["x", "e"]

    run(tmp_path, body)


def test_an_event_appended_again_through_a_windowed_copy_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        first = said("first", delta={"n": 1})
        await svc.append_event(s, first)
        await svc.append_event(s, said("second", delta={"n": 2}))
        window = await svc.get_session(app_name="app", user_id="u", session_id="s",
                                       config=GetSessionConfig(num_recent_events=1))
        assert window is not None and window.state == {"n": 2}
        await svc.append_event(window, first.model_copy(deep=True))
        # Not put at its end, and its delta not applied over the newer one.
        assert [e.content.parts[0].text for e in window.events] == ["second"]  # type: ignore[union-attr,index]
        assert window.state == {"n": 2}
        await svc.append_event(window, said("third"))  # still current
        assert await _texts(svc, "s") == ["first", "second", "third"]

    run(tmp_path, body)


@pytest.mark.parametrize("together", [False, True], ids=["flushed-between", "one-batch"])
def test_write_behind_a_copy_whose_event_was_stored_elsewhere_is_refused_as_stale(
    tmp_path: Path, together: bool
) -> None:
    async def body(svc: Service) -> None:
        behind, e = await _behind_by_two(svc)
        await svc.flush()
        await svc.append_event(behind, e.model_copy(deep=True))
        if together:
            # Queued with the event stored already, so that both go in one
            # batch: one the copy computed without "x", which the batch's
            # refusal keeps out of the log.
            await svc.append_event(behind, said("computed without x"))
        with pytest.raises(StaleSessionError):
            await svc.flush()
        if not together:
            with pytest.raises(StaleSessionError):  # it was taken for current, and stored
                await svc.append_event(behind, said("computed without x"))
            await svc.flush()
        assert await _texts(svc, "s") == ["x", "e"]

    run(tmp_path, body, write_behind=True)
