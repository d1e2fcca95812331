"""What an append that is refused leaves in the session object it went
through, and in the caller's event: both as they were. Its ``temp:`` keys
reached the object's state, and left the event's delta, before the log
refused it (found comparing call sequences with ADK's in-memory service).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.genai import types
from support.adk import Service, event, run

from streamd.adk import EventConflictError

pytestmark = pytest.mark.subprocess


def said(text: str, **kw: object) -> object:
    return event(content=types.Content(role="user", parts=[types.Part(text=text)]), **kw)


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
